"""Turns the service leaves out (``on_judge_failure: exclude``) leave the trainer's loss too.

The real service with a judge that always answers malformed JSON: every visit judgment
fails, so every visit is unscorable. Under
``exclude`` their tokens must drop out of the train masks the adapters apply; under
``zero`` every policy token stays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from drcredit.client import DrCreditClient
from drcredit.trainers.scoring import TokenRollout, score_token_rollouts, turns_to_train
from drcredit_api.app import create_app
from tests.support.api import settings_for
from tests.support.builders import answer, page, rubric, tool, visit
from tests.support.judge_server import Reply, running_judge
from tests.support.judged_service import judged_service
from tests.support.live import serving


def rows() -> list[TokenRollout]:
    """Two rollouts: a tool call (tokens 0-2), a visit (3-5), an answer (6-7)."""
    out = []
    for i in range(2):
        turns: list[dict[str, Any]] = [
            tool(),
            visit(page("W1", f"https://v{i}.org/p", evidence=f"page text {i}")),
            answer(f"report {i}"),
        ]
        out.append(
            TokenRollout(
                group_key="q1",
                rollout_id=f"r{i}",
                question="What?",
                rubrics=[rubric("R1")],
                turns=turns,
                spans=[(0, 3), (3, 6), (6, 8)],
                policy_mask=np.ones(8, dtype=np.int64),
                outcome_reward=float(i),
            )
        )
    return out


@pytest.mark.parametrize("policy", ["exclude", "zero"])
def test_unscorable_turns_leave_the_loss_only_under_exclude(tmp_path: Path, policy: str) -> None:
    with (
        running_judge(lambda c: Reply(content="no json")) as judge,
        judged_service(f"sqlite:///{tmp_path / 'x.sqlite3'}", judge.url) as url,
        DrCreditClient(url) as client,
        pytest.warns(UserWarning, match="failed"),
    ):
        scored = score_token_rollouts(
            rows(), client=client, timeout_s=60, id_prefix=policy, params={"on_judge_failure": policy}
        )
        doc = client.advantages(scored.group_ids[0])
    assert doc["progress"]["judgments_failed"] > 0
    visit_unscorable = [r["turns"][1]["unscorable"] for r in doc["rollouts"]]
    assert visit_unscorable == [True, True]
    for b in range(2):
        keep = scored.train_masks[b]
        if policy == "exclude":
            # The visit's tokens leave the loss; the tool call and the answer stay.
            assert keep.tolist() == [True] * 3 + [False] * 3 + [True] * 2
            assert turns_to_train(doc, f"r{b}") == [True, False, True]
        else:
            assert keep.all() and turns_to_train(doc, f"r{b}") == [True, True, True]
    assert scored.excluded_tokens == (6 if policy == "exclude" else 0)


def test_with_judged_outcomes_the_trainers_reward_is_not_sent(tmp_path: Path) -> None:
    """outcome_source judge: the rows' own rewards stay home and the service's come back."""
    database = f"sqlite:///{tmp_path / 'j.sqlite3'}"
    with serving(create_app(settings_for(database, None))) as url, DrCreditClient(url) as client:
        scored = score_token_rollouts(rows(), client=client, timeout_s=60, params={"outcome_source": "judge"})
        doc = client.advantages(scored.group_ids[0])
    assert doc["params"]["outcome_source"] == "judge"
    assert all(isinstance(r["outcome_reward"], float) for r in doc["rollouts"])  # computed by the service
    assert [r["outcome_reward"] for r in doc["rollouts"]] != [0.0, 1.0]  # not the rows' own
