/* The index page: the tenant's runs, and a box to open any group by id. */
(function () {
  "use strict";
  const D = window.DrCredit;
  const el = D.el;

  async function indexPage() {
    const doc = await D.load("/v1/runs");
    const tbody = document.querySelector("#runs tbody");
    for (const run of doc.runs) {
      tbody.append(el("tr", {}, [
        el("td", {}, [el("a", { href: D.base + "/runs/" + D.enc(run.run), "data-text": "", text: run.run })]),
        D.explain(el("td", { text: run.groups }), "run_groups"), D.explain(el("td", { text: run.steps }), "run_steps"),
        D.explain(el("td", { text: run.last_at }), "last_at"),
      ]));
    }
    if (!doc.runs.length) tbody.append(el("tr", {}, [el("td", { colspan: 4, text: "no runs yet" })]));
    document.getElementById("open-group").addEventListener("submit", function (ev) {
      ev.preventDefault();
      location.href = D.base + "/groups/" + D.enc(document.getElementById("group-id").value.trim());
    });
    D.glossary(["run_groups", "run_steps", "last_at"]);
  }

  D.pages.index = indexPage;
})();
