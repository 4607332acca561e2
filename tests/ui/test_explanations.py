"""The viewer explains every number it shows: the outcome cell breaks the judged reward
into its five weighted components (hand-worked in ``scenarios.py``), r_id and r_semantic
with what they measure, each rubric score and each claim; and no number on any page is
left without a tooltip naming what it is, backed by the page's glossary."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.ui.helpers import Service, api, fixed, open_page, shot
from tests.ui.scenarios import JUDGED_PARTS, JUDGED_REWARDS, WEIGHTS

COMPONENTS = ("rubric", "format", "search", "cite", "length")

#: Text nodes with a digit that neither carry an explanation (an element with a title
#: around them) nor are text quoted from the documents (ids, claims, quotes: data-text),
#: literal names (code) or explanations themselves (chart captions, the glossary).
UNEXPLAINED = """() => {
  const bad = [];
  const walk = document.createTreeWalker(document.getElementById("main"), NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const host = n.parentElement;
    const skip = "[data-text], code, figcaption, .glossary, .js-plotly-plot, [hidden]";
    if (!/[0-9]/.test(n.textContent) || host.closest(skip)) continue;
    const titled = host.closest("[title]");
    if (!titled || !titled.getAttribute("title").trim()) bad.push(n.textContent.trim());
  }
  return bad;
}"""

#: Every term a number names: its tooltip, and whether the glossary defines it.
TERMS = """() => Array.from(document.querySelectorAll("#main [data-term]")).map((n) => {
  const dt = document.querySelector('#glossary-list dt[data-term-def="' + n.dataset.term + '"]');
  return [n.dataset.term, n.getAttribute("title"), dt ? dt.nextElementSibling.textContent : null];
})"""


def assert_all_explained(page: Page, where: str) -> None:
    assert page.evaluate(UNEXPLAINED) == [], where
    terms = page.evaluate(TERMS)
    assert terms, where
    for term, title, definition in terms:
        assert definition, f"{where}: {term} is not in the glossary"
        assert title.endswith(definition), f"{where}: the tooltip of {term} is not its glossary entry"


def test_the_outcome_cell_breaks_the_reward_into_its_parts(service: Service, page: Page) -> None:
    open_page(page, service, "/ui/groups/judged")
    credits = api(service, "/v1/groups/judged/credits")
    outcomes = {r["id"]: r["outcome"] for r in credits["rollouts"]}
    assert credits["params"]["outcome_weights"] == WEIGHTS
    details = page.locator("#details")
    for rollout, parts in JUDGED_PARTS.items():
        doc = outcomes[rollout]
        assert doc["reward"] == pytest.approx(JUDGED_REWARDS[rollout])
        page.click(f'.cell.outcome[data-rollout="{rollout}"]')
        contributions = []
        for k in COMPONENTS:
            assert doc["components"][k] == pytest.approx(parts[k])
            row = details.locator(f'tr[data-component="{k}"]')
            value, weight, part = (row.locator("td").nth(i) for i in range(3))
            # the numbers shown are the document's, to 4 places, and carry its exact value
            expect(value).to_have_text(f"{fixed(doc['components'][k], 4)}")
            assert float(value.locator("span").get_attribute("data-value") or "nan") == doc["components"][k]
            expect(weight).to_have_text(f"{fixed(WEIGHTS[k], 2)}")
            contribution = float(part.locator("span").get_attribute("data-value") or "nan")
            assert contribution == pytest.approx(WEIGHTS[k] * parts[k])
            expect(part).to_have_text(f"{fixed(WEIGHTS[k] * doc['components'][k], 4)}")
            contributions.append(contribution)
        assert sum(contributions) == pytest.approx(doc["reward"], abs=1e-12)
        expect(details.locator(".reward-parts tfoot td")).to_have_text(f"{fixed(doc['reward'], 4)}")
        for name in ("r_id", "r_semantic"):
            line = details.locator(f'[data-part="{name}"]')
            assert doc[name] == pytest.approx(parts[name])
            expect(line).to_contain_text(f"{name} {fixed(doc[name], 4)}")
            expect(line.locator(".why")).not_to_be_empty()
        cite = f"cite {fixed(doc['components']['cite'], 4)} = 0.4 × {fixed(doc['r_id'], 4)} + 0.6 × {fixed(doc['r_semantic'], 4)}"
        expect(details.locator('[data-part="cite"]')).to_have_text(cite)
    # a: each rubric weighted (R1 2 x 4/4, R2 1 x 2/4, the penalty P -1 x 0/4) over the positive weights 3
    page.click('.cell.outcome[data-rollout="a"]')
    rows = details.locator(".rubric-scores tbody tr")
    assert [rows.nth(i).locator("th, td").all_inner_texts() for i in range(rows.count())] == [
        ["R1", "2.00", "4", "2.0000"],
        ["R2", "1.00", "2", "0.5000"],
        ["P", "-1.00", "0", "0.0000"],
    ]
    expect(details.locator(".rubric-scores tfoot")).to_have_text(
        "rubric = 2.5000 ÷ 3.00 (the positive weights) = 0.8333"
    )
    claims = details.locator(".claims li")
    expect(claims).to_have_count(2)
    expect(claims.nth(0)).to_contain_text("opened in 2019")
    expect(claims.nth(0)).to_contain_text("joint 2 · score 1.0000")
    expect(claims.nth(1)).to_contain_text("joint 2 · pages W1 2, W2 0 · score 0.6667")
    shot(page, "group-judged-outcome")
    # b: the claim citing a page it never visited scores 0 without a call, and says why
    page.click('.cell.outcome[data-rollout="b"]')
    expect(claims).to_have_count(1)
    expect(claims.nth(0)).to_contain_text("scored 0 without a call")
    # c: no report, no parts but the zeros; g1: the trainer's reward has no breakdown
    page.click('.cell.outcome[data-rollout="c"]')
    expect(details.locator(".rubric-scores")).to_have_count(0)
    expect(details).to_contain_text("none: no report")
    open_page(page, service, "/ui/groups/g1")
    page.click('.cell.outcome[data-rollout="a"]')
    expect(page.locator("#details")).to_contain_text("The trainer's own reward")


def test_every_number_on_every_page_is_explained(service: Service, page: Page) -> None:
    open_page(page, service, "/ui/groups/judged")
    assert_all_explained(page, "group")
    for cell in (
        '.cell.outcome[data-rollout="a"]',
        '.cell[data-rollout="a"][data-turn="0"]',
        '.cell[data-rollout="a"][data-turn="1"]',
        '.cell[data-rollout="a"][data-turn="3"]',
    ):
        page.click(cell)
        assert_all_explained(page, f"group, {cell} selected")
    open_page(page, service, "/ui/groups/g1")
    page.click('.cell[data-rollout="a"][data-turn="0"]')
    assert_all_explained(page, "group g1, a search selected")
    for run in ("exp", "solo", "drifting"):
        open_page(page, service, f"/ui/runs/{run}")
        assert_all_explained(page, f"run {run}")
    open_page(page, service, "/ui")
    assert_all_explained(page, "runs")
