/* The run page's judge audits: every audit over the run's groups (GET /v1/audits?run=),
   newest first. A done one shows, per kind of judgment, how often the two judges agree
   (pairs, left out, exact agreement, quadratic-weighted kappa, bias), each side's
   distribution of values and its confusion matrix, the first-visit subset, how far the
   process and fused advantages move, per group too, and what the audit judge used; a
   queued or running one its status, a failed one its reason. An audit against people's
   labels shows the same agreement figures and the labelers against each other instead of
   an effect. The wording follows docs/audit.md. */
(function () {
  "use strict";
  const D = window.DrCredit;
  const { el, fmt, pct, enc, count } = D;

  /* The kinds compared, as docs/audit.md names them, with their categories' labels. */
  const KINDS = [
    ["visit", "visit levels", "level"],
    ["snippet", "snippet matches", "match"],
    ["report_rubric", "report rubric scores", "score"],
    ["citation", "citation joint scores", "joint score"],
  ];

  const TERMS = ["audit_groups", "audit_seed", "audit_time", "audit_pairs", "audit_left_out", "audit_exact",
    "audit_kappa", "audit_first_visit", "audit_confusion", "audit_category", "audit_turns", "audit_w1",
    "audit_rmse", "audit_sign", "audit_outcome_rmse", "audit_group_turns", "judge_requests", "audit_judgments",
    "prompt_tokens", "cached_tokens", "completion_tokens", "audit_seconds", "audit_bias", "audit_marginal",
    "audit_labels"];

  function cell(term, text, detail, value) {
    const td = el("td", { text: text, "data-value": value === undefined || value === null ? null : String(value) });
    return D.explain(td, term, detail);
  }

  /* "2024-05-01T10:20:30.123+00:00" -> "2024-05-01 10:20:30" (UTC, as stored). */
  function when(iso) { return iso ? iso.slice(0, 19).replace("T", " ") : "–"; }

  function scopeText(scope) {
    if (scope.run !== undefined) return "run " + scope.run;
    if (scope.batch_id !== undefined) return "batch " + scope.batch_id;
    const ids = scope.group_ids || [];
    return "groups " + ids.slice(0, 3).join(", ") + (ids.length > 3 ? " and " + (ids.length - 3) + " more" : "");
  }

  /* An audit against people's labels (judge "human") compares with labels, not a judge. */
  function human(a) { return a.judge === "human"; }

  function header(a) {
    const model = a.judge_model ? [" (", D.verbatim(a.judge_model), ")"] : [];
    const sampled = a.group_ids.length;
    const times = a.finished_at ? "finished " + when(a.finished_at)
      : a.started_at ? "started " + when(a.started_at) : "created " + when(a.created_at);
    const against = human(a) ? [" · against ", el("strong", { text: "people's labels" })]
      : [" · audit judge ", D.verbatim(a.judge, "strong")].concat(model);
    return [
      el("h3", { class: "audit-title" }, ["Audit ", D.verbatim(a.audit_id, "code")].concat(against)),
      el("p", { class: "muted audit-meta" }, [
        el("span", { class: "audit-status", "data-status": a.status, text: a.status }), " · ",
        D.verbatim(scopeText(a.scope)), " · ",
        D.num("audit_groups", D.plural(sampled, "group") + (human(a) ? " labeled" : " re-scored")), " · ",
        D.num("audit_seed", "seed " + a.seed), " · ", D.num("audit_time", times + " UTC"),
      ]),
    ];
  }

  /* A mean difference with its sign: "+0.333", "−0.200", "–" without pairs. */
  function signed(x) {
    if (x === null || x === undefined) return "–";
    const text = Math.abs(x).toFixed(3);
    return (x < 0 && Number(text) !== 0 ? "−" : "+") + text;
  }

  function agreementTable(agreement) {
    const head = el("tr", {}, [el("th", { scope: "col", text: "judgments" }),
      D.explain(el("th", { scope: "col", text: "pairs" }), "audit_pairs"),
      D.explain(el("th", { scope: "col", text: "left out" }), "audit_left_out"),
      D.explain(el("th", { scope: "col", text: "exact agreement" }), "audit_exact"),
      D.explain(el("th", { scope: "col", text: "kappa" }), "audit_kappa"),
      D.explain(el("th", { scope: "col", text: "bias" }), "audit_bias")]);
    const body = el("tbody");
    const row = function (kind, label, a, term) {
      const name = el("th", { scope: "row", text: label });
      if (term) D.explain(name, term);
      body.append(el("tr", { "data-kind": kind }, [name,
        cell("audit_pairs", a.pairs, label), cell("audit_left_out", a.left_out, label),
        cell("audit_exact", pct(a.exact), label, a.exact), cell("audit_kappa", fmt(a.kappa, 3), label, a.kappa),
        cell("audit_bias", signed(a.bias), label, a.bias)]));
    };
    for (const [kind, label] of KINDS) {
      const a = agreement[kind];
      if (!a) continue;
      row(kind, label, a);
      if (a.first_visit) row("first_visit", "visit levels, first visits", a.first_visit, "audit_first_visit");
    }
    return el("table", { class: "table audit-agreement" }, [el("thead", {}, [head]), body]);
  }

  /* One confusion matrix: rows the original judge's value, columns the audit judge's. */
  function matrix(kind, label, unit, a) {
    const m = a.confusion;
    const corner = el("th", { scope: "col", class: "corner", text: "original ↓ audit →" });
    const head = el("tr", {}, [corner].concat(m.map((_, j) => D.explain(
      el("th", { scope: "col", text: String(j) }), "audit_category", "audit judge's " + unit + " " + j))));
    const rows = m.map((counts, i) => el("tr", {}, [
      D.explain(el("th", { scope: "row", text: String(i) }), "audit_category", "original judge's " + unit + " " + i),
    ].concat(counts.map((n, j) => cell("audit_confusion", count(n),
      label + ": original " + unit + " " + i + ", audit " + unit + " " + j, n)))));
    return el("figure", { class: "matrix", "data-kind": kind }, [
      el("figcaption", { text: label }),
      el("table", { class: "table confusion" }, [el("thead", {}, [head]), el("tbody", {}, rows)]),
    ]);
  }

  /* Each side's share of its pairs per value, one row per side, per kind with pairs. */
  function marginalsTable(agreement, other) {
    const rows = [];
    let top = 0;
    for (const [kind, label, unit] of KINDS) {
      const m = (agreement[kind] || {}).marginals;
      if (!m) continue;
      top = Math.max(top, m.original.length - 1);
      for (const [side, name] of [["original", "original judge"], ["audit", other]]) {
        rows.push([kind, label, unit, side, name, m[side]]);
      }
    }
    if (!rows.length) return el("p", { class: "muted", text: "No pair to compare: no distribution of values." });
    const head = el("tr", {}, [el("th", { scope: "col", text: "judgments" }), el("th", { scope: "col", text: "side" })]
      .concat([...Array(top + 1).keys()].map((j) => D.explain(el("th", { scope: "col", text: String(j) }),
        "audit_category", "value " + j))));
    const body = rows.map(([kind, label, unit, side, name, shares]) => el("tr", { "data-kind": kind, "data-side": side }, [
      el("th", { scope: "row", text: side === "original" ? label : "" }), el("td", { text: name })]
      .concat([...Array(top + 1).keys()].map((j) => j < shares.length
        ? cell("audit_marginal", pct(shares[j]), label + ": " + name + ", " + unit + " " + j, shares[j])
        : el("td")))));
    return el("table", { class: "table audit-marginals" }, [el("thead", {}, [head]), el("tbody", {}, body)]);
  }

  function matrices(agreement) {
    const figures = [];
    for (const [kind, label, unit] of KINDS) {
      const a = agreement[kind];
      if (!a) continue;
      if (a.pairs) figures.push(matrix(kind, label, unit, a));
      if (a.first_visit && a.first_visit.pairs) {
        figures.push(matrix("first_visit", "visit levels, first visits", unit, a.first_visit));
      }
    }
    if (!figures.length) return el("p", { class: "muted", text: "No pair to compare: no confusion matrix." });
    return el("div", { class: "matrices" }, figures);
  }

  function effectTable(e) {
    const head = el("tr", {}, [el("th", { scope: "col", text: "advantage" }),
      D.explain(el("th", { scope: "col", text: "W1" }), "audit_w1"),
      D.explain(el("th", { scope: "col", text: "RMSE" }), "audit_rmse"),
      D.explain(el("th", { scope: "col", text: "sign agreement" }), "audit_sign")]);
    const row = (name, label, w1, rmse, sign) => el("tr", { "data-advantage": name }, [
      el("th", { scope: "row", text: label }),
      cell("audit_w1", fmt(w1, 3), label, w1), cell("audit_rmse", fmt(rmse, 3), label, rmse),
      cell("audit_sign", pct(sign), label, sign)]);
    return el("table", { class: "table audit-effect" }, [el("thead", {}, [head]), el("tbody", {}, [
      row("process", "process A_rg", e.w1, e.rmse, e.process_sign_agreement),
      row("fused", "fused", e.fused_w1, e.fused_rmse, e.fused_sign_agreement),
    ])]);
  }

  /* Per group: the same figures, and the outcome RMSE where the service judged the outcome. */
  function groupTable(groups) {
    const cols = [["group", null], ["turns", "audit_group_turns"], ["W1", "audit_w1"], ["RMSE", "audit_rmse"],
      ["process sign", "audit_sign"], ["fused W1", "audit_w1"], ["fused RMSE", "audit_rmse"],
      ["fused sign", "audit_sign"], ["outcome RMSE", "audit_outcome_rmse"]];
    const head = el("tr", {}, cols.map(([text, term]) => {
      const th = el("th", { scope: "col", text: text });
      return term ? D.explain(th, term) : th;
    }));
    const rows = groups.map((g) => {
      const link = D.DATA ? D.verbatim(g.group_id)
        : el("a", { href: D.base + "/groups/" + enc(g.group_id), "data-text": "", text: g.group_id });
      const of = (what) => what + " of group " + g.group_id;
      return el("tr", { "data-group": g.group_id }, [el("td", {}, [link]),
        cell("audit_group_turns", g.turns, of("non-final turns"), g.turns),
        cell("audit_w1", fmt(g.w1, 3), of("process A_rg"), g.w1), cell("audit_rmse", fmt(g.rmse, 3), of("process A_rg"), g.rmse),
        cell("audit_sign", pct(g.process_sign_agreement), of("process A_rg"), g.process_sign_agreement),
        cell("audit_w1", fmt(g.fused_w1, 3), of("fused advantage"), g.fused_w1),
        cell("audit_rmse", fmt(g.fused_rmse, 3), of("fused advantage"), g.fused_rmse),
        cell("audit_sign", pct(g.fused_sign_agreement), of("fused advantage"), g.fused_sign_agreement),
        cell("audit_outcome_rmse", fmt(g.outcome_rmse, 3), of("outcome reward"), g.outcome_rmse)]);
    });
    return el("details", { class: "audit-groups" }, [el("summary", { text: "Per group" }),
      el("table", { class: "table" }, [el("thead", {}, [head]), el("tbody", {}, rows)])]);
  }

  function usageLine(u) {
    const parts = [D.num("judge_requests", count(u.calls) + " requests"), " for ",
      D.num("audit_judgments", count(u.judgments) + " judgments"), " · ",
      D.num("prompt_tokens", count(u.prompt_tokens) + " prompt tokens"), " (",
      D.num("cached_tokens", count(u.cached_prompt_tokens) + " cached"), ") · ",
      D.num("completion_tokens", count(u.completion_tokens) + " completion tokens")];
    if (u.seconds !== undefined && u.seconds !== null) parts.push(" · ", D.num("audit_seconds", fmt(u.seconds, 1) + " s"));
    return el("p", { class: "audit-usage" }, ["Audit judge usage: "].concat(parts));
  }

  /* The labelers of an audit against people: how many labels each gave, and each pair of
     them on the keys both labeled (the first by name as the "original"). */
  function labelersPart(labelers) {
    const counts = Object.entries(labelers.labels || {});
    const parts = [el("p", { class: "audit-labelers" }, ["Labels by: "].concat(counts.length
      ? counts.flatMap(([name, n], i) => (i ? [", "] : []).concat([D.verbatim(name, "strong"), " ",
        D.num("audit_labels", count(n))]))
      : ["nobody"]))];
    const pairs = labelers.pairs || [];
    if (!pairs.length) {
      parts.push(el("p", { class: "muted", text: "One labeler only: no agreement between people to read the judge's against." }));
      return parts;
    }
    const head = el("tr", {}, [el("th", { scope: "col", text: "labelers" }), el("th", { scope: "col", text: "judgments" }),
      D.explain(el("th", { scope: "col", text: "pairs" }), "audit_pairs"),
      D.explain(el("th", { scope: "col", text: "exact agreement" }), "audit_exact"),
      D.explain(el("th", { scope: "col", text: "kappa" }), "audit_kappa"),
      D.explain(el("th", { scope: "col", text: "bias" }), "audit_bias")]);
    const rows = [];
    for (const p of pairs) {
      const who = p.original + " / " + p.audit;
      for (const [kind, label] of KINDS) {
        const a = p.agreement[kind];
        if (!a || !a.pairs) continue;
        const what = label + ", " + p.audit + " against " + p.original;
        rows.push(el("tr", { "data-labelers": who, "data-kind": kind }, [el("td", {}, [D.verbatim(who)]),
          el("td", { text: label }), cell("audit_pairs", a.pairs, what),
          cell("audit_exact", pct(a.exact), what, a.exact), cell("audit_kappa", fmt(a.kappa, 3), what, a.kappa),
          cell("audit_bias", signed(a.bias), what, a.bias)]));
      }
    }
    parts.push(el("h4", { text: "The labelers against each other" }),
      el("p", { class: "muted", text: "On the keys both labeled, the first by name in the original's place: their agreement is the ceiling to read the judge's against." }),
      rows.length ? el("table", { class: "table audit-labeler-pairs" }, [el("thead", {}, [head]), el("tbody", {}, rows)])
        : el("p", { class: "muted", text: "No key was labeled by two of them." }));
    return parts;
  }

  function doneAudit(doc) {
    const e = doc.effect;
    const people = human(doc);
    const other = people ? "people" : "audit judge";
    const figures = [
      el("h4", { text: people ? "Agreement of the judge with people's labels" : "Agreement of the two judges" }),
      agreementTable(doc.agreement),
      el("h4", { text: "Distribution of values" }),
      el("p", { class: "muted", text: "Each side's share of its pairs at each value: a kappa can stay high while one side moves its values one way; the bias and these rows show it." }),
      marginalsTable(doc.agreement, other),
      el("h4", { text: "Confusion matrices" }),
      el("p", { class: "muted", text: "Rows: the original judge's value; columns: " + (people ? "people's (the lower median of their labels)" : "the audit judge's") + "; the diagonal is where they agree." }),
      matrices(doc.agreement),
    ];
    if (people) {
      return figures.concat(labelersPart(doc.labelers || {}), [el("p", { class: "muted audit-no-effect",
        text: "No effect on the advantages: people's labels give no second set of advantages to compare." })]);
    }
    return figures.concat([
      el("h4", {}, ["Effect on the advantages, over ", D.num("audit_turns", D.plural(e.turns, "non-final turn")), ""]),
      effectTable(e),
      el("p", { class: "audit-outcome" }, ["Outcome reward RMSE: ", D.num("audit_outcome_rmse", fmt(e.outcome_rmse, 3)),
        e.outcome_rmse === null ? " (no audited group had its outcome judged by the service)" : ""]),
      groupTable(e.groups || []),
      usageLine(doc.usage),
    ]);
  }

  function pendingAudit(a) {
    if (a.status === "failed") {
      return [el("p", { class: "problem audit-failed" }, ["This audit failed: ", D.verbatim(a.error || "no reason recorded")])];
    }
    return [el("p", { class: "notice audit-pending", text: "This audit is " + a.status +
      ": its report appears here once the audit judge has re-scored its groups (reload the page)." })];
  }

  async function audits(run) {
    const path = "/v1/audits?run=" + enc(run);
    const box = document.getElementById("audits");
    if (D.DATA && !Object.prototype.hasOwnProperty.call(D.DATA, path)) {
      // A report written before audits were part of it.
      box.append(el("p", { class: "muted", text: "This report does not include the run's audits." }));
      return;
    }
    const listed = (await D.load(path)).audits;
    document.getElementById("no-audit").hidden = listed.length > 0;
    for (const a of listed) {
      const doc = a.status === "done" ? await D.load("/v1/audits/" + enc(a.audit_id)) : null;
      box.append(el("article", { class: "audit", "data-audit": a.audit_id, "data-status": a.status },
        header(a).concat(doc ? doneAudit(doc) : pendingAudit(a))));
    }
  }

  D.audits = audits;
  D.AUDIT_TERMS = TERMS;
})();
