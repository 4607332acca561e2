"""Outcome judging through the API and worker processes equals embedded mode."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy

from tests.distributed.test_distributed import (
    COUNTED,
    assert_same_advantages,
    batch_advantages,
    embedded_reference,
    redis_db,
    request_key,
    worker_env,
)
from tests.pipeline.test_outcome_judging import judged_group
from tests.support.api import api_client
from tests.support.judge_server import JudgeServer
from tests.support.services import Workers

pytestmark = pytest.mark.infra


def test_a_batch_with_judged_outcomes_through_workers_matches_embedded(
    tmp_path: Path, pg_url: str, marker_judge: JudgeServer
) -> None:
    groups = [judged_group(f"oj{i}") for i in range(4)]
    with redis_db() as broker:
        # The four groups ask the same outcome requests: with reuse "group" each asks them
        # itself, as the call counts below expect (COUNTED).
        workers = Workers(worker_env(pg_url, broker, marker_judge.url, **COUNTED), tmp_path)
        try:
            workers.start("visit_judge,snippet_matcher", 8)
            workers.start("outcome_judge", 8)
            workers.start("credit_aggregator", 2)
            with api_client(pg_url, marker_judge.url, broker_url=broker, auto_migrate=False, **COUNTED) as client:
                r = client.post("/v1/batches", json={"batch_id": "judged", "groups": groups})
                assert r.status_code == 202, r.text
                got = batch_advantages(client, "judged")
                outcome = client.get("/v1/groups/oj0/credits").json()["rollouts"][0]["outcome"]
        finally:
            workers.stop_all()
    distributed = Counter(request_key(c) for c in marker_judge.calls)
    assert sum(1 for c in marker_judge.calls if c.kind in ("rubric", "citation")) == 4 * 10
    marker_judge.calls.clear()
    want = embedded_reference(tmp_path, marker_judge, groups, **COUNTED)
    assert_same_advantages(got, want)
    for gid, doc in want.items():
        assert [r["outcome_reward"] for r in got[gid]["rollouts"]] == [
            pytest.approx(r["outcome_reward"]) for r in doc["rollouts"]
        ]
    assert Counter(request_key(c) for c in marker_judge.calls) == distributed
    assert outcome["rubric_scores"] == {"R1": 4, "R2": 2, "P": 0}


def test_an_outcome_unit_judges_the_claims_ingest_stored(
    tmp_path: Path, pg_url: str, marker_judge: JudgeServer
) -> None:
    """The unit takes its calls from the report facts stored at ingest (it does not parse
    the report again): a claim changed in the stored facts before any worker runs is the
    claim the judge is asked about, and the one the credits document shows."""
    doc = judged_group("of1")
    with redis_db() as broker, api_client(pg_url, marker_judge.url, broker_url=broker, auto_migrate=False) as client:
        assert client.post("/v1/groups", json=doc).status_code == 202
        engine = sqlalchemy.create_engine(pg_url)
        with engine.begin() as conn:
            stored = conn.execute(
                sqlalchemy.text("SELECT outcome_facts FROM rollouts WHERE rollout_id = 'a'")
            ).scalar_one()
            assert [c["claim"] for c in stored["citations"]] == ["opened in 2019", "two pages"]
            stored["citations"][0]["claim"] = "opened in 2020"
            conn.execute(
                sqlalchemy.text("UPDATE rollouts SET outcome_facts = CAST(:facts AS json) WHERE rollout_id = 'a'"),
                {"facts": json.dumps(stored)},
            )
        engine.dispose()
        workers = Workers(worker_env(pg_url, broker, marker_judge.url), tmp_path)
        try:
            workers.start("visit_judge,snippet_matcher,outcome_judge,credit_aggregator", 8)
            r = client.get("/v1/groups/of1/advantages", params={"wait": 60})
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "done"
            claims = client.get("/v1/groups/of1/credits").json()["rollouts"][0]["outcome"]["claims"]
        finally:
            workers.stop_all()
    asked = sorted(c.document["claim"] for c in marker_judge.calls if c.kind == "citation")
    assert asked == ["opened in 2020", "two pages", "two pages", "two pages"]
    assert [c["claim"] for c in claims] == ["opened in 2020", "two pages"]
