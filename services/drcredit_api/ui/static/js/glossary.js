/* What every number of the viewer means, in one place: each number the pages show carries
   its term (data-term) and its explanation (title, a tooltip), and each page ends with a
   glossary of the terms it uses. The wording follows docs/method.md. */
(function () {
  "use strict";
  const D = window.DrCredit;

  const TERMS = {
    // ---------------------------------------------------------------- advantages
    fused: ["fused advantage", "What the trainer trains on for a turn (the cell colour and number): A_o + process_weight × D for a research turn, A_o alone for the answer turn."],
    outcome_advantage: ["outcome advantage A_o", "The rollout's outcome reward standardized within the group: (reward − mu_o) / sigma_o; 0 when the rewards do not vary or the reward is unscorable."],
    process_advantage: ["process advantage A_rg", "The turn's credit normalized within the group: (credit − mu_rg) / sigma_rg; 0 for every turn when the credits do not vary."],
    discounted: ["discounted process advantage D", "A_rg discounted backwards along the rollout: D[t] = A_rg[t] + discount × D[t+1]; equal to A_rg under the default discount 0."],
    mu_rg: ["mu_rg, sigma_rg", "Mean and population standard deviation of the credits of every research turn of the group, zero credits included."],
    mu_o: ["mu_o, sigma_o", "Mean and sample standard deviation of the group's outcome rewards (an unscorable reward left out)."],
    rollouts: ["rollouts", "Rollouts of the group: answers sampled for the same question."],
    // ---------------------------------------------------------------- credits
    credit: ["credit", "What a research turn earned for new support: visit credit for a visit, navigation plus snippet credit (capped at cap) for a search, 0 for any other tool call."],
    visit_credit: ["visit credit (capped / uncapped)", "Sum over the positive rubrics of the contribution of each judged level (visit_levels), capped at cap; uncapped: the same sum before the cap."],
    navigation_credit: ["navigation credit", "Capped credit of the later visits of this rollout that opened one of this search's result URLs, passed back to the search."],
    snippet_credit: ["snippet credit", "snippet_weight per accepted snippet match: a result never opened whose snippet literally states a rubric's evidence, one match per rubric at most."],
    snippet_matches: ["snippet matches", "Accepted snippet matches of this search (the judge's quote must appear in the snippet)."],
    level: ["level", "The judge's answer for one rubric on one visit: 0 nothing new, 1 partial new support, 2 new support that settles the rubric."],
    prior_support: ["support points before this visit", "Support points already credited to the rubric in this rollout: the history the visit was judged against."],
    support_track: ["support track", "Support points credited to the rubric in this rollout up to and including the turn above; darker: more (the darkest is the group's longest history)."],
    judgments: ["judgments", "Judge answers this turn's credit rests on (an answer reused from an identical request is marked so)."],
    judge_calls: ["judge calls", "Requests actually sent to the judge (an answer reused from an identical request is not a call)."],
    // ---------------------------------------------------------------- judge usage and cost
    judge_requests: ["judge requests", "HTTP requests sent to the judge, each attempt counted: retries after an unusable answer, calls moved to another endpoint and rate-limited ones too (a reused answer sends none)."],
    prompt_tokens: ["prompt tokens", "Tokens of the requests sent to the judge, as its server counted them, over every attempt; a call cut off by its timeout counts the platform's upper estimate."],
    cached_tokens: ["cached prompt tokens", "The part of the prompt tokens the judge server answered from its prefix cache, where it reports it (usually billed lower)."],
    completion_tokens: ["completion tokens", "Tokens the judge wrote in its answers, over every attempt."],
    cached_share: ["cached share", "Cached prompt tokens divided by prompt tokens: how much of what was sent the judge server did not have to prefill again; – with no prompt tokens."],
    reused: ["reused", "Judgments answered from the tenant's store of earlier answers to the identical request (another group or step asked it before): no request, no tokens, no cost."],
    prompt_layout: ["prompt layout", "The order the judge prompt's parts were sent in (DRCREDIT_JUDGE_PROMPT_LAYOUT); what the judge is told is the same in every layout."],
    judge_time: ["judge time", "Seconds from the judgment's first request to its answer, every attempt counted; of it, the time its requests waited on the service's side for their turn (a place on an endpoint, a rate-limit turn, a connection) before the judge took them."],
    cost: ["cost (USD)", "The tokens at the price set in DRCREDIT_JUDGE_PRICE: uncached prompt tokens × in + cached prompt tokens × cached + completion tokens × out, per million tokens; – when no price is set."],
    answered_by: ["answered by", "The model the judge server said answered and the endpoint that served it (for a reused answer: the call it came from)."],
    judgments_failed: ["failed judgments", "Judgments that still failed after their retries; the turns whose credit depends on them are unscorable."],
    unscorable: ["unscorable turns", "Research turns whose credit depends on a failed judgment (hatched cells); on_judge_failure decides what they get."],
    // ---------------------------------------------------------------- outcome reward
    reward: ["outcome reward", "The rollout's reward for its report: the trainer's own, or with outcome_source judge the service's (select the outcome cell for its parts)."],
    component_rubric: ["rubric (reward component)", "Sum of weight × score / 4 over the rubrics judged (penalties too), divided by the sum of the positive weights."],
    component_format: ["format (reward component)", "Share of four checks passed: two Markdown heading levels; clean citation markup; search and visit calls of 1-2 non-blank queries or URLs (and a goal); reasoning on every turn."],
    component_search: ["search (reward component)", "min(1, searches / search_cap), counting searches without an error that have a query."],
    component_cite: ["cite (reward component)", "0.4 × r_id + 0.6 × r_semantic; 0 for a report without citations."],
    component_length: ["length (reward component)", "min(1, words / length_cap), a citation counting as its text."],
    weight: ["weight", "The component's weight in the reward (the group's outcome_weights)."],
    contribution: ["weight × value", "The component's share of the reward: the five of them sum to the reward."],
    r_id: ["r_id", "Share of the well-formed citation references (letters then digits) that resolve to a usable page of one of the rollout's visits."],
    r_semantic: ["r_semantic", "Mean claim score over the scoreable claims judged; a claim whose call failed is left out."],
    rubric_score: ["rubric score", "The judge's score of the report against one rubric, 0-4 (a satisfied penalty item lowers the reward)."],
    rubric_weight: ["rubric weight", "The rubric's weight: above 0 a rubric to satisfy, 0 or below a penalty item."],
    claim_joint: ["joint score", "One call with all the claim's resolving pages: 0 not supported, 1 partly, 2 every proposition supported."],
    claim_pages: ["page scores", "With several resolving pages, each page judged alone, 0-2."],
    claim_score: ["claim score", "Harmonic mean of joint / 2 and the share of pages scoring at least 1; 0 without a call when no reference resolves or the claim has no letter or digit."],
    // ---------------------------------------------------------------- evidence
    budget: ["budget b", "A number of research turns (search or visit) counted from a rollout's start."],
    cumulative: ["C(b)", "Evidence gathered in the first b research turns: mean over rollouts of the summed uncapped visit credit and snippet credit of those turns (navigation credit left out: it repeats its visits' credit)."],
    rate: ["U(b)", "Evidence per research turn: mean over rollouts of C_i(b) / min(b, T_i), T_i the rollout's research turns."],
    // ---------------------------------------------------------------- tenants
    fleet_share: ["fleet share", "The tenant's part of the judge calls the whole fleet served over the last minute (its share follows its weight while others wait too; alone it may take everything, up to its max_share)."],
    budget_used: ["used", "What the tenant's judge calls used in the budget's current window (UTC day or month): prompt + completion tokens, or their cost at DRCREDIT_JUDGE_PRICE."],
    budget_limit: ["limit", "The budget set in DRCREDIT_TENANTS."],
    budget_left: ["left", "What the budget has left in its window; at 0 new groups are refused (429) or held until the reset (on_budget: wait), while admitted work finishes."],
    budget_resets: ["resets", "When the budget's window ends and its use starts again from 0 (UTC)."],
    tokens_today: ["tokens today", "Prompt plus completion tokens of the tenant's judge calls today (UTC)."],
    // ---------------------------------------------------------------- runs
    last_at: ["last group", "When the run's latest group was posted (UTC)."],
    run_groups: ["groups", "Groups posted under the run's name (metadata.run)."],
    run_steps: ["steps", "Training steps of the run: distinct metadata.step values of its groups."],
    step: ["step", "A training step: the metadata.step of its groups."],
    groups_done: ["groups done", "Groups of the step done, of those posted."],
    trajectories: ["trajectories", "Rollouts of the done groups (per step in the table and charts)."],
    process_calls: ["process calls / trajectory", "Visit and snippet judge calls per trajectory (requests actually sent)."],
    outcome_calls: ["outcome calls / trajectory", "Rubric and citation judge calls per trajectory (groups with outcome_source judge)."],
    latency: ["latency per trajectory", "Seconds from a rollout's arrival to its group's advantages: median (p50), 90th percentile (p90) and maximum."],
    tokens_per_trajectory: ["tokens / trajectory", "Prompt and completion tokens of the judge per trajectory of the step's done groups (the cached part of the prompt tokens apart in the chart)."],
    cost_per_trajectory: ["cost / trajectory", "The judge's cost at DRCREDIT_JUDGE_PRICE per trajectory of the step's done groups; – when no price is set."],
    run_cost: ["cost in all", "What judging every group of the run (or step) cost at DRCREDIT_JUDGE_PRICE, failed groups included; – when no price is set."],
    work_steps: ["steps scored", "Steps of the run with at least one done group: the workload row averages over them."],
    work_trajectories: ["trajectories scored", "Rollouts of the run's done groups."],
    process_tasks: ["process judge tasks / trajectory", "Visit and snippet judgments that made a call of their own, per trajectory of a step, averaged over the steps (retries, reused answers, deterministic zeros and skipped snippet calls are not tasks)."],
    outcome_tasks: ["outcome judge tasks / trajectory", "Rubric and citation judgments that made a call of their own, per trajectory of a step, averaged over the steps."],
    work_latency: ["scoring latency / trajectory", "Mean seconds from a rollout's arrival to its group's advantages over a step's trajectories, averaged over the steps."],
    mean_credit: ["mean credit", "Mean credit of the research turns of the step's done groups."],
    zero_credit: ["zero-credit share", "Share of those research turns whose credit is exactly 0."],
    level_judgments: ["judgments with a level", "The step's judgments of this kind the judge answered (a failed judgment, a visit settled without a call and a skipped snippet call are not counted)."],
    visit_levels_share: ["visit levels", "Share of the step's visit judgments at level 0 (nothing new), 1 (partial new support) and 2 (new support that settles the rubric)."],
    report_scores_share: ["report rubric scores", "Share of the step's report rubric judgments (outcome_source judge) at each score 0 to 4."],
    drift: ["drift", "Total variation distance, 0.5 × the sum over levels of |p − q|, between the step's levels (p) and the run's first three steps' levels pooled (q); none for those steps, in a run of fewer than four steps, or without judgments on either side."],
    drift_flagged: ["drift, flagged", "The step's drift is above the threshold (DRCREDIT_DRIFT_THRESHOLD, or the drift_threshold the page was asked with): its levels moved away from the run's first steps."],
    drift_threshold: ["drift threshold", "A step is flagged when its drift is strictly above this (default 0.15)."],
    advantage_bins: ["turns per A_rg bin", "Research turns of the step whose process advantage A_rg falls in each bin (a bin holds its lower edge)."],
    // ---------------------------------------------------------------- sensitivity
    w1: ["W1", "1-Wasserstein distance between the batch's pooled process advantages under the setting and as scored."],
    rmse: ["RMSE", "Root mean square difference of the process advantages over corresponding turns."],
    process_sign: ["process sign agreement", "Share of turns whose A_rg keeps its sign under the setting (within 1e-6 of zero counts as neutral)."],
    fused_sign: ["fused sign agreement", "Share of turns whose fused advantage keeps its sign under the setting."],
    bound: ["≤ / ≥", "A bound, not an exact figure: the setting needs snippet judgments that were skipped under saturation, so the worse extreme is shown."],
    // ---------------------------------------------------------------- judge audits (docs/audit.md)
    audit_groups: ["groups re-scored", "Done groups of the audit's scope that the audit judge scored again, drawn uniformly without replacement with the seed."],
    audit_seed: ["seed", "The sample's seed: the same scope, sample size and seed draw the same groups."],
    audit_time: ["audit time (UTC)", "When the audit was created, started or finished, in UTC."],
    audit_pairs: ["pairs", "Judgments both judges made at the same key and both answered (a visit: rollout, turn and rubric; a snippet match: search turn and positive rubric; a rubric score: rollout and rubric; a claim: rollout and claim): what the agreement is computed over."],
    audit_left_out: ["left out", "Keys where either judge failed after its retries: not paired. Rule of thumb: more than a few per cent of the pairs means a judge fails often on these requests, and the agreement describes only the rest."],
    audit_exact: ["exact agreement", "Share of the pairs where both judges gave the same value."],
    audit_kappa: ["quadratic-weighted kappa", "1 − Σ w·O / Σ w·E with w = (i − j)² / m²: 1 is full agreement, 0 what chance would give with each judge's own distribution of values, below 0 worse than chance; a disagreement of two steps weighs four times one of one step. – with no pair, or when both judges always gave one and the same value. Rule of thumb: below about 0.6 deserves a look."],
    audit_first_visit: ["first visits", "Visit pairs whose support history was empty for both judges: both were sent the identical request, so disagreement there is the judges' own, not histories that drifted apart. Rule of thumb: much lower than the overall agreement means the judges differ on the pages themselves."],
    audit_confusion: ["confusion count", "Pairs with this row's value from the original judge and this column's value from the audit judge; the diagonal is where they agree."],
    audit_category: ["value", "A judgment's value: a visit level 0-2, a snippet match 0 or 1, a report rubric score 0-4, a claim's joint score 0-2."],
    audit_turns: ["non-final turns compared", "Every turn but a rollout's closing answer, over the audited groups, each with its advantage under both judges."],
    audit_group_turns: ["non-final turns", "Every turn but a rollout's closing answer, in this group, each with its advantage under both judges."],
    audit_w1: ["W1 (audit)", "1-Wasserstein distance between the advantages as the original judge gave them and as the audit judge would, as distributions (process A_rg or fused)."],
    audit_rmse: ["RMSE (audit)", "Root mean square difference of the advantages of corresponding turns under the two judges (process A_rg or fused)."],
    audit_sign: ["sign agreement (audit)", "Share of turns whose advantage has the same sign under both judges (within 1e-6 of zero counts as neutral): whether training would push each turn the same way. Rule of thumb: under about 0.9 for the fused advantage deserves a look."],
    audit_outcome_rmse: ["outcome reward RMSE", "Root mean square difference of the outcome rewards under the two judges over the rollouts both could score; – unless the service judged the outcome (outcome_source judge)."],
    audit_judgments: ["judgments made", "Judgments the audit judge answered with a call of its own (an identical request in a group is asked once)."],
    audit_seconds: ["audit duration", "Seconds from the audit's start to its report."],
    // ---------------------------------------------------------------- bias and people's labels
    audit_bias: ["bias", "Mean over the pairs of (second value − original value), in the kind's own units (levels, matches, scores): above 0 the audit judge (or people) give more than the original judge, below 0 less. A judge that moves its values one way can keep a high kappa; the bias shows the move. – with no pair."],
    audit_marginal: ["share of values", "The share of this side's paired values at this value: each side's own distribution. Two rows far apart at the same kappa mean one side inflates or deflates."],
    audit_labels: ["labels", "Labels this person gave on the audited groups' keys (one per key: a second label of the same key replaced the first)."],
    label_value: ["your label", "The value you gave this judgment, on the kind's own scale."],
    label_judge: ["the judge's answer", "What the original judge answered at this key, shown only once your label is given."],
    label_progress: ["labeled", "Labels given in this session, of the items drawn for it."],
    label_position: ["item", "Where you are in this session's queue: the item shown, of the items drawn so far (more are drawn past the last)."],
    label_skipped: ["skipped", "Items passed over with s in this session, without a label."],
  };

  function explanation(term) {
    if (!TERMS[term]) throw new Error("no glossary entry for " + term);
    return TERMS[term][1];
  }

  /* Marks node as showing the term: a key into the glossary and a tooltip with its
     explanation, after what this one number is (detail) when given. */
  function explain(node, term, detail) {
    node.setAttribute("data-term", term);
    node.setAttribute("title", (detail ? detail + ". " : "") + explanation(term));
    return node;
  }

  /* A number with its term: <span data-term title>text</span>. */
  function num(term, text, attrs) {
    return explain(D.el("span", Object.assign({ class: "num", text: text }, attrs || {})), term);
  }

  /* Text taken verbatim from the documents (ids, claims, quotes): not a number to explain. */
  function verbatim(text, tag) {
    return D.el(tag || "span", { "data-text": "", text: text });
  }

  /* The page's glossary: every term it can show, named and explained. */
  function glossary(terms) {
    // The templates' own numbers (legends, table headings) name their term only.
    document.querySelectorAll("[data-term]:not([title])").forEach((n) => explain(n, n.dataset.term));
    const list = document.getElementById("glossary-list");
    if (!list) return;
    for (const term of terms) {
      list.append(D.el("dt", { "data-term-def": term, text: TERMS[term][0] }),
        D.el("dd", { text: explanation(term) }));
    }
  }

  Object.assign(D, { TERMS: TERMS, explain: explain, explanation: explanation, num: num, verbatim: verbatim,
    glossary: glossary });
})();
