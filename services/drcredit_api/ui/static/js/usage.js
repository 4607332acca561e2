/* The usage page: the key's tenant's judge usage today and this month, its share of the
   fleet and its budgets; with the operator's key, every tenant's (GET /v1/usage/tenants). */
(function () {
  "use strict";
  const D = window.DrCredit;
  const el = D.el;

  const BUDGET_NAMES = {
    tokens_per_day: "tokens per day", tokens_per_month: "tokens per month",
    usd_per_day: "USD per day", usd_per_month: "USD per month",
  };

  function amount(budget, x) { return budget.startsWith("usd") ? D.usd(x) : D.count(x); }

  function budgetSummary(doc) {
    const names = Object.keys(doc.budgets);
    if (!names.length) return "none";
    return names.map((b) => BUDGET_NAMES[b] + ": " + amount(b, doc.budgets[b].left) + " left").join("; ");
  }

  function ownUsage(doc) {
    document.getElementById("tenant-name").textContent = doc.tenant;
    document.getElementById("own-share").append(D.num("fleet_share", D.pct(doc.share_last_minute)));
    const tbody = document.querySelector("#own-usage tbody");
    for (const [label, u] of [["today", doc.day], ["this month", doc.month]]) {
      tbody.append(el("tr", { "data-window": label === "today" ? "day" : "month" }, [
        el("th", { scope: "row", text: label }),
        el("td", {}, [D.num("judge_requests", D.count(u.calls), { "data-value": u.calls })]),
        el("td", {}, [D.num("prompt_tokens", D.count(u.prompt_tokens), { "data-value": u.prompt_tokens })]),
        el("td", {}, [D.num("completion_tokens", D.count(u.completion_tokens), { "data-value": u.completion_tokens })]),
        el("td", {}, [D.num("cost", D.usd(u.cost_usd))]),
      ]));
    }
    const budgets = document.querySelector("#own-budgets tbody");
    for (const [name, b] of Object.entries(doc.budgets)) {
      const row = el("tr", { "data-budget": name, class: b.left <= 0 ? "spent" : null }, [
        el("th", { scope: "row", text: BUDGET_NAMES[name] }),
        el("td", {}, [D.num("budget_used", amount(name, b.used), { "data-value": b.used })]),
        el("td", {}, [D.num("budget_limit", amount(name, b.limit), { "data-value": b.limit })]),
        el("td", {}, [D.num("budget_left", amount(name, b.left), { "data-value": b.left })]),
        el("td", {}, [D.num("budget_resets", b.resets_at.replace("+00:00", " UTC").replace("T", " "))]),
      ]);
      budgets.append(row);
    }
    if (!Object.keys(doc.budgets).length) budgets.append(el("tr", {}, [el("td", { colspan: 5, text: "no budget set" })]));
  }

  async function operatorUsage() {
    let doc;
    try {
      doc = await D.load("/v1/usage/tenants");
    } catch (err) {
      return false;  // not the operator's key: only its own tenant
    }
    document.getElementById("operator").hidden = false;
    const tbody = document.querySelector("#all-usage tbody");
    for (const t of doc.tenants) {
      tbody.append(el("tr", { "data-tenant": t.tenant }, [
        el("th", { scope: "row" }, [D.verbatim(t.tenant)]),
        el("td", {}, [D.num("judge_requests", D.count(t.day.calls), { "data-value": t.day.calls })]),
        el("td", {}, [D.num("tokens_today", D.count(t.day.prompt_tokens + t.day.completion_tokens),
          { "data-value": t.day.prompt_tokens + t.day.completion_tokens })]),
        el("td", {}, [D.num("cost", D.usd(t.day.cost_usd))]),
        el("td", {}, [D.num("cost", D.usd(t.month.cost_usd))]),
        el("td", {}, [D.num("fleet_share", D.pct(t.share_last_minute))]),
        el("td", {}, [D.num("budget_left", budgetSummary(t))]),
      ]));
    }
    return true;
  }

  async function usagePage() {
    const own = await D.load("/v1/usage");
    ownUsage(own);
    const operator = own.operator ? await operatorUsage() : false;  // no request a tenant's key is refused
    const terms = ["judge_requests", "prompt_tokens", "completion_tokens", "cost", "fleet_share",
      "budget_used", "budget_limit", "budget_left", "budget_resets"];
    D.glossary(operator ? terms.concat(["tokens_today"]) : terms);
  }

  D.pages.usage = usagePage;
})();
