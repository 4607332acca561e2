/* The group page's details panel: what one selected cell rests on. A turn shows its
   advantages, its credit parts and every judgment; the outcome cell shows the reward
   and, when the service judged it, each weighted component summing to it, r_id and
   r_semantic, each rubric score and each claim. Numbers are the documents' own. */
(function () {
  "use strict";
  const D = window.DrCredit;
  const { el, fmt, num, verbatim, count, usd } = D;

  const COMPONENTS = ["rubric", "format", "search", "cite", "length"];

  function fact(term, label, value) {
    return D.explain(el("li", { "data-fact": label, text: label + ": " + value }), term);
  }

  function turn(ra, rc, index) {
    const t = ra.turns[index], c = rc.turns[index];
    const out = [el("p", {}, [el("strong", { text: "rollout ", title: "the rollout's id and the turn's index, from 0" },
      [verbatim(ra.id), ", turn " + index + " (" + t.type + ")"])])];
    const facts = [fact("fused", "fused advantage", fmt(t.advantage, 4)),
      fact("process_advantage", "process advantage A_rg", fmt(t.process_advantage, 4)),
      fact("discounted", "discounted D", fmt(t.discounted_process_advantage, 4)),
      fact("credit", "credit", fmt(t.credit, 4))];
    if (c.type === "visit") {
      facts.push(fact("visit_credit", "visit credit (capped / uncapped)",
        fmt(c.visit_credit, 3) + " / " + fmt(c.visit_credit_uncapped, 3)));
    }
    if (c.type === "search") {
      facts.push(fact("navigation_credit", "navigation credit", fmt(c.navigation_credit, 3)),
        fact("snippet_credit", "snippet credit", fmt(c.snippet_credit, 3)),
        fact("snippet_matches", "snippet matches", c.snippet_matches === null ? "–" : String(c.snippet_matches)));
    }
    if (t.unscorable) facts.push(fact("unscorable", "unscorable", "depends on a failed judgment"));
    out.push(el("ul", { class: "facts" }, facts));
    out.push(D.explain(el("h3", { text: "Judgments (" + c.judgments.length + ")" }), "judgments"));
    if (!c.judgments.length) out.push(el("p", { class: "muted", text: "none: this turn needed no judge call" }));
    for (const j of c.judgments) out.push(judgment(j));
    return out;
  }

  function judgment(j) {
    const head = [j.kind];
    if (j.kind === "visit") head.push(" · rubric ", verbatim(j.rubric_id), " · ", num("level", "level " + fmt(j.level, 0)));
    if (j.kind === "snippet") head.push(" · ", num("snippet_matches", (j.match_count === null ? "–" : j.match_count) + " matches"));
    if (j.kind === "rubric") head.push(" ", verbatim(j.key), " · ", num("rubric_score", "score " + fmt(j.score, 0)));
    if (j.kind === "citation") {
      // key "claim index:call": the joint call, or one page of a claim citing several
      const joint = j.key.endsWith(":joint");
      head.push(" ", verbatim(j.key), " · ", num(joint ? "claim_joint" : "claim_pages", "score " + fmt(j.score, 0)));
    }
    head.push(" · " + j.status);
    if (j.cache_hit) head.push(" · answer reused from an identical request");
    const items = [];
    if (j.kind === "visit") {
      if (j.page_ids.length) items.push(el("li", {}, ["pages cited: ", verbatim(j.page_ids.join(", "))]));
      for (const point of j.support_points) items.push(el("li", {}, ["support: ", verbatim(point)]));
      items.push(D.explain(el("li", { class: "muted", text: "support points before this visit: " + j.prior_support_points }),
        "prior_support"));
    }
    if (j.kind === "snippet") {
      for (const m of j.matches) {
        items.push(el("li", {}, [verbatim(m.rubric_id + " ← " + m.result_id + ": “" + m.evidence_quote + "”")]));
      }
      for (const m of j.rejected_matches) items.push(el("li", { class: "muted" }, ["rejected: ", verbatim(m.reason)]));
    }
    if (j.rationale) items.push(el("li", { class: "muted" }, ["rationale: ", verbatim(j.rationale)]));
    if (j.status === "ok" || j.status === "failed") items.push(spent(j));
    if (j.failure_reason) items.push(el("li", { class: "failed" }, ["failed: ", verbatim(j.failure_reason)]));
    return el("div", { class: "judgment", "data-kind": j.kind }, [el("h3", {}, head), el("ul", {}, items)]);
  }

  /* Who answered a judgment and what it took: its attempts' tokens (none for a reused answer). */
  function spent(j) {
    const parts = [];
    if (j.served_model || j.endpoint) {
      parts.push(D.explain(el("span", { text: "answered by " }), "answered_by"), verbatim(j.served_model || j.model || "?"));
      if (j.endpoint) parts.push(" at ", verbatim(j.endpoint));
      parts.push(" · ");
    }
    if (j.prompt_layout) parts.push(num("prompt_layout", "layout " + j.prompt_layout), " · ");
    if (j.reused) {
      parts.push(num("reused", "reused from an earlier identical request: no request of its own"));
    } else if (j.cache_hit) {
      parts.push(num("judge_requests", "no request of its own"));
    } else {
      parts.push(num("judge_requests", D.plural(j.attempts.length, "request")), " · ",
        num("prompt_tokens", count(j.prompt_tokens) + " prompt tokens"), " (",
        num("cached_tokens", count(j.cached_prompt_tokens || 0) + " cached"),
        ...(j.estimated_prompt_tokens ? [", ", num("prompt_tokens", count(j.estimated_prompt_tokens) + " estimated")] : []),
        ") · ",
        num("completion_tokens", count(j.completion_tokens) + " completion tokens"));
      if (j.latency_s !== null && j.latency_s !== undefined) {
        const waited = j.attempts.reduce((sum, a) => sum + (a.waited_s || 0), 0);
        parts.push(" · ", num("judge_time", fmt(j.latency_s, 2) + " s, " + fmt(waited, 2) + " s of it waiting its turn",
          { "data-latency": j.latency_s, "data-waited": waited }));
      }
    }
    return el("li", { class: "muted", "data-usage": "" }, parts);
  }

  /* A usage object (docs/api.md): requests, tokens and cost, each explained. */
  function usage(u) {
    return [num("judge_requests", D.plural(u.calls, "request")), " · ",
      num("prompt_tokens", count(u.prompt_tokens) + " prompt tokens"), " (",
      num("cached_tokens", count(u.cached_prompt_tokens) + " cached"), ") · ",
      ...(u.cached_prompt_share !== undefined ? [num("cached_share", D.pct(u.cached_prompt_share) + " of prompt tokens cached",
        { "data-value": u.cached_prompt_share === null ? "" : u.cached_prompt_share }), " · "] : []),
      ...(u.reused ? [num("reused", D.plural(u.reused, "judgment") + " reused", { "data-value": u.reused }), " · "] : []),
      num("completion_tokens", count(u.completion_tokens) + " completion tokens"), " · ",
      num("cost", "cost " + usd(u.cost_usd), { "data-value": u.cost_usd === null ? "" : u.cost_usd })];
  }

  // ------------------------------------------------------------------ the outcome cell

  function outcome(ra, rc, credits) {
    const out = [el("p", {}, [el("strong", { title: "the rollout's id" }, ["rollout ", verbatim(ra.id), ": outcome"])]),
      el("ul", { class: "facts" }, [
        fact("reward", "outcome reward", fmt(ra.outcome_reward, 4)),
        fact("outcome_advantage", "outcome advantage A_o", fmt(ra.outcome_advantage, 4)),
      ])];
    if (ra.usage) out.push(el("p", { class: "muted", "data-rollout-usage": "" }, ["Judge usage of this rollout: ", ...usage(ra.usage)]));
    const o = rc.outcome;
    if (!o) {
      out.push(el("p", { class: "muted", text: "The trainer's own reward (outcome_source given): the service did " +
        "not judge this report, so the reward has no parts to show." }));
      return out;
    }
    const params = credits.params || {};
    out.push(...components(o, params.outcome_weights || {}, params), ...citeParts(o), ...rubricScores(o, credits.rubrics),
      ...claims(o.claims));
    return out;
  }

  const SHORT = {
    rubric: () => "rubric scores below, weighted",
    format: () => "share of the 4 format checks passed",
    search: (p) => "min(1, searches / search_cap " + fmt(p.search_cap, 0) + ")",
    cite: () => "0.4 r_id + 0.6 r_semantic, below",
    length: (p) => "min(1, words / length_cap " + fmt(p.length_cap, 0) + ")",
  };

  function components(o, weights, params) {
    const rows = COMPONENTS.map(function (k) {
      const value = o.components[k], weight = weights[k];
      const part = weight === undefined ? null : weight * value;
      return el("tr", { "data-component": k }, [
        D.explain(el("th", { scope: "row" }, [k, el("span", { class: "why", text: SHORT[k](params) })]), "component_" + k),
        el("td", {}, [num("component_" + k, fmt(value, 4), { "data-value": value })]),
        el("td", {}, [num("weight", weight === undefined ? "–" : fmt(weight, 2), { "data-value": weight })]),
        el("td", {}, [num("contribution", fmt(part, 4), { "data-value": part })]),
      ]);
    });
    const total = el("tr", { class: "total" }, [el("th", { scope: "row", colspan: 3, text: "reward (their sum)" }),
      el("td", {}, [num("reward", fmt(o.reward, 4), { "data-value": o.reward })])]);
    const nodes = [el("h3", { text: "Reward: five weighted components" }),
      el("table", { class: "parts reward-parts" }, [
        el("thead", {}, [el("tr", {}, [el("th", { scope: "col", text: "component" }),
          D.explain(el("th", { scope: "col", text: "value" }), "reward"),
          D.explain(el("th", { scope: "col", text: "weight" }), "weight"),
          D.explain(el("th", { scope: "col", text: "weight × value" }), "contribution")])]),
        el("tbody", {}, rows), el("tfoot", {}, [total])])];
    if (o.unscorable) {
      nodes.push(el("p", { class: "failed", text: "A rubric judgment failed: it counts as 0 here" +
        (o.reward === null ? ", and under on_judge_failure exclude the reward is null (outcome advantage 0)." : ".") }));
    }
    return nodes;
  }

  function citeParts(o) {
    const cited = o.claims.length > 0;
    const line = cited
      ? "cite " + fmt(o.components.cite, 4) + " = 0.4 × " + fmt(o.r_id, 4) + " + 0.6 × " + fmt(o.r_semantic, 4)
      : "no citation in the report: cite is 0";
    return [D.explain(el("h3", { text: "cite = 0.4 × r_id + 0.6 × r_semantic" }), "component_cite"), el("ul", { class: "cite-parts" }, [
      el("li", { "data-part": "r_id" }, [num("r_id", "r_id " + fmt(o.r_id, 4), { "data-value": o.r_id }),
        el("span", { class: "why", text: D.explanation("r_id") })]),
      el("li", { "data-part": "r_semantic" }, [num("r_semantic", "r_semantic " + fmt(o.r_semantic, 4),
        { "data-value": o.r_semantic }), el("span", { class: "why", text: D.explanation("r_semantic") })]),
      D.explain(el("li", { "data-part": "cite", text: line }), "component_cite"),
    ])];
  }

  function rubricScores(o, rubrics) {
    const weight = Object.fromEntries((rubrics || []).map((r) => [r.id, r.weight]));
    const positive = (rubrics || []).filter((r) => r.weight > 0).reduce((a, r) => a + r.weight, 0);
    let sum = 0;
    const rows = Object.entries(o.rubric_scores).map(function ([id, score]) {
      const part = (weight[id] || 0) * (score || 0) / 4;
      sum += part;
      const described = (rubrics || []).find((r) => r.id === id);
      return el("tr", { "data-rubric": id }, [
        el("th", { scope: "row", title: (described && described.description) || id }, [verbatim(id)]),
        el("td", {}, [num("rubric_weight", fmt(weight[id], 2))]),
        el("td", {}, [score === null ? num("judgments_failed", "failed") : num("rubric_score", String(score))]),
        el("td", {}, [num("component_rubric", fmt(part, 4), { "data-value": part })]),
      ]);
    });
    if (!rows.length) return [el("h3", { text: "Rubric scores" }), el("p", { class: "muted", text: "none: no report" })];
    const foot = el("tr", { class: "total" }, [D.explain(el("td", { colspan: 4, text: "rubric = " + fmt(sum, 4) +
      " ÷ " + fmt(positive, 2) + " (the positive weights) = " + fmt(o.components.rubric, 4) }), "component_rubric")]);
    return [D.explain(el("h3", { text: "Rubric scores (0-4)" }), "rubric_score"), el("table", { class: "parts rubric-scores" }, [
      el("thead", {}, [el("tr", {}, [el("th", { scope: "col", text: "rubric" }),
        D.explain(el("th", { scope: "col", text: "weight" }), "rubric_weight"),
        D.explain(el("th", { scope: "col", text: "score" }), "rubric_score"),
        D.explain(el("th", { scope: "col", text: "weight × score / 4" }), "component_rubric")])]),
      el("tbody", {}, rows), el("tfoot", {}, [foot])])];
  }

  function claims(list) {
    if (!list.length) return [];
    const items = list.map(function (c, k) {
      const parts = [el("q", { "data-text": "", text: c.claim }),
        el("div", { class: "muted" }, ["references ", verbatim(c.references.join(", ") || "none"),
          "; resolving ", verbatim(c.resolving.join(", ") || "none")])];
      const scores = [];
      if (c.joint !== null) scores.push(num("claim_joint", "joint " + c.joint));
      const pages = Object.entries(c.individual);
      if (c.resolving.length >= 2 && pages.length) {
        scores.push(" · ", num("claim_pages", "pages " + pages.map(([p, s]) => p + " " + s).join(", ")));
      }
      if (c.score !== null) scores.push(scores.length ? " · " : "", num("claim_score", "score " + fmt(c.score, 4), { "data-value": c.score }));
      if (c.why) scores.push(scores.length ? " · " : "", D.explain(el("span", { class: c.left_out ? "failed" : "muted", text: c.why }), "claim_score"));
      parts.push(el("div", {}, scores));
      return el("li", { "data-claim": k }, parts);
    });
    return [D.explain(el("h3", { text: "Claims (" + list.length + ")" }), "claim_score"), el("ol", { class: "claims" }, items)];
  }

  Object.assign(D, { details: { turn: turn, outcome: outcome, usage: usage } });
})();
