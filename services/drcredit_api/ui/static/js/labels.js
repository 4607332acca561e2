/* The labeling page: a labeler's queue of the judge's judgments (GET /v1/labels/queue),
   one at a time, with what the judge saw and never its answer. A digit gives a label
   (POST /v1/labels); only its answer brings the judge's own, shown after the label. n goes
   to the next item, s skips one, u takes back the last label (DELETE /v1/labels/{item})
   and returns to it. Keys are handled one after another, each after the request of the
   one before has been answered. The wording follows docs/audit.md. */
(function () {
  "use strict";
  const D = window.DrCredit;
  const el = D.el;

  /* Each kind's scale: what each value means (the judges' own scales). */
  const SCALES = {
    visit: ["nothing new", "partial new support", "new support that settles the rubric"],
    snippet: ["no match for this rubric", "a snippet matches this rubric"],
    report_rubric: ["not addressed, or only the topic", "touched on, vague or mostly wrong", "partly satisfied",
      "largely satisfied", "fully and precisely satisfied"],
    citation: ["no material proposition supported", "some, not all, supported", "every material proposition supported"],
  };
  const NAMES = { visit: "visit level", snippet: "snippet match", report_rubric: "report rubric score",
    citation: "citation joint score" };

  const state = {
    params: null, items: [], at: 0, seen: new Set(), labeled: new Map(), undo: [], skipped: 0, done: false,
  };

  function hint(text) {
    const p = document.getElementById("hint");
    p.textContent = text || "";
    p.hidden = !text;
  }

  function where(item) {
    const k = item.key;
    const parts = ["group " + item.group_id, "rollout " + k.rollout_id];
    if (k.turn_index !== undefined) parts.push("turn " + k.turn_index);
    if (k.rubric_id !== undefined) parts.push("rubric " + k.rubric_id);
    if (k.claim !== undefined) parts.push("claim " + k.claim);
    return parts.join(" · ");
  }

  function text(value, tag) { return el(tag || "div", { class: "text", "data-text": "", text: value || "" }); }

  function rubricPart(r) {
    const out = [el("h3", {}, ["Rubric ", D.verbatim(r.id), r.type ? " (" + r.type + ")" : ""]), text(r.description, "p")];
    if (r.reference_facts && r.reference_facts.length) {
      out.push(el("h3", { text: "Reference facts" }), el("ul", {}, r.reference_facts.map((f) => el("li", { "data-text": "", text: f }))));
    }
    return out;
  }

  /* What the judge saw, by kind (the same fields its prompt carried). */
  function shownPart(kind, s) {
    const out = [];
    if (s.question !== undefined) out.push(el("h3", { text: "Question" }), text(s.question, "p"));
    if (s.rubric) out.push(...rubricPart(s.rubric));
    if (kind === "visit") {
      const history = s.support_already_credited || [];
      out.push(el("h3", { text: "Support already credited for this rubric" }),
        history.length ? el("ol", { class: "history" }, history.map((p) => el("li", { "data-text": "", text: p })))
          : el("p", { class: "muted", text: "none yet: a first visit" }));
      const v = s.visit;
      out.push(el("h3", { text: "The visit" }), el("p", {}, ["Goal: ", D.verbatim(v.goal)]),
        el("p", { class: "muted" }, ["Reasoning: ", D.verbatim(v.reasoning)]));
      for (const page of v.pages) {
        out.push(el("section", { class: "page" }, [el("h3", {}, ["Page ", D.verbatim(page.id), " · ", D.verbatim(page.url)]),
          text(page.evidence), el("p", { class: "muted" }, ["Summary: ", D.verbatim(page.summary)])]));
      }
    } else if (kind === "snippet") {
      out.push(el("h3", { text: "Unopened results" }),
        el("ol", {}, s.snippets.map((r) => el("li", {}, [el("strong", { "data-text": "", text: r.id + ": " }), D.verbatim(r.snippet)]))));
    } else if (kind === "report_rubric") {
      out.push(el("h3", { text: "The report" }), text(s.report));
    } else if (kind === "citation") {
      out.push(el("h3", { text: "Claim" }), text(s.claim, "p"), el("h3", { text: "Cited pages" }));
      for (const page of s.pages) out.push(el("section", { class: "page" }, [el("p", {}, [D.verbatim(page.url)]), text(page.evidence)]));
    }
    return out;
  }

  function current() { return state.items[state.at] || null; }

  function progress() {
    const p = document.getElementById("progress");
    const item = current();
    p.replaceChildren(D.num("label_progress", "Labeled " + state.labeled.size), " · ",
      item ? D.num("label_position", "item " + (state.at + 1) + " of " + state.items.length) : "no item left",
      " · labeler ",
      el("strong", { "data-text": "", text: state.params.labeler }),
      ...(state.skipped ? [" · ", D.num("label_skipped", "skipped " + state.skipped)] : []));
  }

  /* The judge's answer, once the label is given. */
  function verdict(item, given) {
    const box = document.getElementById("verdict");
    box.replaceChildren();
    if (!given) return;
    const scale = SCALES[item.kind];
    const judge = given.judge || {};
    const same = judge.value === given.value;
    const parts = [el("p", {}, [D.num("label_value", "Your label: " + given.value + " (" + scale[given.value] + ")",
      { "data-label-value": String(given.value) })])];
    const said = judge.status === "ok"
      ? "The judge said: " + judge.value + " (" + scale[judge.value] + ")" : "The judge's call failed";
    parts.push(el("p", {}, [D.num("label_judge", said, { "data-judge-value": String(judge.value) }),
      el("span", { class: same ? "same" : "differs", text: same ? " · the same" : " · different" })]));
    if (judge.rationale) parts.push(el("p", { class: "muted" }, ["Its rationale: ", D.verbatim(judge.rationale)]));
    if (judge.support_points && judge.support_points.length) {
      parts.push(el("p", { class: "muted" }, ["Its support points: ", D.verbatim(judge.support_points.join("; "))]));
    }
    parts.push(el("p", { class: "muted", text: "n: next item · a digit: change your label · u: undo it" }));
    box.append(...parts);
  }

  function render() {
    const item = current();
    hint("");
    progress();
    document.getElementById("labeling").hidden = !item;
    const end = document.getElementById("queue-end");
    end.hidden = !!item;
    if (!item) {
      end.textContent = "Nothing left to label in this scope for " + state.params.labeler +
        (state.skipped ? " (skipped items come back on the next visit of this page)." : ".");
      return;
    }
    const scale = SCALES[item.kind];
    const given = state.labeled.get(item.item_id);
    const digits = document.getElementById("digits-key");
    digits.textContent = "0–" + (scale.length - 1);
    digits.setAttribute("title", "The keys 0 to " + (scale.length - 1) + ": the value of your label, as on the buttons below.");
    document.getElementById("item-title").replaceChildren(NAMES[item.kind] + " · ", D.verbatim(where(item)));
    const article = document.getElementById("item");
    article.setAttribute("data-item", item.item_id);
    article.setAttribute("data-kind", item.kind);
    article.setAttribute("data-labeled", given ? "true" : "false");
    document.getElementById("scale").replaceChildren(...scale.map((meaning, value) => {
      const b = el("button", { type: "button", "data-value": String(value), title: "Label " + value + ": " + meaning,
        "aria-pressed": given && given.value === value ? "true" : "false" }, [el("kbd", { text: String(value) }), " " + meaning]);
      b.addEventListener("click", () => enqueue(() => label(value)));
      return b;
    }));
    verdict(item, given);
    document.getElementById("shown").replaceChildren(...shownPart(item.kind, item.shown));
  }

  function queuePath() {
    const p = state.params;
    // Skipped items stay in the server's sample: ask for as many more.
    const n = Math.min(500, Number(p.n) + state.skipped);
    const q = new URLSearchParams({ labeler: p.labeler, n: String(n), seed: p.seed });
    if (p.kind) q.set("kind", p.kind);
    for (const name of ["run", "batch_id", "group_ids"]) if (p[name]) q.set(name, p[name]);
    return "/v1/labels/queue?" + q.toString();
  }

  /* More items once the drawn ones are used up: those not labeled or seen yet. */
  async function refill() {
    const doc = await D.load(queuePath());
    const fresh = doc.items.filter((i) => !state.seen.has(i.item_id));
    for (const i of fresh) state.seen.add(i.item_id);
    state.items = state.items.concat(fresh);
    return fresh.length;
  }

  async function label(value) {
    const item = current();
    if (!item) return;
    const top = SCALES[item.kind].length - 1;
    if (value > top) { hint("A " + NAMES[item.kind] + " is 0 to " + top + "."); return; }
    const given = await D.send("POST", "/v1/labels", { item_id: item.item_id, value: value, labeler: state.params.labeler });
    state.labeled.set(item.item_id, given);
    state.undo = state.undo.filter((id) => id !== item.item_id).concat([item.item_id]);
    render();
  }

  async function next(skipping) {
    const item = current();
    if (!item) return;
    if (!skipping && !state.labeled.has(item.item_id)) {
      hint("Give a label first (0–" + (SCALES[item.kind].length - 1) + "), or s to skip this one.");
      return;
    }
    if (skipping && !state.labeled.has(item.item_id)) state.skipped += 1;
    state.at += 1;
    if (state.at >= state.items.length) await refill();
    render();
  }

  async function undo() {
    const id = state.undo.pop();
    if (!id) { hint("Nothing to undo."); return; }
    await D.send("DELETE", "/v1/labels/" + D.enc(id) + "?labeler=" + D.enc(state.params.labeler));
    state.labeled.delete(id);
    state.at = state.items.findIndex((i) => i.item_id === id);
    render();
  }

  /* Keys and clicks run one at a time, in the order given. */
  let chain = Promise.resolve();
  function enqueue(action) {
    const body = document.body;
    body.setAttribute("data-busy", "true");
    chain = chain.then(action).catch((err) => hint(err instanceof D.Problem ? err.message : String(err)))
      .then(() => { if (chain === pending) body.removeAttribute("data-busy"); });
    const pending = chain;
  }

  function onKey(ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const target = ev.target;
    if (target && (target.tagName === "INPUT" || target.tagName === "SELECT" || target.tagName === "TEXTAREA")) return;
    const key = ev.key;
    if (/^[0-9]$/.test(key)) { ev.preventDefault(); enqueue(() => label(Number(key))); }
    else if (key === "n") { ev.preventDefault(); enqueue(() => next(false)); }
    else if (key === "s") { ev.preventDefault(); enqueue(() => next(true)); }
    else if (key === "u") { ev.preventDefault(); enqueue(() => undo()); }
  }

  function readParams() {
    const q = new URLSearchParams(location.search);
    const p = {};
    for (const name of ["labeler", "run", "batch_id", "group_ids", "kind", "n", "seed"]) {
      const v = (q.get(name) || "").trim();
      if (v) p[name] = v;
    }
    if (!q.has("kind")) p.kind = "visit";
    p.n = p.n || "20";
    p.seed = p.seed || "0";
    // The form shows what was asked.
    const fields = { labeler: "labeler", run: "scope-run", batch_id: "scope-batch", group_ids: "scope-groups",
      kind: "kind", n: "count", seed: "seed" };
    for (const [name, id] of Object.entries(fields)) if (p[name] !== undefined) document.getElementById(id).value = p[name];
    if (q.has("kind") && !p.kind) document.getElementById("kind").value = "";
    return p;
  }

  const INCOMPLETE = "Name yourself and give exactly one of a run, a batch or groups.";

  function scopesOf(p) { return ["run", "batch_id", "group_ids"].filter((name) => p[name]); }

  /* The setup form warns only when the user tries to start without a name or with other
     than one scope; a link that fills in part of it (a run) only fills the form. */
  function guardSetup() {
    const form = document.getElementById("label-setup");
    form.addEventListener("submit", (ev) => {
      const p = {};
      for (const [name, value] of new FormData(form)) if (String(value).trim()) p[name] = String(value).trim();
      if (p.labeler && scopesOf(p).length === 1) return;
      ev.preventDefault();
      D.showProblem(new D.Problem(INCOMPLETE));
    });
  }

  async function labelsPage() {
    D.glossary(["label_progress", "label_position", "label_skipped", "label_value", "label_judge"]);
    guardSetup();
    const p = readParams();
    if (!p.labeler || scopesOf(p).length !== 1) {
      document.getElementById(p.labeler ? "scope-run" : "labeler").focus();
      return;
    }
    state.params = p;
    await refill();
    render();
    document.addEventListener("keydown", onKey);
    document.getElementById("item").focus();
  }

  D.pages.labels = labelsPage;
})();
