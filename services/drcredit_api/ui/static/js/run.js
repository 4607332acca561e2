/* The run page: per step, the judge's cost, the latency, the credit and its failures as
   charts; the judge's levels per step and their drift from the run's first three steps;
   C(b) and U(b) of the steps picked; a table of the steps; the sensitivity table of a
   batch of the run; the run's judge audits (audits.js). */
(function () {
  "use strict";
  const D = window.DrCredit;
  const { el, fmt, pct, num, enc, count, usd } = D;
  const C = () => D.charts;
  const TERMS = ["step", "run_groups", "groups_done", "trajectories", "process_calls", "outcome_calls", "judgments_failed", "unscorable",
    "latency", "mean_credit", "zero_credit", "advantage_bins", "process_advantage", "budget", "cumulative", "rate",
    "work_steps", "work_trajectories", "process_tasks", "outcome_tasks", "work_latency", "prompt_tokens", "cached_tokens",
    "completion_tokens", "tokens_per_trajectory", "cost_per_trajectory", "run_cost", "cost", "cached_share", "reused",
    "w1", "rmse", "process_sign", "fused_sign", "bound", "level_judgments", "visit_levels_share", "report_scores_share",
    "drift", "drift_flagged", "drift_threshold"];

  async function runPage() {
    const name = document.body.dataset.run;
    const run = await D.load("/v1/runs/" + enc(name));
    const steps = run.steps;
    const trajectories = steps.reduce((a, s) => a + s.trajectories, 0);
    const groups = steps.reduce((a, s) => a + s.groups, 0);
    document.getElementById("run-summary").replaceChildren(num("step", D.plural(steps.length, "step")), " · ",
      num("run_groups", D.plural(groups, "group")), " · ",
      num("trajectories", D.plural(trajectories, "trajectory", "trajectories") + " scored"));
    workload(run.workload);
    charts(steps);
    drift(run);
    curves(steps);
    table(steps);
    D.glossary([...new Set(TERMS.concat(D.AUDIT_TERMS))]);
    await sensitivity(steps);
    await D.audits(name);
  }

  /* The run's scoring workload row (absent from documents made before it existed). */
  function workload(w) {
    const tbody = document.querySelector("#workload tbody");
    if (!w) {
      tbody.append(el("tr", {}, [el("td", { colspan: 10, text: "not in this document" })]));
      return;
    }
    const u = w.usage_per_trajectory || {};
    tbody.append(el("tr", {}, [
      cell("work_steps", w.steps), cell("work_trajectories", w.trajectories),
      cell("process_tasks", fmt(w.process_judge_tasks_per_trajectory)),
      cell("outcome_tasks", fmt(w.outcome_judge_tasks_per_trajectory)),
      cell("work_latency", fmt(w.scoring_latency_per_trajectory_s)), cell("prompt_tokens", count(u.prompt_tokens)),
      cell("cached_tokens", count(u.cached_prompt_tokens)), cell("completion_tokens", count(u.completion_tokens)),
      cell("cost_per_trajectory", usd(u.cost_usd)), cell("run_cost", usd(w.usage.cost_usd)),
    ]));
  }

  function charts(steps) {
    const { x, axis } = C().stepAxis(steps);
    // Markers only while they stay apart; a long run draws lines.
    const mode = steps.length > 50 ? "lines" : "lines+markers";
    const line = (y, label, extra) => Object.assign({ x: x, y: y, name: label, mode: mode }, extra || {});
    C().plot("chart-calls", [
      line(steps.map((s) => s.judge_calls.process_per_trajectory), "process"),
      line(steps.map((s) => s.judge_calls.outcome_per_trajectory), "outcome"),
    ], { xaxis: axis, yaxis: C().axis("calls / trajectory", { rangemode: "tozero" }) });
    const per = (k) => steps.map((s) => (s.usage_per_trajectory ? s.usage_per_trajectory[k] : null));
    const cost = per("cost_usd");
    const tokens = [line(per("prompt_tokens"), "prompt"), line(per("cached_prompt_tokens"), "cached prompt"),
      line(per("completion_tokens"), "completion")];
    const priced = cost.some((c) => c !== null);
    if (priced) tokens.push(line(cost, "cost (USD)", { yaxis: "y2", line: { dash: "dot" } }));
    C().plot("chart-tokens", tokens, Object.assign({ xaxis: axis, yaxis: C().axis("tokens / trajectory", { rangemode: "tozero" }) },
      priced ? { yaxis2: C().axis("USD / trajectory", { overlaying: "y", side: "right", rangemode: "tozero", showgrid: false,
        tickprefix: "$", exponentformat: "none" }) } : {}));
    const lat = (k) => steps.map((s) => (s.latency_per_trajectory_s ? s.latency_per_trajectory_s[k] : null));
    C().plot("chart-latency", [line(lat("p50"), "p50"), line(lat("p90"), "p90"), line(lat("max"), "max")],
      { xaxis: axis, yaxis: C().axis("seconds", { rangemode: "tozero" }) });
    C().plot("chart-credit", [
      line(steps.map((s) => s.mean_credit), "mean credit"),
      line(steps.map((s) => s.zero_credit_share), "zero-credit share", { yaxis: "y2" }),
    ], { xaxis: axis, yaxis: C().axis("mean credit", { rangemode: "tozero" }),
      yaxis2: C().axis("zero-credit share", { overlaying: "y", side: "right", tickformat: ".0%", range: [0, 1],
        tickmode: "linear", tick0: 0, dtick: 0.25, showgrid: false }) });
    const failed = steps.map((s) => s.failed_judgments), unscorable = steps.map((s) => s.unscorable_turns);
    C().plot("chart-failures", [
      { x: x, y: failed, name: "failed judgments", type: "bar" },
      { x: x, y: unscorable, name: "unscorable turns", type: "bar" },
    ], { xaxis: axis, yaxis: C().countAxis("count", failed.concat(unscorable)), barmode: "group" });
    const edges = steps.length ? steps[0].process_advantage.edges : [];
    const bins = ["< " + edges[0]].concat(edges.slice(0, -1).map((e, i) => e + " to " + edges[i + 1]),
      ["≥ " + edges[edges.length - 1]]);
    const z = bins.map((_, b) => steps.map((s) => s.process_advantage.counts[b]));
    const most = Math.max(1, ...z.flat());
    C().plot("chart-advantage", [{
      type: "heatmap", x: x, y: bins, z: z, colorscale: "Cividis", zmin: 0,
      colorbar: { title: { text: "turns" }, tick0: 0, dtick: C().niceStep(most, 5), tickformat: "d" },
    }], { xaxis: axis, yaxis: C().axis("A_rg", { type: "category" }) });
  }

  /* The kinds whose levels are followed, as the run document names them. */
  const DRIFT_KINDS = [["visit", "visit"], ["report_rubric", "report rubric"]];

  /* Per step, the judge's levels and their drift (absent from documents made before they existed). */
  function drift(run) {
    const base = run.drift_baseline;
    const numbered = run.steps.filter((s) => s.judge_levels);
    const summary = document.getElementById("drift-summary");
    const tbody = document.querySelector("#drift tbody");
    if (!base) {
      tbody.append(el("tr", {}, [el("td", { colspan: 7, text: "not in this document" })]));
      return;
    }
    const flagged = numbered.filter((s) => DRIFT_KINDS.some(([k]) => s.drift[k].flagged));
    summary.replaceChildren(base.steps.length
      ? D.num("drift_threshold", "Baseline: steps " + base.steps.join(", ") + " pooled · threshold " + base.threshold + " · "
        + D.plural(flagged.length, "step") + " flagged")
      : D.num("drift_threshold", "Fewer than four numbered steps: no step to compare with the first three yet (threshold "
        + base.threshold + ")."));
    const { x, axis } = C().stepAxis(numbered);
    const mode = numbered.length > 50 ? "lines" : "lines+markers";
    const traces = DRIFT_KINDS.map(([k, label]) => ({ x: x, y: numbered.map((s) => s.drift[k].value), name: label,
      mode: mode }));
    // The threshold as a dotted line across the plot (a shape: the legend stays short).
    C().plot("chart-drift", traces, { xaxis: axis, yaxis: C().axis("total variation distance", { range: [0, 1] }),
      shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: base.threshold, y1: base.threshold,
        line: { dash: "dot", width: 1.5, color: "#8a3b00" } }] });
    const share = (s, i) => (s.judge_levels.visit.shares ? s.judge_levels.visit.shares[i] : null);
    C().plot("chart-levels", [0, 1, 2].map((i) => ({ x: x, y: numbered.map((s) => share(s, i)), name: "level " + i,
      type: "bar" })), { xaxis: axis, yaxis: C().axis("share of visit judgments", { tickformat: ".0%",
      range: [0, 1] }), barmode: "stack" });
    for (const s of numbered) {
      const cells = [cell("step", s.step)];
      for (const [k] of DRIFT_KINDS) {
        const levels = s.judge_levels[k], d = s.drift[k];
        cells.push(cell("level_judgments", levels.judgments));
        cells.push(cell(k === "visit" ? "visit_levels_share" : "report_scores_share",
          levels.shares ? levels.shares.map((v) => pct(v)).join(" / ") : "–"));
        const td = cell(d.flagged ? "drift_flagged" : "drift", d.value === null ? "–" : fmt(d.value, 3) + (d.flagged ? " ⚑ flagged" : ""));
        td.dataset.kind = k;
        if (d.flagged) td.classList.add("flagged");
        cells.push(td);
      }
      const row = el("tr", { "data-step": s.step }, cells);
      if (DRIFT_KINDS.some(([k]) => s.drift[k].flagged)) row.dataset.flagged = "true";
      tbody.append(row);
    }
  }

  function curves(steps) {
    const select = document.getElementById("steps-select");
    steps.forEach(function (s, i) {
      select.append(el("option", { value: i, text: "step " + (s.step === null ? "none" : s.step),
        selected: i === 0 || i === steps.length - 1 ? "selected" : null }));
    });
    const draw = function () {
      const chosen = Array.from(select.selectedOptions).map((o) => steps[Number(o.value)]);
      const traces = (key) => chosen.map((s) => ({ x: s.evidence.map((p) => p.budget), y: s.evidence.map((p) => p[key]),
        name: "step " + (s.step === null ? "none" : s.step), mode: "lines+markers" }));
      const b = C().axis("b (research turns)", { dtick: 2 });
      // The legend names the step even when only one is picked.
      C().plot("chart-cb", traces("cumulative"), { xaxis: b, yaxis: C().axis("C(b)", { rangemode: "tozero" }), showlegend: true });
      C().plot("chart-ub", traces("rate"), { xaxis: b, yaxis: C().axis("U(b)", { rangemode: "tozero" }), showlegend: true });
    };
    select.addEventListener("change", draw);
    draw();
  }

  function cell(term, text) { return D.explain(el("td", { text: text }), term); }

  function table(steps) {
    const tbody = document.querySelector("#steps tbody");
    for (const s of steps) {
      const links = el("td", {}, s.group_ids.map((g, i) => {
        const a = D.DATA ? D.verbatim(g) : el("a", { href: D.base + "/groups/" + enc(g), "data-text": "", text: g });
        return i ? [" ", a] : [a];
      }).flat());
      tbody.append(el("tr", { "data-step": s.step }, [
        cell("step", s.step === null ? "none" : s.step), cell("groups_done", s.groups_done + "/" + s.groups),
        cell("trajectories", s.trajectories), cell("process_calls", fmt(s.judge_calls.process_per_trajectory)),
        cell("outcome_calls", fmt(s.judge_calls.outcome_per_trajectory)), cell("judgments_failed", s.failed_judgments),
        cell("unscorable", s.unscorable_turns),
        cell("latency", s.latency_per_trajectory_s ? fmt(s.latency_per_trajectory_s.p50) : "–"),
        cell("mean_credit", fmt(s.mean_credit, 3)), cell("zero_credit", pct(s.zero_credit_share)),
        cell("tokens_per_trajectory", s.usage_per_trajectory
          ? count(s.usage_per_trajectory.prompt_tokens + s.usage_per_trajectory.completion_tokens) : "–"),
        cell("cost_per_trajectory", usd(s.usage_per_trajectory ? s.usage_per_trajectory.cost_usd : null)),
        cell("run_cost", usd(s.usage ? s.usage.cost_usd : null)),
        cell("cached_share", pct(s.usage ? s.usage.cached_prompt_share : null)),
        cell("reused", s.usage && s.usage.reused !== undefined ? count(s.usage.reused) : "–"), links,
      ]));
    }
  }

  async function sensitivity(steps) {
    const batches = [...new Set(steps.flatMap((s) => s.batches))];
    const form = document.getElementById("batch-picker");
    if (!batches.length) {
      // Nothing to pick: say how a run gets a batch instead of an empty picker.
      form.hidden = true;
      document.getElementById("sensitivity").hidden = true;
      document.getElementById("no-batch").hidden = false;
      return;
    }
    const bsel = document.getElementById("batch-select");
    for (const b of batches) bsel.append(el("option", { value: b, text: b, "data-text": "" }));
    const fill = async function () {
      const sbody = document.querySelector("#sensitivity tbody");
      const doc = await D.load("/v1/batches/" + enc(bsel.value) + "/sensitivity");
      sbody.replaceChildren();
      for (const row of doc.scenarios) {
        const s = row.sensitivity;
        const up = row.exact ? "" : "≤", down = row.exact ? "" : "≥";
        const name = el("td", {}, [D.verbatim(row.name)]);
        sbody.append(el("tr", { "data-scenario": row.name }, s ? [
          name, cell("w1", up + fmt(s.wasserstein_1, 3)), cell("rmse", up + fmt(s.rmse, 3)),
          cell("process_sign", down + pct(s.process_sign_agreement)), cell("fused_sign", down + pct(s.fused_sign_agreement)),
        ] : [name, el("td", { colspan: 4, text: "no done group" })]));
      }
    };
    bsel.addEventListener("change", () => fill().catch(D.showProblem));
    await fill();
  }

  D.pages.run = runPage;
})();
