"""The labeling page in the browser, driven by the keyboard only: the setup form filled and
sent with keys, 20 labels in a row (digit, then ``n``), the judge's answer never in the page
before the label is given and the stored one after it, ``n`` refused before a label, ``s``
skipping, ``u`` taking the last label back, a second labeler's queue; then the audit of
those labels on the run page, with its bias, marginals and the labelers against each other.

Each test posts groups of a run of its own to the shared service, so that its labels and
audits meet no other test's.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from playwright.sync_api import Browser, Page, expect

from tests.support.builders import answer, group_doc, page, rollout, rubric, visit
from tests.ui.helpers import K1, Service, api, fixed, ready, shot
from tests.ui.test_audits import check_agreement, signed
from tests.ui.test_explanations import assert_all_explained

#: Six groups of three rollouts, each visit judged on two rubrics: 36 visit judgments.
GROUPS = 6


def labeling_run(service: Service) -> str:
    """A run of its own, scored by the marker judge: rollout a's visit has R1 at 2 and R2 at
    1, b's R1 at 1 (R2 0), c's R2 at 2 (R1 0)."""
    run = f"lab-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {K1}"}, timeout=60) as c:
        for k in range(GROUPS):
            doc = group_doc(
                rollout("a", visit(page("W1", f"https://x.org/{k}/a", f"[R1:2:f{k}a] [R2:1:g{k}a]")), answer()),
                rollout("b", visit(page("W1", f"https://x.org/{k}/b", f"[R1:1:f{k}b]")), answer()),
                rollout("c", visit(page("W1", f"https://x.org/{k}/c", f"[R2:2:g{k}c]")), answer()),
                rubrics=[rubric("R1"), rubric("R2")],
                group_id=f"{run}-{k}",
                metadata={"run": run, "step": k},
            )
            assert c.post("/v1/groups", json=doc).status_code == 202
        for k in range(GROUPS):
            assert c.get(f"/v1/groups/{run}-{k}/advantages", params={"wait": 60}).status_code == 200
    return run


def judge_levels(service: Service, run: str) -> dict[tuple[str, str, int, str], int]:
    """The judge's stored level of every visit judgment of the run, from the credits documents."""
    out = {}
    for k in range(GROUPS):
        credits = api(service, f"/v1/groups/{run}-{k}/credits")
        for r in credits["rollouts"]:
            for t in r["turns"]:
                for j in t["judgments"]:
                    if j["kind"] == "visit":
                        out[(f"{run}-{k}", r["id"], t["index"], j["rubric_id"])] = j["level"]
    return out


def keyboard_page(browser: Browser) -> Page:
    """A page whose API key is set before any script runs: no click, no typing for it."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    p = context.new_page()
    p.add_init_script(f"sessionStorage.setItem('drcredit-key', '{K1}')")
    return p


def showing(p: Page) -> dict[str, Any]:
    """The item on the page: its id, key and whether it is labeled."""
    item = p.locator("#item")
    return {"item_id": item.get_attribute("data-item"), "labeled": item.get_attribute("data-labeled")}


def settled(p: Page) -> None:
    """Every key pressed so far has been handled (its request answered)."""
    p.wait_for_function("!document.body.hasAttribute('data-busy')")


def blind(p: Page, judged: dict[tuple[str, str, int, str], int]) -> None:
    """Nothing of the judge's answer is in the document before the label."""
    assert p.locator("#verdict").inner_html() == ""
    assert p.locator("[data-judge-value]").count() == 0
    html = p.content()
    assert "data-judge-value" not in html and "Its rationale" not in html and "The judge said" not in html


def key_of(item_id: str, service: Service, labeler: str) -> tuple[str, str, int, str]:
    labels = api(service, f"/v1/labels?labeler={labeler}")["labels"]
    found = next(x for x in labels if x["item_id"] == item_id)
    k = found["key"]
    return (found["group_id"], k["rollout_id"], k["turn_index"], k["rubric_id"])


def test_twenty_labels_in_a_row_by_keyboard_blind_with_skip_and_undo(service: Service, browser: Browser) -> None:
    run = labeling_run(service)
    judged = judge_levels(service, run)
    assert len(judged) == GROUPS * 6
    p = keyboard_page(browser)
    try:
        # The setup form, by keys: the name field has the focus; Tab to the run; Enter sends.
        p.goto(service.url + "/ui/labels")
        ready(p)
        expect(p.locator("#labeler")).to_be_focused()
        p.keyboard.type("ann")
        p.keyboard.press("Tab")
        p.keyboard.type(run)
        p.keyboard.press("Enter")
        p.wait_for_url(f"**/ui/labels?labeler=ann&run={run}**")
        ready(p)
        expect(p.locator("#item")).to_be_focused()
        expect(p.locator("#progress")).to_contain_text("Labeled 0 · item 1 of 20 · labeler ann")
        given: dict[str, int] = {}
        for k in range(20):
            now = showing(p)
            assert now["labeled"] == "false" and now["item_id"] not in given
            blind(p, judged)
            expect(p.locator("#shown")).to_contain_text("Support already credited")
            value = k % 3
            p.keyboard.press(str(value))
            settled(p)
            expect(p.locator("#item")).to_have_attribute("data-labeled", "true")
            key = key_of(now["item_id"], service, "ann")
            judge = p.locator("[data-judge-value]")
            # The answer shown is the stored judgment's, once the label is given.
            expect(judge).to_have_attribute("data-judge-value", str(judged[key]))
            expect(p.locator("[data-label-value]")).to_have_attribute("data-label-value", str(value))
            given[now["item_id"]] = value
            if k == 0:
                shot(p, "labels-revealed")
                assert_all_explained(p, "labeling, a label given")
            p.keyboard.press("n")
            settled(p)
        assert {x["item_id"]: x["value"] for x in api(service, "/v1/labels?labeler=ann")["labels"]} == given
        # Twenty drawn, twenty labeled: n brought more from the queue (none labeled before).
        after = showing(p)
        assert after["labeled"] == "false" and after["item_id"] not in given
        expect(p.locator("#progress")).to_contain_text("Labeled 20 · item 21 of 36")
        # n before a label is refused, with what to do.
        p.keyboard.press("n")
        settled(p)
        expect(p.locator("#hint")).to_contain_text("Give a label first")
        assert showing(p)["item_id"] == after["item_id"]
        # Undo right after a label: the label is gone, the item blind again.
        p.keyboard.press("2")
        settled(p)
        assert len(api(service, "/v1/labels?labeler=ann")["labels"]) == 21
        p.keyboard.press("u")
        settled(p)
        assert showing(p) == {"item_id": after["item_id"], "labeled": "false"}
        blind(p, judged)
        assert len(api(service, "/v1/labels?labeler=ann")["labels"]) == 20
        # Undo after moving on: back to the item labeled last, its label taken back.
        p.keyboard.press("1")
        p.keyboard.press("n")
        settled(p)
        moved_to = showing(p)["item_id"]
        assert moved_to != after["item_id"]
        p.keyboard.press("u")
        settled(p)
        assert showing(p) == {"item_id": after["item_id"], "labeled": "false"}
        assert after["item_id"] not in {x["item_id"] for x in api(service, "/v1/labels?labeler=ann")["labels"]}
        # s skips without a label.
        p.keyboard.press("s")
        settled(p)
        assert showing(p)["item_id"] == moved_to
        expect(p.locator("#progress")).to_contain_text("skipped 1")
        assert_all_explained(p, "labeling, an item skipped")
        assert len(api(service, "/v1/labels?labeler=ann")["labels"]) == 20
        # A digit outside the kind's scale is refused by the page.
        p.keyboard.press("7")
        settled(p)
        expect(p.locator("#hint")).to_contain_text("A visit level is 0 to 2")
        assert showing(p)["labeled"] == "false"

        # Another labeler's queue: none of ann's labels is left out of it.
        p.goto(service.url + f"/ui/labels?run={run}&kind=visit&labeler=ben&n=36")
        ready(p)
        expect(p.locator("#progress")).to_contain_text("Labeled 0 · item 1 of 36 · labeler ben")
        ann_queue = api(service, f"/v1/labels/queue?run={run}&kind=visit&labeler=ann&n=100")
        assert ann_queue["available"] == 16 and not set(given) & {i["item_id"] for i in ann_queue["items"]}
        ben_items = []
        for _ in range(4):
            ben_items.append(showing(p)["item_id"])
            blind(p, judged)
            p.keyboard.press("2")
            p.keyboard.press("n")
            settled(p)
        assert {x["item_id"] for x in api(service, "/v1/labels?labeler=ben")["labels"]} == set(ben_items)
    finally:
        p.context.close()

    # The audit against these labels on the run page: bias, marginals, the labelers.
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {K1}"}, timeout=60) as c:
        r = c.post("/v1/audits", json={"judge": "human", "scope": {"run": run}})
        assert r.status_code == 202, r.text
        doc = c.get(f"/v1/audits/{r.json()['audit_id']}").json()
    visit = doc["agreement"]["visit"]
    assert visit["pairs"] == len(set(given) | set(ben_items))
    q = keyboard_page(browser)
    try:
        q.goto(service.url + f"/ui/runs/{run}")
        ready(q)
        article = q.locator(f'article[data-audit="{doc["audit_id"]}"]')
        expect(article.locator(".audit-title")).to_contain_text("against people's labels")
        check_agreement(article, doc)
        expect(article.locator(".audit-labelers")).to_contain_text("Labels by: ann 20, ben 4")
        both = [p for p in doc["labelers"]["pairs"] if p["agreement"]["visit"]["pairs"]]
        rows = article.locator(".audit-labeler-pairs tbody tr")
        expect(rows).to_have_count(len(both))
        for k, pair in enumerate(both):
            figures = pair["agreement"]["visit"]
            assert rows.nth(k).locator("td").all_inner_texts()[2:] == [
                str(figures["pairs"]),
                f"{fixed(100 * figures['exact'], 1)}%",
                "–" if figures["kappa"] is None else f"{fixed(figures['kappa'], 3)}",
                signed(figures["bias"]),
            ]
        expect(article.locator(".audit-no-effect")).to_be_visible()
        assert_all_explained(q, "run page, an audit against people")
        expect(article.locator(".audit-effect")).to_have_count(0)
        shot(q, "labels-audit")
    finally:
        q.context.close()


def test_a_link_with_a_run_fills_the_form_and_warns_only_when_starting_incomplete(
    service: Service, browser: Browser
) -> None:
    p = keyboard_page(browser)
    try:
        # A link naming a run: the form shows it, the name field waits, and nothing warns.
        p.goto(service.url + "/ui/labels?run=demo")
        ready(p)
        expect(p.locator("#scope-run")).to_have_value("demo")
        expect(p.locator("#labeler")).to_be_focused()
        expect(p.locator("#problem")).to_be_hidden()
        # Starting with a name but two scopes: the page stays and says what it needs.
        p.keyboard.type("ann")
        p.fill("#scope-batch", "b1")
        p.keyboard.press("Enter")
        expect(p.locator("#problem")).to_have_text("Name yourself and give exactly one of a run, a batch or groups.")
        assert "labeler=ann" not in p.url
        # With one scope it starts (the URL carries the form).
        p.fill("#scope-batch", "")
        p.focus("#labeler")
        p.keyboard.press("Enter")
        p.wait_for_url("**/ui/labels?labeler=ann&run=demo**")
    finally:
        p.context.close()
