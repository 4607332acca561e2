"""The credit viewer in a real browser (Debian's headless Chromium driven by Playwright),
against a running service on Postgres with scored groups (``conftest.py``): every number a
page shows is checked against what the JSON endpoints answer. Screenshots go to
``test-artifacts/``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.ui.helpers import K1, K2, Service, api, fixed, open_page, ready, shot, use_key


def test_group_page_shows_the_documents_values(service: Service, page: Page) -> None:
    use_key(page, service.url, K1)
    page.goto(service.url + "/ui/groups/g1")
    ready(page)
    adv = api(service, "/v1/groups/g1/advantages")
    credits = api(service, "/v1/groups/g1/credits")
    for ra, rc in zip(adv["rollouts"], credits["rollouts"], strict=True):
        outcome = page.locator(f'.cell.outcome[data-rollout="{ra["id"]}"]')
        assert float(outcome.get_attribute("data-advantage") or "nan") == pytest.approx(ra["outcome_advantage"])
        for t in ra["turns"]:
            cell = page.locator(f'.cell[data-rollout="{ra["id"]}"][data-turn="{t["index"]}"]')
            assert float(cell.get_attribute("data-advantage") or "nan") == pytest.approx(t["advantage"])
            assert fixed(t["advantage"], 2) in cell.inner_text()
        # one track per positive rubric (R1, R2; not the penalty P), darkening with the history
        for rubric in ("R1", "R2"):
            points = rc["support_histories"].get(rubric, [])
            ticks = page.locator(f'.track[data-rollout="{ra["id"]}"][data-rubric="{rubric}"] .tick')
            assert ticks.count() == len(ra["turns"])
            for t in ra["turns"]:
                want = sum(1 for p in points if p["turn_index"] <= t["index"])
                assert ticks.nth(t["index"]).get_attribute("data-support") == str(want)
        assert page.locator(f'.track[data-rollout="{ra["id"]}"][data-rubric="P"]').count() == 0
    # rollout a, turn 1: the visit judged R1 level 2 and R2 level 1 (tests/support/scenarios.py)
    page.click('.cell[data-rollout="a"][data-turn="1"]')
    details = page.locator("#details")
    visit = credits["rollouts"][0]["turns"][1]["judgments"]
    for j in visit:
        expect(details).to_contain_text(f"rubric {j['rubric_id']} · level {j['level']}")
        for point in j["support_points"]:
            expect(details).to_contain_text(point)
    # rollout a, turn 0: the search's accepted snippet match with its quote
    page.click('.cell[data-rollout="a"][data-turn="0"]')
    snippet = next(j for j in credits["rollouts"][0]["turns"][0]["judgments"] if j["kind"] == "snippet")
    expect(details).to_contain_text(snippet["matches"][0]["evidence_quote"])
    # the evidence chart plots the evidence endpoint's C(b) and U(b)
    evidence = api(service, "/v1/groups/g1/evidence")["points"]
    traces = page.evaluate("() => document.getElementById('evidence-chart').data.map(t => [t.x, t.y])")
    assert traces[0] == [[p["budget"] for p in evidence], [p["cumulative"] for p in evidence]]
    assert traces[1][1] == [p["rate"] for p in evidence]
    shot(page, "group-g1")


def test_group_page_is_keyboard_navigable(service: Service, page: Page) -> None:
    use_key(page, service.url, K1)
    page.goto(service.url + "/ui/groups/g1")
    ready(page)
    page.focus('.cell[data-rollout="a"][data-kind="outcome"]')
    page.keyboard.press("ArrowRight")
    assert page.evaluate("() => document.activeElement.dataset.turn") == "0"
    page.keyboard.press("ArrowDown")
    assert page.evaluate("() => document.activeElement.dataset.rollout") == "b"
    page.keyboard.press("Enter")
    expect(page.locator("#details")).to_contain_text("rollout b, turn 0 (visit)")
    assert page.get_attribute('.cell[data-rollout="b"][data-turn="0"]', "aria-pressed") == "true"


def test_run_page_charts_and_sensitivity_table(service: Service, page: Page) -> None:
    use_key(page, service.url, K1)
    page.goto(service.url + "/ui")
    page.click('#runs a:text-is("exp")')
    ready(page)
    run = api(service, "/v1/runs/exp")
    calls = page.evaluate("() => document.getElementById('chart-calls').data[0].y")
    assert calls == [s["judge_calls"]["process_per_trajectory"] for s in run["steps"]]
    credit = page.evaluate("() => document.getElementById('chart-credit').data.map(t => t.y)")
    assert credit == [[s["mean_credit"] for s in run["steps"]], [s["zero_credit_share"] for s in run["steps"]]]
    heat = page.evaluate("() => document.getElementById('chart-advantage').data[0].z")
    assert [[row[k] for row in heat] for k in range(len(run["steps"]))] == [
        s["process_advantage"]["counts"] for s in run["steps"]
    ]
    cb = page.evaluate("() => document.getElementById('chart-cb').data.map(t => t.y)")
    assert cb == [[p["cumulative"] for p in s["evidence"]] for s in (run["steps"][0], run["steps"][-1])]
    table = api(service, "/v1/batches/b1/sensitivity")
    rows = page.locator("#sensitivity tbody tr")
    expect(rows).to_have_count(len(table["scenarios"]))
    for k, scenario in enumerate(table["scenarios"]):
        cells = rows.nth(k).locator("td").all_inner_texts()
        s = scenario["sensitivity"]
        bound = "" if scenario["exact"] else "≤"
        assert cells[0] == scenario["name"] and cells[1] == f"{bound}{fixed(s['wasserstein_1'], 3)}"
        assert cells[3].endswith(f"{fixed(100 * s['process_sign_agreement'], 1)}%")
    shot(page, "run-exp")
    page.click('#steps a:text("g3")')
    ready(page)
    assert page.url.endswith("/ui/groups/g3")


def shown(text: str) -> float:
    """A number as the viewer shows it ("$0.0123", "1,234.5") read back."""
    return float(text.lstrip("$").replace(",", ""))


def test_usage_and_cost_are_shown_where_the_numbers_are_read(service: Service, page: Page) -> None:
    open_page(page, service, "/ui/runs/exp")
    run = api(service, "/v1/runs/exp")
    work, per = run["workload"], run["workload"]["usage_per_trajectory"]
    assert work["usage"]["cost_usd"] > 0 and per["cached_prompt_tokens"] > 0
    cells = page.locator("#workload tbody td").all_inner_texts()
    assert cells[:2] == [str(work["steps"]), str(work["trajectories"])]
    figures = [
        work["process_judge_tasks_per_trajectory"],
        work["outcome_judge_tasks_per_trajectory"],
        work["scoring_latency_per_trajectory_s"],
    ]
    assert cells[2:5] == [fixed(x, 2) for x in figures]
    usage_shown = [per["prompt_tokens"], per["cached_prompt_tokens"], per["completion_tokens"], per["cost_usd"]]
    for text, value in zip(cells[5:], [*usage_shown, work["usage"]["cost_usd"]], strict=True):
        assert shown(text) == pytest.approx(value, rel=1e-3, abs=0.05), text
    traces = page.evaluate("() => document.getElementById('chart-tokens').data.map(t => [t.name, t.y, t.yaxis || 'y'])")
    assert traces == [
        ["prompt", [s["usage_per_trajectory"]["prompt_tokens"] for s in run["steps"]], "y"],
        ["cached prompt", [s["usage_per_trajectory"]["cached_prompt_tokens"] for s in run["steps"]], "y"],
        ["completion", [s["usage_per_trajectory"]["completion_tokens"] for s in run["steps"]], "y"],
        ["cost (USD)", [s["usage_per_trajectory"]["cost_usd"] for s in run["steps"]], "y2"],
    ]
    rows = page.locator("#steps tbody tr")
    for k, step in enumerate(run["steps"]):
        texts = rows.nth(k).locator("td").all_inner_texts()
        u = step["usage_per_trajectory"]
        assert shown(texts[10]) == pytest.approx(
            u["prompt_tokens"] + u["completion_tokens"], abs=0.0501
        )  # shown to one decimal: x.x5 rounds by 0.05
        assert shown(texts[11]) == pytest.approx(u["cost_usd"], rel=1e-3)
        assert shown(texts[12]) == pytest.approx(step["usage"]["cost_usd"], rel=1e-3)
        share = step["usage"]["cached_prompt_share"]
        assert texts[13] == ("–" if share is None else f"{fixed(100 * share, 1)}%")
        assert shown(texts[14]) == step["usage"]["reused"]
    shot(page, "run-exp-usage")

    open_page(page, service, "/ui/groups/g1")
    adv = api(service, "/v1/groups/g1/advantages")
    usage = page.locator("#group-usage")
    expect(usage).to_contain_text(f"{adv['usage']['calls']} requests")
    expect(usage).to_contain_text(f"{adv['usage']['prompt_tokens']:,} prompt tokens")
    expect(usage).to_contain_text(f"{adv['usage']['cached_prompt_tokens']:,} cached")
    share = usage.locator('[data-term="cached_share"]').get_attribute("data-value")
    assert float(share or "nan") == pytest.approx(adv["usage"]["cached_prompt_share"])
    expect(usage).to_contain_text(f"{fixed(100 * adv['usage']['cached_prompt_share'], 1)}% of prompt tokens cached")
    cost = usage.locator('[data-term="cost"]').get_attribute("data-value")
    assert float(cost or "nan") == adv["usage"]["cost_usd"]
    # Each judgment: who answered it and its tokens (a visit of rollout a judged for R1 and R2).
    # g1, g2 and g3 ask the same requests of that visit and are scored at once, so which of them
    # asks the judge and which reuse its answer is a race: each line is checked against what
    # /credits says, and every judgment must show its tokens in one of the three.
    with_tokens: set[int] = set()
    for group_id in ("g1", "g2", "g3"):
        open_page(page, service, f"/ui/groups/{group_id}")
        page.click('.cell[data-rollout="a"][data-turn="1"]')
        judged = api(service, f"/v1/groups/{group_id}/credits")["rollouts"][0]["turns"][1]["judgments"]
        lines = page.locator("#details [data-usage]")
        expect(lines).to_have_count(len(judged))
        for k, j in enumerate(judged):
            expect(lines.nth(k)).to_contain_text(f"answered by {j['served_model']} at {j['endpoint']}")
            if j.get("reused"):
                expect(lines.nth(k)).to_contain_text("reused from an earlier identical request: no request of its own")
                expect(lines.nth(k)).not_to_contain_text("prompt tokens")
                continue
            with_tokens.add(k)
            expect(lines.nth(k)).to_contain_text(
                f"{j['prompt_tokens']:,} prompt tokens ({j['cached_prompt_tokens']:,} cached)"
            )
            expect(lines.nth(k)).to_contain_text(f"{j['completion_tokens']:,} completion tokens")
            waited = sum(a["waited_s"] for a in j["attempts"])
            expect(lines.nth(k)).to_contain_text(
                f"{fixed(j['latency_s'], 2)} s, {fixed(waited, 2)} s of it waiting its turn"
            )
    assert with_tokens == set(range(len(judged)))
    open_page(page, service, "/ui/groups/g1")
    page.click('.cell.outcome[data-rollout="b"]')
    b = adv["rollouts"][1]["usage"]
    expect(page.locator("#details [data-rollout-usage]")).to_contain_text(
        f"{b['calls']} requests · {b['prompt_tokens']:,} prompt tokens ({b['cached_prompt_tokens']:,} cached)"
    )
    shot(page, "group-g1-usage")


def test_another_tenant_sees_nothing(service: Service, page: Page) -> None:
    use_key(page, service.url, K2)
    expect(page.locator("#runs tbody")).to_contain_text("no runs yet")
    page.goto(service.url + "/ui/runs/exp")
    page.wait_for_selector("body[data-ready]")
    expect(page.locator("#problem")).to_contain_text("not found")
    page.goto(service.url + "/ui/groups/g1")
    page.wait_for_selector("body[data-ready]")
    expect(page.locator("#problem")).to_contain_text("not found")
    assert page.locator(".cell").count() == 0
    shot(page, "wrong-tenant")


def test_without_a_key_the_page_asks_for_one(service: Service, page: Page) -> None:
    page.goto(service.url + "/ui/groups/g1")
    page.wait_for_selector("body[data-ready]")
    expect(page.locator("#problem")).to_contain_text("needs an API key")


def test_report_is_one_file_that_shows_the_same(service: Service, page: Page, tmp_path: Path) -> None:
    out = tmp_path / "g1.html"
    env = {**os.environ, "DRCREDIT_API_KEY": K1}
    cli = [sys.executable, "-m", "drcredit_cli.main", "report"]
    done = subprocess.run([*cli, "group", "g1", "-o", str(out), "--url", service.url], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert "<script src=" not in html and "https://" not in html.split("window.DRCREDIT_DATA")[0]
    page.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
    page.goto(out.as_uri())
    ready(page)
    adv = api(service, "/v1/groups/g1/advantages")
    for ra in adv["rollouts"]:
        for t in ra["turns"]:
            cell = page.locator(f'.cell[data-rollout="{ra["id"]}"][data-turn="{t["index"]}"]')
            assert float(cell.get_attribute("data-advantage") or "nan") == pytest.approx(t["advantage"])
    # From the database directly (no service), as the embedded mode's user would: the
    # group's advantages as stored (their cost at the price the group finished under),
    # whatever price the reporting environment sets.
    env = {**os.environ, "DRCREDIT_DATABASE_URL": service.db, "DRCREDIT_JUDGE_PRICE": "9,9,9"}
    group_out = tmp_path / "g1-db.html"
    done = subprocess.run([*cli, "group", "g1", "-o", str(group_out), "--tenant", "t1"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    page.goto(group_out.as_uri())
    ready(page)
    assert page.evaluate("() => window.DRCREDIT_DATA['/v1/groups/g1/advantages']") == adv
    run_out = tmp_path / "exp.html"
    env = {**os.environ, "DRCREDIT_DATABASE_URL": service.db}
    done = subprocess.run([*cli, "run", "exp", "-o", str(run_out), "--tenant", "t1"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    page.goto(run_out.as_uri())
    ready(page)
    run = api(service, "/v1/runs/exp")
    calls = page.evaluate("() => document.getElementById('chart-calls').data[0].y")
    assert calls == [s["judge_calls"]["process_per_trajectory"] for s in run["steps"]]
    # The run's workload row, and the tokens per trajectory (no price in this environment).
    workload = page.locator("#workload tbody td").all_inner_texts()
    assert workload[:3] == [
        str(run["workload"]["steps"]),
        str(run["workload"]["trajectories"]),
        fixed(run["workload"]["process_judge_tasks_per_trajectory"], 2),
    ]
    assert workload[-2:] == ["–", "–"]
    tokens = page.evaluate("() => document.getElementById('chart-tokens').data[0].y")
    assert tokens == [s["usage_per_trajectory"]["prompt_tokens"] for s in run["steps"]]
    assert not math.isnan(float(page.locator("#sensitivity tbody tr").count()))
    expect(page.locator("#sensitivity tbody tr")).to_have_count(7)
    shot(page, "report-run-exp")
