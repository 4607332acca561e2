"""The usage page in a real browser: a tenant sees its own judge usage and budgets (the
numbers of ``GET /v1/usage``), the operator's key sees every tenant's, and another key
does not see the operator's table."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page

from drcredit_api.app import create_app
from tests.support.api import settings_for
from tests.support.infra import postgres_database
from tests.support.judge_server import running_judge
from tests.support.live import serving
from tests.support.scenarios import hand_worked_group
from tests.ui.conftest import cached_marker_script
from tests.ui.helpers import Service, ready, shot, use_key

KEYS = {"alpha": "ka", "beta": "kb", "ops": "kops"}
TENANTS = '{"alpha": {"budget": {"tokens_per_day": 1000000, "usd_per_month": 5}}, "ops": {"operator": true}}'


@pytest.fixture(scope="module")
def tenants_service() -> Iterator[Service]:
    with running_judge(cached_marker_script) as judge, postgres_database() as db:
        keys = ",".join(f"{t}:{k}" for t, k in KEYS.items())
        settings = settings_for(db, judge.url, api_keys=keys, tenants=TENANTS, judge_price="0.15,0.075,0.6")
        with serving(create_app(settings)) as url:
            for tenant, n in (("alpha", 2), ("beta", 1)):
                with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEYS[tenant]}"}, timeout=60) as c:
                    for i in range(n):
                        assert c.post("/v1/groups", json=hand_worked_group(group_id=f"{tenant}{i}")).status_code == 202
                    for i in range(n):
                        r = c.get(f"/v1/groups/{tenant}{i}/advantages", params={"wait": 60})
                        assert r.status_code == 200, r.text
            yield Service(url, db)


def usage(service: Service, key: str, path: str = "/v1/usage") -> dict:  # type: ignore[type-arg]
    r = httpx.get(service.url + path, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def value(page: Page, selector: str) -> float:
    return float(page.locator(selector).get_attribute("data-value") or "nan")


def test_a_tenant_sees_its_own_usage_and_budgets(tenants_service: Service, page: Page) -> None:
    use_key(page, tenants_service.url, KEYS["alpha"])
    answered: list[tuple[int, str]] = []
    page.on("response", lambda r: answered.append((r.status, r.url)))
    page.goto(tenants_service.url + "/ui/usage")
    ready(page)
    assert any(url.endswith("/v1/usage") for _, url in answered), answered  # the listener saw the page's calls
    # It asks only what its key may read: no refused request (a 403 in the browser's console).
    assert [(status, url) for status, url in answered if status == 403 or "/v1/usage/tenants" in url] == []
    doc = usage(tenants_service, KEYS["alpha"])
    assert page.inner_text("#tenant-name") == "alpha"
    for window in ("day", "month"):
        row = f'#own-usage tr[data-window="{window}"]'
        assert value(page, f'{row} [data-term="judge_requests"]') == doc[window]["calls"] > 0
        assert value(page, f'{row} [data-term="prompt_tokens"]') == doc[window]["prompt_tokens"]
        assert value(page, f'{row} [data-term="completion_tokens"]') == doc[window]["completion_tokens"]
    tokens = doc["budgets"]["tokens_per_day"]
    assert tokens["used"] == doc["day"]["prompt_tokens"] + doc["day"]["completion_tokens"]
    row = '#own-budgets tr[data-budget="tokens_per_day"]'
    assert value(page, f'{row} [data-term="budget_used"]') == tokens["used"]
    assert value(page, f'{row} [data-term="budget_left"]') == tokens["left"] == 1_000_000 - tokens["used"]
    usd = doc["budgets"]["usd_per_month"]
    assert value(page, '#own-budgets tr[data-budget="usd_per_month"] [data-term="budget_left"]') == pytest.approx(
        usd["left"]
    )
    # Not the operator: no table of every tenant, and no number without its explanation.
    assert page.locator("#operator").is_hidden()
    assert page.locator("#main [data-term]:not([title])").count() == 0
    shot(page, "usage-alpha")


def test_the_operator_sees_every_tenant(tenants_service: Service, page: Page) -> None:
    use_key(page, tenants_service.url, KEYS["ops"])
    page.goto(tenants_service.url + "/ui/usage")
    ready(page)
    assert page.locator("#operator").is_visible()
    listed = {t["tenant"]: t for t in usage(tenants_service, KEYS["ops"], "/v1/usage/tenants")["tenants"]}
    assert set(listed) == {"alpha", "beta", "ops"}
    for tenant, doc in listed.items():
        row = f'#all-usage tr[data-tenant="{tenant}"]'
        assert value(page, f'{row} [data-term="judge_requests"]') == doc["day"]["calls"]
        tokens = doc["day"]["prompt_tokens"] + doc["day"]["completion_tokens"]
        assert value(page, f'{row} [data-term="tokens_today"]') == tokens
    assert listed["alpha"]["day"]["calls"] >= listed["beta"]["day"]["calls"] > 0 == listed["ops"]["day"]["calls"]
    assert "left" in page.inner_text('#all-usage tr[data-tenant="alpha"]')
    shot(page, "usage-operator")


def test_the_index_links_to_the_usage_page(tenants_service: Service, page: Page) -> None:
    use_key(page, tenants_service.url, KEYS["beta"])
    page.click("#usage-link")
    ready(page)
    assert page.inner_text("#tenant-name") == "beta"
    assert page.locator("#operator").is_hidden()
