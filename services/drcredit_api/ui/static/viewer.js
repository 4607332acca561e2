/* DrCredit viewer: renders the JSON of the /v1 endpoints (or, in a report, the same JSON
   embedded in the page as window.DRCREDIT_DATA, keyed by the path it came from). */
(function () {
  "use strict";
  const DATA = window.DRCREDIT_DATA || null;
  const body = document.body;
  const base = body.dataset.base || "/ui";
  const KEY = "drcredit-key";
  const enc = encodeURIComponent;

  // ------------------------------------------------------------------ data and key

  class Problem extends Error {}

  function storedKey() {
    try { return sessionStorage.getItem(KEY); } catch (e) { return null; }
  }

  async function load(path) {
    if (DATA) {
      if (Object.prototype.hasOwnProperty.call(DATA, path)) return DATA[path];
      throw new Problem("This report does not include " + path);
    }
    const headers = { Accept: "application/json" };
    const key = storedKey();
    if (key) headers.Authorization = "Bearer " + key;
    const r = await fetch(path, { headers: headers });
    if (r.status === 401) throw new Problem("This service needs an API key: enter it above.");
    let doc = null;
    try { doc = await r.json(); } catch (e) { doc = null; }
    if (!r.ok) throw new Problem((doc && doc.message) || "HTTP " + r.status + " for " + path);
    return doc;
  }

  function showProblem(err) {
    const p = document.getElementById("problem");
    p.textContent = err instanceof Problem ? err.message : "Could not show this page: " + err;
    p.hidden = false;
  }

  function setupKey() {
    const form = document.getElementById("key-form");
    if (!form) return;
    const state = document.getElementById("key-state");
    state.textContent = storedKey() ? "a key is set for this session" : "no key (open service)";
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      const value = document.getElementById("key-input").value.trim();
      try {
        if (value) sessionStorage.setItem(KEY, value); else sessionStorage.removeItem(KEY);
      } catch (e) { /* storage off: the key lasts for this page only */ }
      location.reload();
    });
  }

  // ------------------------------------------------------------------ small helpers

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const child of children || []) node.append(child);
    return node;
  }

  function fmt(x, digits) {
    if (x === null || x === undefined) return "–";
    return Number(x).toFixed(digits === undefined ? 2 : digits);
  }

  function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%"; }

  // ColorBrewer PuOr (diverging, safe for the common colour-vision deficiencies):
  // orange below zero, purple above, near-white at zero; clamped at +-2.
  const STOPS = ["#b35806", "#f1a340", "#fee0b6", "#f7f7f7", "#d8daeb", "#998ec3", "#542788"];

  function rgb(hex) { return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)); }

  function colour(value) {
    if (value === null || value === undefined) return "#ffffff";
    const t = (Math.max(-2, Math.min(2, value)) + 2) / 4 * (STOPS.length - 1);
    const i = Math.min(STOPS.length - 2, Math.floor(t));
    const a = rgb(STOPS[i]), b = rgb(STOPS[i + 1]), f = t - i;
    const c = a.map((x, k) => Math.round(x + (b[k] - x) * f));
    return "rgb(" + c.join(",") + ")";
  }

  function isDark(value) {
    return value !== null && value !== undefined && Math.abs(value) > 1.1;
  }

  function ramp() {
    const node = document.getElementById("legend-ramp");
    if (node) node.style.background = "linear-gradient(to right," + STOPS.join(",") + ")";
  }

  const PLOT = { displaylogo: false, responsive: true };
  function layout(title, extra) {
    return Object.assign({ title: { text: title, font: { size: 14 } }, margin: { t: 40, r: 20, b: 45, l: 55 },
      legend: { orientation: "h" } }, extra || {});
  }

  // ------------------------------------------------------------------ index

  async function indexPage() {
    const doc = await load("/v1/runs");
    const tbody = document.querySelector("#runs tbody");
    for (const run of doc.runs) {
      tbody.append(el("tr", {}, [
        el("td", {}, [el("a", { href: base + "/runs/" + enc(run.run), text: run.run })]),
        el("td", { text: run.groups }), el("td", { text: run.steps }), el("td", { text: run.last_at }),
      ]));
    }
    if (!doc.runs.length) tbody.append(el("tr", {}, [el("td", { colspan: 4, text: "no runs yet" })]));
    document.getElementById("open-group").addEventListener("submit", function (ev) {
      ev.preventDefault();
      location.href = base + "/groups/" + enc(document.getElementById("group-id").value.trim());
    });
  }

  // ------------------------------------------------------------------ group

  const LETTER = { search: "S", visit: "V", tool: "T", answer: "A" };

  async function groupPage() {
    const id = body.dataset.group;
    const [adv, credits] = await Promise.all([
      load("/v1/groups/" + enc(id) + "/advantages"),
      load("/v1/groups/" + enc(id) + "/credits"),
    ]);
    const p = adv.progress || {};
    document.getElementById("group-summary").textContent =
      adv.rollouts.length + " rollouts · mu_rg " + fmt(adv.stats.mu_rg, 3) + ", sigma_rg " + fmt(adv.stats.sigma_rg, 3) +
      " · mu_o " + fmt(adv.stats.mu_o, 3) + ", sigma_o " + fmt(adv.stats.sigma_o, 3) + " · " + (p.judge_calls || 0) +
      " judge calls, " + (p.judgments_failed || 0) + " failed, " + (p.unscorable_turns || 0) + " unscorable turns";
    ramp();
    const positive = (credits.rubrics || []).filter((r) => r.weight > 0);
    let most = 1;
    for (const r of credits.rollouts) {
      for (const points of Object.values(r.support_histories || {})) most = Math.max(most, points.length);
    }
    const grid = document.getElementById("grid");
    adv.rollouts.forEach(function (ra, i) {
      const rc = credits.rollouts[i];
      const block = el("div", { class: "rollout", role: "rowgroup" });
      const row = el("div", { class: "row", role: "row", "data-rollout": ra.id });
      row.append(el("span", { class: "label", role: "rowheader",
        text: ra.id + " · reward " + fmt(ra.outcome_reward), title: ra.id }));
      const outcome = el("button", {
        class: "cell outcome" + (isDark(ra.outcome_advantage) ? " dark" : ""), type: "button", role: "gridcell",
        "data-rollout": ra.id, "data-kind": "outcome", "data-advantage": ra.outcome_advantage,
        "aria-pressed": "false", "aria-label": "rollout " + ra.id + " outcome advantage " + fmt(ra.outcome_advantage),
        text: "O " + fmt(ra.outcome_advantage),
      });
      outcome.style.background = colour(ra.outcome_advantage);
      outcome.addEventListener("click", () => select(outcome, () => outcomeDetails(ra, rc)));
      row.append(outcome);
      ra.turns.forEach(function (t) {
        const cell = el("button", {
          class: "cell" + (isDark(t.advantage) ? " dark" : "") + (t.unscorable ? " unscorable" : ""),
          type: "button", role: "gridcell", "data-rollout": ra.id, "data-turn": t.index, "data-kind": "turn",
          "data-advantage": t.advantage, "aria-pressed": "false",
          "aria-label": "rollout " + ra.id + " turn " + t.index + " " + t.type + ": advantage " + fmt(t.advantage) +
            ", credit " + fmt(t.credit) + (t.unscorable ? ", unscorable" : ""),
        });
        cell.append(LETTER[t.type] || "?", el("br"), fmt(t.advantage));
        cell.style.background = colour(t.advantage);
        cell.addEventListener("click", () => select(cell, () => turnDetails(ra, rc, t.index)));
        row.append(cell);
      });
      block.append(row);
      for (const rubric of positive) {
        const points = (rc.support_histories || {})[rubric.id] || [];
        const track = el("div", { class: "track", "data-rollout": ra.id, "data-rubric": rubric.id,
          "aria-label": "support for rubric " + rubric.id + " along rollout " + ra.id });
        track.append(el("span", { class: "label", text: "↳ " + rubric.id, title: rubric.description || rubric.id }),
          el("span", { class: "spacer" }));
        ra.turns.forEach(function (t) {
          const count = points.filter((pt) => pt.turn_index <= t.index).length;
          const shade = Math.round(255 - 200 * (count / most));
          const tick = el("span", { class: "tick", "data-support": count, title: rubric.id + ": " + count + " support points by turn " + t.index });
          tick.style.background = "rgb(" + shade + "," + shade + "," + shade + ")";
          track.append(tick);
        });
        block.append(track);
      }
      grid.append(block);
    });
    grid.addEventListener("keydown", arrows);
    const ev = await load("/v1/groups/" + enc(id) + "/evidence");
    evidenceChart("evidence-chart", [{ name: "this group", points: ev.points }]);
  }

  function arrows(ev) {
    const cell = ev.target.closest(".cell");
    if (!cell) return;
    const row = cell.parentElement;
    const cells = Array.from(row.querySelectorAll(".cell"));
    let target = null;
    if (ev.key === "ArrowRight") target = cells[cells.indexOf(cell) + 1];
    else if (ev.key === "ArrowLeft") target = cells[cells.indexOf(cell) - 1];
    else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
      const rows = Array.from(document.querySelectorAll("#grid .row"));
      const next = rows[rows.indexOf(row) + (ev.key === "ArrowDown" ? 1 : -1)];
      if (next) {
        const others = next.querySelectorAll(".cell");
        target = others[Math.min(cells.indexOf(cell), others.length - 1)];
      }
    }
    if (target) { ev.preventDefault(); target.focus(); }
  }

  function select(cell, render) {
    document.querySelectorAll('#grid .cell[aria-pressed="true"]').forEach((c) => c.setAttribute("aria-pressed", "false"));
    cell.setAttribute("aria-pressed", "true");
    const panel = document.getElementById("details");
    panel.replaceChildren(el("h2", { text: "Details" }), ...render());
  }

  function turnDetails(ra, rc, index) {
    const t = ra.turns[index], c = rc.turns[index];
    const out = [el("p", {}, [el("strong", { text: "rollout " + ra.id + ", turn " + index + " (" + t.type + ")" })])];
    const facts = [["fused advantage", fmt(t.advantage, 4)], ["process advantage A_rg", fmt(t.process_advantage, 4)],
      ["discounted D", fmt(t.discounted_process_advantage, 4)], ["credit", fmt(t.credit, 4)]];
    if (c.type === "visit") facts.push(["visit credit (capped / uncapped)", fmt(c.visit_credit, 3) + " / " + fmt(c.visit_credit_uncapped, 3)]);
    if (c.type === "search") facts.push(["navigation / snippet credit", fmt(c.navigation_credit, 3) + " / " + fmt(c.snippet_credit, 3)],
      ["snippet matches", c.snippet_matches === null ? "–" : String(c.snippet_matches)]);
    if (t.unscorable) facts.push(["unscorable", "depends on a failed judgment"]);
    out.push(el("ul", { class: "facts" }, facts.map(([k, v]) => el("li", { "data-fact": k, text: k + ": " + v }))));
    out.push(el("h3", { text: "Judgments (" + c.judgments.length + ")" }));
    if (!c.judgments.length) out.push(el("p", { class: "muted", text: "none: this turn needed no judge call" }));
    for (const j of c.judgments) out.push(judgmentItem(j));
    return out;
  }

  function judgmentItem(j) {
    const items = [];
    let head = j.kind + " · " + j.status;
    if (j.kind === "visit") head = "visit · rubric " + j.rubric_id + " · level " + fmt(j.level, 0) + " · " + j.status;
    if (j.kind === "snippet") head = "snippets · " + (j.match_count === null ? "–" : j.match_count) + " matches · " + j.status;
    if (j.kind === "rubric" || j.kind === "citation") head = j.kind + " " + j.key + " · score " + fmt(j.score, 0) + " · " + j.status;
    if (j.cache_hit) head += " · answer reused from an identical request";
    if (j.kind === "visit") {
      if (j.page_ids.length) items.push(el("li", { text: "pages cited: " + j.page_ids.join(", ") }));
      for (const point of j.support_points) items.push(el("li", { text: "support: " + point }));
      items.push(el("li", { class: "muted", text: "support points before this visit: " + j.prior_support_points }));
    }
    if (j.kind === "snippet") {
      for (const m of j.matches) items.push(el("li", { text: m.rubric_id + " ← " + m.result_id + ": “" + m.evidence_quote + "”" }));
      for (const m of j.rejected_matches) items.push(el("li", { class: "muted", text: "rejected: " + m.reason }));
    }
    if (j.rationale) items.push(el("li", { class: "muted", text: "rationale: " + j.rationale }));
    if (j.failure_reason) items.push(el("li", { class: "failed", text: "failed: " + j.failure_reason }));
    return el("div", { class: "judgment", "data-kind": j.kind }, [el("h3", { text: head }), el("ul", {}, items)]);
  }

  function outcomeDetails(ra, rc) {
    const out = [el("p", {}, [el("strong", { text: "rollout " + ra.id + ": outcome" })]),
      el("ul", {}, [el("li", { text: "outcome reward: " + fmt(ra.outcome_reward, 4) }),
        el("li", { text: "outcome advantage A_o: " + fmt(ra.outcome_advantage, 4) })])];
    const o = rc.outcome;
    if (o) {
      out.push(el("h3", { text: "Reward breakdown (judged by the service)" }));
      const parts = [];
      for (const [k, v] of Object.entries(o)) {
        if (v !== null && typeof v !== "object") parts.push(el("li", { text: k + ": " + (typeof v === "number" ? fmt(v, 4) : v) }));
      }
      for (const [k, v] of Object.entries(o.rubric_scores || {})) parts.push(el("li", { text: "rubric " + k + ": " + fmt(v, 0) }));
      out.push(el("ul", { class: "breakdown" }, parts));
    }
    return out;
  }

  function evidenceChart(id, series) {
    const traces = [];
    for (const s of series) {
      const x = s.points.map((p) => p.budget);
      traces.push({ x: x, y: s.points.map((p) => p.cumulative), name: "C(b) " + s.name, mode: "lines+markers" });
      traces.push({ x: x, y: s.points.map((p) => p.rate), name: "U(b) " + s.name, mode: "lines+markers",
        line: { dash: "dot" } });
    }
    Plotly.newPlot(id, traces, layout("evidence by research-turn budget b", {
      xaxis: { title: { text: "budget b (research turns)" } },
      yaxis: { title: { text: "credit (C: gathered, U: per turn)" }, rangemode: "tozero" } }), PLOT);
  }

  // ------------------------------------------------------------------ run

  async function runPage() {
    const name = body.dataset.run;
    const run = await load("/v1/runs/" + enc(name));
    const steps = run.steps;
    const x = steps.map((s) => (s.step === null ? "none" : s.step));
    const trajectories = steps.reduce((a, s) => a + s.trajectories, 0);
    document.getElementById("run-summary").textContent = steps.length + " steps · " +
      steps.reduce((a, s) => a + s.groups, 0) + " groups · " + trajectories + " trajectories scored";
    const step = { title: { text: "step" }, type: "category" };
    Plotly.newPlot("chart-calls", [
      { x: x, y: steps.map((s) => s.judge_calls.process_per_trajectory), name: "process", mode: "lines+markers" },
      { x: x, y: steps.map((s) => s.judge_calls.outcome_per_trajectory), name: "outcome", mode: "lines+markers" },
    ], layout("judge calls per trajectory", { xaxis: step }), PLOT);
    const lat = (k) => steps.map((s) => (s.latency_per_trajectory_s ? s.latency_per_trajectory_s[k] : null));
    Plotly.newPlot("chart-latency", [
      { x: x, y: lat("p50"), name: "p50", mode: "lines+markers" },
      { x: x, y: lat("p90"), name: "p90", mode: "lines+markers" },
      { x: x, y: lat("max"), name: "max", mode: "lines+markers" },
    ], layout("scoring latency per trajectory (s)", { xaxis: step }), PLOT);
    Plotly.newPlot("chart-credit", [
      { x: x, y: steps.map((s) => s.mean_credit), name: "mean credit", mode: "lines+markers" },
      { x: x, y: steps.map((s) => s.zero_credit_share), name: "zero-credit share", mode: "lines+markers", yaxis: "y2" },
    ], layout("credit per turn", { xaxis: step, yaxis: { rangemode: "tozero", title: { text: "mean credit" } },
      yaxis2: { overlaying: "y", side: "right", tickformat: ".0%", range: [0, 1], title: { text: "zero-credit share" } } }), PLOT);
    Plotly.newPlot("chart-failures", [
      { x: x, y: steps.map((s) => s.failed_judgments), name: "failed judgments", type: "bar" },
      { x: x, y: steps.map((s) => s.unscorable_turns), name: "unscorable turns", type: "bar" },
    ], layout("judge failures", { xaxis: step, barmode: "group" }), PLOT);
    const edges = steps.length ? steps[0].process_advantage.edges : [];
    const bins = ["< " + edges[0]].concat(edges.slice(0, -1).map((e, i) => e + " to " + edges[i + 1]), ["≥ " + edges[edges.length - 1]]);
    Plotly.newPlot("chart-advantage", [{
      type: "heatmap", x: x, y: bins, z: bins.map((_, b) => steps.map((s) => s.process_advantage.counts[b])),
      colorscale: "Cividis", colorbar: { title: { text: "turns" } },
    }], layout("process advantage A_rg by step", { xaxis: step, yaxis: { type: "category" } }), PLOT);

    const select = document.getElementById("steps-select");
    steps.forEach(function (s, i) {
      select.append(el("option", { value: i, text: "step " + (s.step === null ? "none" : s.step),
        selected: i === 0 || i === steps.length - 1 ? "selected" : null }));
    });
    const curves = function () {
      const chosen = Array.from(select.selectedOptions).map((o) => steps[Number(o.value)]);
      const traces = (key) => chosen.map((s) => ({ x: s.evidence.map((p) => p.budget), y: s.evidence.map((p) => p[key]),
        name: "step " + s.step, mode: "lines+markers" }));
      Plotly.react("chart-cb", traces("cumulative"), layout("C(b): evidence gathered in the first b research turns",
        { xaxis: { title: { text: "b" } } }), PLOT);
      Plotly.react("chart-ub", traces("rate"), layout("U(b): evidence per research turn", { xaxis: { title: { text: "b" } } }), PLOT);
    };
    select.addEventListener("change", curves);
    curves();

    const tbody = document.querySelector("#steps tbody");
    for (const s of steps) {
      const links = el("td", {}, s.group_ids.map((g, i) => {
        const a = DATA ? el("span", { text: g }) : el("a", { href: base + "/groups/" + enc(g), text: g });
        return i ? [" ", a] : [a];
      }).flat());
      tbody.append(el("tr", { "data-step": s.step }, [
        el("td", { text: s.step === null ? "none" : s.step }), el("td", { text: s.groups_done + "/" + s.groups }),
        el("td", { text: s.trajectories }), el("td", { text: fmt(s.judge_calls.process_per_trajectory) }),
        el("td", { text: fmt(s.judge_calls.outcome_per_trajectory) }), el("td", { text: s.failed_judgments }),
        el("td", { text: s.unscorable_turns }),
        el("td", { text: s.latency_per_trajectory_s ? fmt(s.latency_per_trajectory_s.p50) : "–" }),
        el("td", { text: fmt(s.mean_credit, 3) }), el("td", { text: pct(s.zero_credit_share) }), links,
      ]));
    }

    const batches = [...new Set(steps.flatMap((s) => s.batches))];
    const bsel = document.getElementById("batch-select");
    for (const b of batches) bsel.append(el("option", { value: b, text: b }));
    const table = async function () {
      const sbody = document.querySelector("#sensitivity tbody");
      sbody.replaceChildren();
      if (!bsel.value) { sbody.append(el("tr", {}, [el("td", { colspan: 5, text: "no batch in this run" })])); return; }
      const doc = await load("/v1/batches/" + enc(bsel.value) + "/sensitivity");
      for (const row of doc.scenarios) {
        const s = row.sensitivity;
        const up = row.exact ? "" : "≤", down = row.exact ? "" : "≥";
        sbody.append(el("tr", { "data-scenario": row.name }, s ? [
          el("td", { text: row.name }), el("td", { text: up + fmt(s.wasserstein_1, 3) }), el("td", { text: up + fmt(s.rmse, 3) }),
          el("td", { text: down + pct(s.process_sign_agreement) }), el("td", { text: down + pct(s.fused_sign_agreement) }),
        ] : [el("td", { text: row.name }), el("td", { colspan: 4, text: "no done group" })]));
      }
    };
    bsel.addEventListener("change", () => table().catch(showProblem));
    await table();
  }

  // ------------------------------------------------------------------ start

  setupKey();
  const pages = { index: indexPage, group: groupPage, run: runPage };
  const page = pages[body.dataset.page];
  if (page) {
    page().then(() => body.setAttribute("data-ready", "true")).catch(function (err) {
      showProblem(err);
      body.setAttribute("data-ready", "error");
    });
  }
})();
