"""SkyRL generator outputs as token rollouts, and the scores written back into them.

What :mod:`drcredit.trainers.skyrl` (batch) and :mod:`drcredit.trainers.skyrl_stream`
(streaming) share; see the former for the whole picture. Nothing here imports skyrl.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from drcredit.trainers.records import (
    conversation_record,
    error_record,
    no_turns_record,
    question_and_rubrics,
    read_turn_record,
    record_spans,
)
from drcredit.trainers.scoring import ScoredBatch, TokenRollout
from drcredit.trainers.segments import plain_text, record_from_tokens, tool_messages
from drcredit.trainers.settings import DrCreditSettings, plain_value
from drcredit.trainers.tokens import policy_spans

#: Key of a SkyRL-Gym env's ``get_metrics()`` holding the response's chat messages (assistant
#: messages with ``tool_calls`` and the ``tool`` messages answering them), in order.
MESSAGES_KEY = "drcredit_messages"


def trajectory_record(
    response_ids: Sequence[int],
    loss_mask: Sequence[int],
    env_metrics: Mapping[str, Any] | None,
    tokenizer: Any,
    settings: DrCreditSettings,
    final_observation: str | None = None,
) -> dict[str, Any]:
    """One trajectory's turn record: from the env's messages when it reports them, else the tokens.

    ``final_observation``: what the env answered on the step that ended the trajectory (a
    turn budget reached on a tool call), which SkyRL leaves out of ``response_ids``; it
    answers the last message's calls when nothing else does.
    """
    messages = (env_metrics or {}).get(MESSAGES_KEY)
    runs = policy_spans(np.asarray(loss_mask, dtype=np.int64))
    if not runs:
        return no_turns_record("the trajectory has no policy tokens (loss_mask all 0)")
    if messages:
        messages = [dict(m) for m in plain_value(messages)]
        assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if len(assistant) != len(runs):
            return error_record(f"{len(assistant)} assistant messages from the env but {len(runs)} policy-token runs")
        calls = (messages[-1].get("tool_calls") or []) if messages[-1].get("role") == "assistant" else []
        if calls and final_observation:
            messages += tool_messages(plain_text(final_observation), len(calls))
        return conversation_record(messages, list(zip(runs, assistant, strict=True)), tools=settings.tool_names)
    if tokenizer is None:
        return error_record(f"no tokenizer to decode the response and no env_metrics[{MESSAGES_KEY!r}]")
    return record_from_tokens(
        response_ids,
        loss_mask,
        lambda ids: str(tokenizer.decode(ids, skip_special_tokens=False)),
        tools=settings.tool_names,
        final_observation=final_observation,
    )


def outcome_reward(reward: Any) -> float:
    """A trajectory's reward as one number: a float, or per-token (turn-level) rewards summed."""
    value = math.fsum(float(r) for r in reward) if isinstance(reward, (list, tuple)) else float(reward)
    if not math.isfinite(value):
        raise ValueError(f"the trajectory's reward is not finite ({value})")
    return value


def trajectory_key(trajectory_id: Any) -> str:
    """``{instance_id}_{repetition_id}`` of a SkyRL ``TrajectoryID``."""
    return f"{trajectory_id.instance_id}_{trajectory_id.repetition_id}"


def rows_from_output(
    input_batch: Mapping[str, Any],
    output: Mapping[str, Any],
    tokenizer: Any,
    settings: DrCreditSettings,
    final_observations: Mapping[str, str] | None = None,
) -> list[TokenRollout]:
    """One :class:`TokenRollout` per trajectory of a (non step-wise) generator output.

    ``final_observations``: by :func:`trajectory_key`, what the env answered on a
    trajectory's last step (see :func:`trajectory_record`).
    """
    trajectory_ids = input_batch.get("trajectory_ids")
    responses = output["response_ids"]
    if trajectory_ids is None or len(trajectory_ids) != len(responses):
        raise ValueError(
            "DrCreditGenerator needs input_batch['trajectory_ids'] (one TrajectoryID per trajectory, as SkyRL's "
            f"trainer passes them) to form groups; got {None if trajectory_ids is None else len(trajectory_ids)} "
            f"for {len(responses)} trajectories (step-wise trajectories are not supported)"
        )
    extras = input_batch.get("env_extras") or [None] * len(responses)
    metrics = output.get("env_metrics") or [None] * len(responses)
    rows = []
    for i, trajectory in enumerate(trajectory_ids):
        where = f"trajectory {i} ({trajectory.instance_id}_{trajectory.repetition_id})"
        final = (final_observations or {}).get(trajectory_key(trajectory))
        record = read_turn_record(
            trajectory_record(responses[i], output["loss_masks"][i], metrics[i], tokenizer, settings, final), where
        )
        question, rubrics = question_and_rubrics([extras[i]], where, "env_extras")
        rows.append(
            TokenRollout(
                group_key=str(trajectory.instance_id),
                rollout_id=f"r{trajectory.repetition_id}",
                question=question,
                rubrics=rubrics,
                turns=record["turns"],
                spans=record_spans(record),
                policy_mask=np.asarray(output["loss_masks"][i], dtype=np.int64),
                outcome_reward=outcome_reward(output["rewards"][i]),
            )
        )
    return rows


def apply_scores(output: dict[str, Any], scored: ScoredBatch) -> dict[str, Any]:
    """Per-token advantages into ``rewards``, left-out turns out of ``loss_masks``, metrics added."""
    rewards: list[list[float]] = []
    masks: list[list[int]] = []
    for i, values in enumerate(scored.values):
        width = len(output["response_ids"][i])
        row, keep = scored.padded(width, rows=[i])
        rewards.append([float(v) if k else 0.0 for v, k in zip(row[0], keep[0], strict=True)])
        masks.append([int(m) if k else 0 for m, k in zip(output["loss_masks"][i], keep[0], strict=True)])
        if values.shape[0] != width:
            raise ValueError(f"trajectory {i}: {values.shape[0]} advantages for {width} response tokens")
    output["rewards"] = rewards
    output["loss_masks"] = masks
    metrics = dict(output.get("rollout_metrics") or {})
    trained = [v[m] for v, m in zip(scored.values, scored.train_masks, strict=True)]
    flat = np.concatenate(trained) if trained else np.zeros(0, dtype=np.float32)
    metrics["drcredit/token_advantage_abs_mean"] = float(np.abs(flat).mean()) if flat.size else 0.0
    metrics["drcredit/excluded_tokens"] = float(scored.excluded_tokens)
    metrics["drcredit/groups"] = float(len(set(scored.group_ids)))
    output["rollout_metrics"] = metrics
    return output


def training_step(input_batch: Mapping[str, Any]) -> tuple[bool, int | None]:
    """(is this a training generation, SkyRL's global step) from ``batch_metadata``."""
    meta = input_batch.get("batch_metadata")
    if meta is None:
        return True, None
    return getattr(meta, "training_phase", "train") != "eval", int(getattr(meta, "global_step", 0))
