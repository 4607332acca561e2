"""A real llama.cpp ``llama-server`` with two slots serves a visit's rubric calls from its
prompt cache: the shared-first layout puts the page before the rubric, and the calls
sharing it are sent to the same slot (``id_slot``). The cached tokens are the server's own
count (``usage.prompt_tokens_details.cached_tokens``, or ``timings.cache_n``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.api import api_client
from tests.support.builders import answer, group_doc, page, rollout, rubric, tool, visit
from tests.support.llama_server import MODEL, LlamaServer, running_llama

pytestmark = pytest.mark.timeout(1200)

#: About 1,000 tokens of page text (common English words are one token each).
PAGE = " ".join(
    "The storage site opened in 2019 and the county inspected its battery modules after the fire"
    " of March, finding that the vents and the gas detection worked as the permit required.".split()
    * 36
)


@pytest.fixture
def llama(tmp_path: Path) -> Iterator[LlamaServer]:
    with running_llama(tmp_path, ctx=8192, parallel=2, threads=2) as server:
        yield server


def judged_group() -> dict[str, Any]:
    a = rollout("a", visit(page("W1", "https://s.org/report", PAGE)), answer(), reward=1.0)
    b = rollout("b", tool(), answer(), reward=0.0)
    rubrics = [rubric("R1"), rubric("R2"), rubric("R3")]
    return group_doc(a, b, rubrics=rubrics, group_id="cached")


def test_a_visits_rubric_calls_come_from_the_servers_prompt_cache(tmp_path: Path, llama: LlamaServer) -> None:
    settings = {
        "judge_model": MODEL,
        "judge_max_tokens": 128,
        "judge_timeout_s": 600.0,
        "judge_concurrency": 4,
        "judge_reuse": "group",
    }
    with api_client(f"sqlite:///{tmp_path / 'db.sqlite3'}", llama.url, **settings) as client:
        assert client.post("/v1/groups", json=judged_group()).status_code == 202
        deadline = time.monotonic() + 1100  # SmolLM2 on a shared CPU: minutes for a few thousand tokens
        while True:
            r = client.get("/v1/groups/cached/advantages", params={"wait": 60})
            if r.status_code != 409 or time.monotonic() > deadline:
                break
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        credits = client.get("/v1/groups/cached/credits").json()
    attempts = [
        a
        for ro in credits["rollouts"]
        for t in ro["turns"]
        for j in t.get("judgments", ())
        if j["kind"] == "visit"
        for a in j["attempts"]
    ]
    assert len(attempts) >= 3 and usage["prompt_tokens"] > 3 * 1000
    # Each attempt's cached tokens as the server reported them; every call after the
    # first found the system text, the question and the page in its slot.
    assert sum(1 for a in attempts if a["cached_tokens"] > 1000) >= len(attempts) - 1
    assert usage["cached_prompt_tokens"] == sum(a["cached_tokens"] for a in attempts)
    share = usage["cached_prompt_tokens"] / usage["prompt_tokens"]
    assert usage["cached_prompt_share"] == pytest.approx(share)
    print(f"llama-server, 2 slots: {usage['cached_prompt_tokens']}/{usage['prompt_tokens']} prompt tokens cached")
    assert share >= 0.5
