/* The group page: one row of cells per rollout (its outcome cell, then one cell per turn,
   coloured by the fused advantage), under it one support track per positive rubric whose
   k-th cell sits exactly under turn k, and the group's C(b) and U(b). */
(function () {
  "use strict";
  const D = window.DrCredit;
  const { el, fmt, num, verbatim, enc } = D;

  // ColorBrewer PuOr (diverging, safe for the common colour-vision deficiencies):
  // orange below zero, purple above, near-white at zero; clamped at +-2.
  const STOPS = ["#b35806", "#f1a340", "#fee0b6", "#f7f7f7", "#d8daeb", "#998ec3", "#542788"];
  const LETTER = { search: "S", visit: "V", tool: "T", answer: "A" };
  const TERMS = ["fused", "outcome_advantage", "reward", "process_advantage", "discounted", "mu_rg", "mu_o", "rollouts",
    "credit", "visit_credit", "navigation_credit", "snippet_credit", "snippet_matches", "support_track", "judgments",
    "level", "prior_support", "judge_calls", "judgments_failed", "unscorable", "component_rubric", "component_format",
    "component_search", "component_cite", "component_length", "weight", "contribution", "r_id", "r_semantic",
    "rubric_score", "rubric_weight", "claim_joint", "claim_pages", "claim_score", "budget", "cumulative", "rate",
    "judge_requests", "prompt_tokens", "cached_tokens", "completion_tokens", "judge_time", "cost", "answered_by",
    "cached_share", "reused", "prompt_layout"];

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

  function summary(adv) {
    const s = adv.stats, p = adv.progress || {};
    document.getElementById("group-summary").replaceChildren(
      num("rollouts", D.plural(adv.rollouts.length, "rollout")), " · ",
      num("mu_rg", "mu_rg " + fmt(s.mu_rg, 3) + ", sigma_rg " + fmt(s.sigma_rg, 3)), " · ",
      num("mu_o", "mu_o " + fmt(s.mu_o, 3) + ", sigma_o " + fmt(s.sigma_o, 3)), " · ",
      num("judge_calls", D.plural(p.judge_calls || 0, "judge call")), ", ",
      num("judgments_failed", (p.judgments_failed || 0) + " failed"), ", ",
      num("unscorable", D.plural(p.unscorable_turns || 0, "unscorable turn")));
    if (adv.usage) {
      document.getElementById("group-usage").replaceChildren("Judge usage: ", ...D.details.usage(adv.usage));
    }
  }

  async function groupPage() {
    const id = document.body.dataset.group;
    const [adv, credits] = await Promise.all([
      D.load("/v1/groups/" + enc(id) + "/advantages"),
      D.load("/v1/groups/" + enc(id) + "/credits"),
    ]);
    summary(adv);
    const legend = document.getElementById("legend-ramp");
    legend.style.background = "linear-gradient(to right," + STOPS.join(",") + ")";
    const positive = (credits.rubrics || []).filter((r) => r.weight > 0);
    let most = 1;
    for (const r of credits.rollouts) {
      for (const points of Object.values(r.support_histories || {})) most = Math.max(most, points.length);
    }
    const grid = document.getElementById("grid");
    adv.rollouts.forEach(function (ra, i) {
      const rc = credits.rollouts[i];
      const block = el("div", { class: "rollout", role: "rowgroup" });
      block.append(row(ra, rc, credits));
      for (const rubric of positive) block.append(track(ra, rubric, (rc.support_histories || {})[rubric.id] || [], most));
      grid.append(block);
    });
    grid.addEventListener("keydown", arrows);
    D.glossary(TERMS);
    const ev = await D.load("/v1/groups/" + enc(id) + "/evidence");
    D.charts.evidenceChart("evidence-chart", [{ name: "this group", points: ev.points }]);
  }

  function row(ra, rc, credits) {
    const line = el("div", { class: "row", role: "row", "data-rollout": ra.id });
    line.append(el("span", { class: "label", role: "rowheader", title: ra.id },
      [verbatim(ra.id), " · ", num("reward", "reward " + fmt(ra.outcome_reward))]));
    const outcome = D.explain(el("button", {
      class: "cell outcome" + (isDark(ra.outcome_advantage) ? " dark" : ""), type: "button", role: "gridcell",
      "data-rollout": ra.id, "data-kind": "outcome", "data-advantage": ra.outcome_advantage,
      "aria-pressed": "false", "aria-label": "rollout " + ra.id + " outcome advantage " + fmt(ra.outcome_advantage),
      text: "O " + fmt(ra.outcome_advantage),
    }), "outcome_advantage", "Outcome advantage; select for the reward's parts");
    outcome.style.background = colour(ra.outcome_advantage);
    outcome.addEventListener("click", () => select(outcome, () => D.details.outcome(ra, rc, credits)));
    line.append(outcome);
    for (const t of ra.turns) {
      const cell = D.explain(el("button", {
        class: "cell" + (isDark(t.advantage) ? " dark" : "") + (t.unscorable ? " unscorable" : ""),
        type: "button", role: "gridcell", "data-rollout": ra.id, "data-turn": t.index, "data-kind": "turn",
        "data-advantage": t.advantage, "aria-pressed": "false",
        "aria-label": "rollout " + ra.id + " turn " + t.index + " " + t.type + ": advantage " + fmt(t.advantage) +
          ", credit " + fmt(t.credit) + (t.unscorable ? ", unscorable" : ""),
      }), "fused", "Turn " + t.index + " (" + t.type + ")");
      cell.append(LETTER[t.type] || "?", el("br"), fmt(t.advantage));
      cell.style.background = colour(t.advantage);
      cell.addEventListener("click", () => select(cell, () => D.details.turn(ra, rc, t.index)));
      line.append(cell);
    }
    return line;
  }

  function track(ra, rubric, points, most) {
    const node = el("div", { class: "track", "data-rollout": ra.id, "data-rubric": rubric.id,
      "aria-label": "support for rubric " + rubric.id + " along rollout " + ra.id });
    node.append(el("span", { class: "label", title: rubric.description || rubric.id }, ["↳ ", verbatim(rubric.id)]),
      el("span", { class: "spacer" }));
    for (const t of ra.turns) {
      const count = points.filter((pt) => pt.turn_index <= t.index).length;
      const shade = Math.round(255 - 200 * (count / most));
      const tick = D.explain(el("span", { class: "tick", "data-turn": t.index, "data-support": count }), "support_track",
        rubric.id + ": " + D.plural(count, "support point") + " by turn " + t.index);
      tick.style.background = "rgb(" + shade + "," + shade + "," + shade + ")";
      node.append(tick);
    }
    return node;
  }

  function arrows(ev) {
    const cell = ev.target.closest(".cell");
    if (!cell) return;
    const line = cell.parentElement;
    const cells = Array.from(line.querySelectorAll(".cell"));
    let target = null;
    if (ev.key === "ArrowRight") target = cells[cells.indexOf(cell) + 1];
    else if (ev.key === "ArrowLeft") target = cells[cells.indexOf(cell) - 1];
    else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
      const rows = Array.from(document.querySelectorAll("#grid .row"));
      const next = rows[rows.indexOf(line) + (ev.key === "ArrowDown" ? 1 : -1)];
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

  D.pages.group = groupPage;
})();
