"""One service for every viewer test (Postgres, the marker judge, two tenants), its groups
scored once and audited, and Debian's headless Chromium."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from drcredit_api.app import create_app
from tests.api.test_audits import shifted
from tests.support.api import settings_for
from tests.support.builders import group_doc
from tests.support.infra import postgres_database
from tests.support.judge_server import Call, Reply, marker_answer, running_judge
from tests.support.live import free_port, serving
from tests.support.scenarios import DRIFT_GROUPS, RUBRICS, hand_worked_group, rollout_a, rollout_b
from tests.ui.helpers import CHROMIUM, K1, K2, Service
from tests.ui.scenarios import judged_group, long_group, step_group

#: Steps of the long run: the charts must stay legible with this many.
MANY_STEPS = 200
#: The judge's price (USD per million prompt, cached prompt and completion tokens).
PRICE = "0.15,0.075,0.6"


def cached_marker_script(call: Call) -> Reply:
    """The marker judge, reporting half of each prompt's tokens as served from its cache."""
    reply = Reply.json(marker_answer(call))
    prompt = sum(len(m["content"]) for m in call.request["messages"]) // 4
    reply.usage = {
        "prompt_tokens": prompt,
        "completion_tokens": len(reply.content or "") // 4,
        "prompt_tokens_details": {"cached_tokens": prompt // 2},
    }
    return reply


def _seed(c: httpx.Client) -> None:
    swapped = group_doc({**rollout_a(), "outcome_reward": 0.0}, {**rollout_b(), "outcome_reward": 1.0}, rubrics=RUBRICS)
    step1 = {"run": "exp", "step": 1}
    body = {
        "batch_id": "b1",
        "groups": [hand_worked_group(group_id="g1", metadata=step1), {**swapped, "group_id": "g2", "metadata": step1}],
    }
    assert c.post("/v1/batches", json=body).status_code == 202
    posted = ["g3", "judged", "long"] + [f"many-{k}" for k in range(MANY_STEPS)] + [g["group_id"] for g in DRIFT_GROUPS]
    groups = [
        hand_worked_group(group_id="g3", metadata={"run": "exp", "step": 2}),
        # a run of one step, posted without a batch
        judged_group("judged", metadata={"run": "solo", "step": 3}),
        long_group("long"),
    ] + [step_group("many", k) for k in range(MANY_STEPS)]
    # run drifting: five steps whose judge levels move away at step 4 (the drift section)
    groups += DRIFT_GROUPS
    for doc in groups:
        assert c.post("/v1/groups", json=doc).status_code == 202, doc["group_id"]
    assert c.get("/v1/batches/b1/advantages", params={"wait": 60}).status_code == 200
    for group_id in posted:
        r = c.get(f"/v1/groups/{group_id}/advantages", params={"wait": 60})
        assert r.status_code == 200, r.text


#: The audits of the seeded runs, newest first: run exp has a running one (its judge
#: never answers), a failed one (its judge is not there) and a done one; run solo a done
#: one over its judged group (every kind of judgment paired); run many none.
AUDITS = {
    "exp": [("held", {"group_ids": ["g3"]}), ("down", {"run": "exp"}), ("shifted", {"batch_id": "b1"})],
    "solo": [("shifted", {"run": "solo"})],
}


def _audit(c: httpx.Client, judge: str, scope: dict[str, Any]) -> str:
    r = c.post("/v1/audits", json={"judge": judge, "scope": scope})
    assert r.status_code == 202, r.text
    audit_id: str = r.json()["audit_id"]
    if judge == "held":
        return audit_id
    deadline = time.monotonic() + 60
    while True:
        r = c.get(f"/v1/audits/{audit_id}", params={"wait": 10})
        if r.status_code == 200 or r.json().get("status") == "failed":
            return audit_id
        assert time.monotonic() < deadline, r.text


def _seed_audits(c: httpx.Client) -> None:
    for run in AUDITS:
        for judge, scope in reversed(AUDITS[run]):
            _audit(c, judge, scope)


@pytest.fixture(scope="session")
def service() -> Iterator[Service]:
    # A judge that takes requests in and never answers them: an audit on it stays running.
    with socket.create_server(("127.0.0.1", 0), backlog=64) as silent, running_judge(shifted) as shift:
        judges = {
            "shifted": {"base_url": shift.url, "model": "judge-b"},
            "down": {
                "base_url": f"http://127.0.0.1:{free_port()}/v1",
                "model": "judge-c",
                "max_attempts": 1,
                "outage_deadline_s": 1.0,
            },
            "held": {
                "base_url": f"http://127.0.0.1:{silent.getsockname()[1]}/v1",
                "model": "judge-h",
                "timeout_s": 3600,
            },
        }
        with running_judge(cached_marker_script) as judge, postgres_database() as db:
            settings = settings_for(db, judge.url, api_keys=f"t1:{K1},t2:{K2}", judge_price=PRICE, audit_judges=judges)
            with serving(create_app(settings)) as url:
                with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {K1}"}, timeout=60) as c:
                    _seed(c)
                    _seed_audits(c)
                yield Service(url, db)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium for one module's tests. Playwright's sync API runs its event loop on the
    main thread for as long as it is open, and ``asyncio.run`` refuses to start under it:
    open for the session, it broke every later test that runs a loop of its own (the
    client's), so it is closed when the module's last test ends."""
    assert Path(CHROMIUM).exists(), "Chromium is needed for the viewer tests (scripts/test installs it)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    p = context.new_page()
    yield p
    context.close()
