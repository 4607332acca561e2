/* DrCredit viewer, shared part: reading the JSON of the /v1 endpoints (or, in a report,
   the same JSON embedded as window.DRCREDIT_DATA, keyed by the path it came from), the
   reader's API key, DOM and number helpers. Each page's script registers itself in
   DrCredit.pages; the page named by <body data-page> starts once every script is read. */
(function () {
  "use strict";
  const DATA = window.DRCREDIT_DATA || null;
  const body = document.body;
  const KEY = "drcredit-key";

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

  /* A write to the API (POST, DELETE) with the reader's key; the answer's JSON, or null
     for an answer without a body. Errors name what the service refused. */
  async function send(method, path, body) {
    if (DATA) throw new Problem("A report is read-only.");
    const headers = { Accept: "application/json" };
    const key = storedKey();
    if (key) headers.Authorization = "Bearer " + key;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const r = await fetch(path, { method: method, headers: headers, body: body === undefined ? undefined : JSON.stringify(body) });
    if (r.status === 401) throw new Problem("This service needs an API key: enter it above.");
    let doc = null;
    try { doc = await r.json(); } catch (e) { doc = null; }
    if (!r.ok) {
      const detail = doc && doc.detail && doc.detail[0];
      throw new Problem(detail && detail.field ? detail.field + ": " + detail.message
        : (doc && doc.message) || "HTTP " + r.status + " for " + path);
    }
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

  /* A count of tokens or calls, with thousands separators (a mean keeps one decimal). */
  function count(x) {
    if (x === null || x === undefined) return "–";
    return Number(x).toLocaleString("en-US", { maximumFractionDigits: Number.isInteger(x) ? 0 : 1 });
  }

  /* Dollars: cents from $1 up, four significant digits below (a judgment costs fractions of a cent). */
  function usd(x) {
    if (x === null || x === undefined) return "–";
    return "$" + (x >= 1 ? Number(x).toFixed(2) : Number(Number(x).toPrecision(4)).toString());
  }

  /* "1 step", "2 steps": the count and its noun, singular only for exactly one. */
  function plural(n, one, many) { return n + " " + (n === 1 ? one : many || one + "s"); }

  function start() {
    setupKey();
    const page = DrCredit.pages[body.dataset.page];
    if (!page) return;
    page().then(() => body.setAttribute("data-ready", "true")).catch(function (err) {
      showProblem(err);
      body.setAttribute("data-ready", "error");
    });
  }

  window.DrCredit = {
    DATA: DATA, base: body.dataset.base || "/ui", enc: encodeURIComponent, pages: {},
    Problem: Problem, load: load, send: send, showProblem: showProblem, el: el, fmt: fmt, pct: pct, plural: plural,
    count: count, usd: usd,
  };
  // Every script of the page has run by then, inline (report) or by URL (served).
  document.addEventListener("DOMContentLoaded", start);
})();
