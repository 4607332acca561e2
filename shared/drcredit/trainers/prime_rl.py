"""prime-rl adapter: DrCredit's per-turn advantages on verifiers' traces (``MessageNode.advantages``).

Targets **verifiers 0.4.0** (``verifiers.v1``: ``Episode``, ``Trace``, ``MessageNode``) and
the ``Algorithm`` interface of **prime-rl 0.8.0** (``prime_rl.orchestrator.algo``). prime-rl
is not on PyPI and needs Python 3.12 and CUDA: :func:`build_algorithm`, :func:`install` and
:func:`main` are written against its source and were not run here; everything they call
(:func:`score_episodes`, :func:`assign_token_advantages`) is tested with real verifiers traces.

How a group is scored. prime-rl's orchestrator hands an algorithm's ``score_group`` the
episodes of one group; an episode's traces are its agents' message graphs. Each trainable
trace (no error, ``agent.trainable``, some sampled token) is one rollout: its conversation is
its last branch (:attr:`Trace.branches`), whose sampled assistant nodes are the generations;
the messages after the prompt become API turns (``search`` / ``visit`` / ``tool`` /
``answer``, :func:`drcredit.trainers.records.conversation_record`); the outcome reward is
``trace.reward``; question and rubrics come from the task's data (``question`` / ``rubrics``,
or a ``drcredit`` mapping holding both). The step's groups are scored like every adapter's
(:func:`drcredit.trainers.scoring.score_step`) and each sampled token gets its turn's
advantage, in the compact layout prime-rl's own ``assign_advantages`` writes: the sampled
tokens of the trace's nodes, in node order. Turns the service left out
(``on_judge_failure: exclude``) get 0, which prime-rl's default
``orchestrator.train.filter_zero_advantages`` removes from the batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from drcredit.trainers.records import conversation_record, question_and_rubrics, read_turn_record, record_spans
from drcredit.trainers.scoring import ScoredBatch, TokenRollout, safe_id, score_step
from drcredit.trainers.settings import DrCreditSettings

__all__ = [
    "TARGET_PRIME_RL_VERSION",
    "TARGET_VERIFIERS_VERSION",
    "assign_token_advantages",
    "build_algorithm",
    "install",
    "score_episodes",
    "trace_rollout",
]

TARGET_VERIFIERS_VERSION = "0.4.0"
TARGET_PRIME_RL_VERSION = "0.8.0"
log = logging.getLogger("drcredit.trainers")


def trainable_traces(episodes: Sequence[Any]) -> list[Any]:
    """The traces prime-rl trains on: no error, a trainable agent, some sampled token."""
    return [
        trace
        for episode in episodes
        for trace in episode.traces
        if not trace.has_error and trace.agent.trainable and any(any(node.mask) for node in trace.nodes)
    ]


def message_dict(message: Any) -> dict[str, Any]:
    """A verifiers message as an OpenAI-style chat message (what the converters read)."""
    out: dict[str, Any] = {"role": message.role, "content": _text(getattr(message, "content", None))}
    if message.role == "assistant":
        if message.reasoning_content:
            out["reasoning_content"] = message.reasoning_content
        if message.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in message.tool_calls
            ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
    return out


def _text(content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content
    return [{"type": part.type, "text": getattr(part, "text", "")} for part in content]


def trace_rollout(trace: Any, settings: DrCreditSettings, *, group_key: str, where: str) -> TokenRollout:
    """One trace as a rollout; spans are in its compact sampled-token coordinates."""
    sampled = [i for i, node in enumerate(trace.nodes) if any(node.mask)]
    offsets: dict[int, tuple[int, int]] = {}
    position = 0
    for i in sampled:
        node = trace.nodes[i]
        if len(node.mask) != len(node.token_ids):
            raise ValueError(f"{where}: node {i} has {len(node.mask)} mask entries for {len(node.token_ids)} tokens")
        offsets[i] = (position, position + sum(node.mask))
        position = offsets[i][1]
    branch = trace.branches[-1]
    ids = {id(node): i for i, node in enumerate(trace.nodes)}
    path = [ids[id(node)] for node in branch.nodes]
    off_branch = sorted(set(sampled) - set(path))
    if off_branch:
        raise ValueError(
            f"{where}: sampled nodes {off_branch} lie off the trace's last branch (compaction or subagents); "
            "DrCredit scores one conversation per trace"
        )
    first = next(k for k, i in enumerate(path) if i in offsets)
    messages = [message_dict(trace.nodes[i].message) for i in path[first:]]
    generations = [(offsets[i], k) for k, i in enumerate(path[first:]) if i in offsets]
    data = trace.task.data
    task = data.model_dump() if hasattr(data, "model_dump") else data
    question, rubrics = question_and_rubrics([task, trace.info], where, "the task data")
    record = read_turn_record(conversation_record(messages, generations, tools=settings.tool_names), where)
    return TokenRollout(
        group_key=group_key,
        rollout_id=safe_id(str(trace.id)),
        question=question,
        rubrics=rubrics,
        turns=record["turns"],
        spans=record_spans(record),
        policy_mask=np.ones(position, dtype=np.int64),
        outcome_reward=float(trace.reward),
    )


def assign_token_advantages(trace: Any, values: Any, keep: Any = None) -> None:
    """Write per-token advantages onto the trace's sampled nodes (``MessageNode.advantages``).

    ``values`` (and ``keep``, False for tokens to train on nothing) follow the compact layout:
    every sampled token of the trace, node after node.
    """
    flat = np.asarray(values, dtype=np.float64)
    if keep is not None:
        flat = np.where(np.asarray(keep, dtype=bool), flat, 0.0)
    nodes = [node for node in trace.nodes if any(node.mask)]
    total = sum(sum(node.mask) for node in nodes)
    if flat.shape != (total,):
        raise ValueError(f"trace {trace.id!r}: {flat.shape[0]} advantages for {total} sampled tokens")
    start = 0
    for node in nodes:
        end = start + sum(node.mask)
        node.advantages = [float(v) for v in flat[start:end]]
        start = end


def score_episodes(episodes: Sequence[Any], settings: DrCreditSettings, *, client: Any = None) -> ScoredBatch | None:
    """Score one group's episodes and write every trainable trace's ``MessageNode.advantages``.

    Returns the scoring (None for a group with fewer than two trainable traces, which, as
    under prime-rl's GRPO, carries no group-relative signal: its traces get zeros).
    """
    traces = trainable_traces(episodes)
    if len(traces) < 2:
        for trace in traces:
            assign_token_advantages(trace, np.zeros(sum(sum(n.mask) for n in trace.nodes)))
        log.warning("DrCredit: a group with %d trainable trace(s) has no group-relative signal: zeros", len(traces))
        return None
    first = episodes[0]
    group_key = str(first.group.id if first.group is not None else (first.task.key or first.task.hash or first.id))
    rows = [trace_rollout(t, settings, group_key=group_key, where=f"trace {t.id}") for t in traces]
    step, run = _step_and_run(first)
    if settings.run is None and run is not None:
        settings = dataclasses.replace(settings, run=run)
    scored = score_step(rows, settings, client=client, step=step)
    for b, trace in enumerate(traces):
        assign_token_advantages(trace, scored.values[b], ~scored.excluded[b] if scored.excluded else None)
    return scored


def _step_and_run(episode: Any) -> tuple[int | None, str | None]:
    run = getattr(episode, "run", None)
    if run is None:
        return None, None
    work = getattr(run, "work", None)
    step = getattr(work, "step", None)
    return (int(step) if step is not None else None), str(run.name or run.id)


# ----------------------------------------------------------------------------- prime-rl (not run here)


def build_algorithm(base: type | None = None, settings: DrCreditSettings | None = None) -> type:
    """prime-rl's ``Algorithm`` subclass whose ``score_group`` is :func:`score_episodes`.

    ``base`` defaults to ``prime_rl.orchestrator.algo.base.Algorithm``. Written against
    prime-rl 0.8.0's interface (``__init__(config, policy_pool)``, ``async score_group(episodes)``,
    ``action_loss_type = "rl"``); not run here (prime-rl needs Python 3.12 and CUDA).
    """
    parent: Any = base or importlib.import_module("prime_rl.orchestrator.algo.base").Algorithm

    class DrCreditAlgorithm(parent):  # type: ignore[misc]
        """Group-relative credit from DrCredit: per-turn advantages on every sampled token."""

        action_loss_type = "rl"

        def __init__(self, config: Any, policy_pool: Any) -> None:
            super().__init__(config, policy_pool)
            self.drcredit = settings or DrCreditSettings.from_config()

        async def score_group(self, episodes: list[Any]) -> None:
            await asyncio.to_thread(score_episodes, episodes, self.drcredit)

    DrCreditAlgorithm.__module__ = __name__
    DrCreditAlgorithm.__qualname__ = "DrCreditAlgorithm"
    return DrCreditAlgorithm


def install(name: str = "grpo", settings: DrCreditSettings | None = None) -> type:
    """Put :func:`build_algorithm`'s class in prime-rl's ``ALGORITHM_CLASSES`` under ``name``.

    prime-rl has no registry for user algorithms; a run keeps ``[orchestrator.algo] type =
    "grpo"`` and the orchestrator process builds DrCredit's algorithm instead (call this in
    that process before the orchestrator starts, as :func:`main` does). Not run here.
    """
    algo: Any = importlib.import_module("prime_rl.orchestrator.algo")
    cls = build_algorithm(algo.Algorithm, settings)
    algo.ALGORITHM_CLASSES[name] = cls
    return cls


def main() -> None:
    """``python -m drcredit.trainers.prime_rl @ orchestrator.toml``: prime-rl's orchestrator with
    DrCredit in place of GRPO (the arguments are the ``orchestrator`` command's). Not run here."""
    install()
    importlib.import_module("prime_rl.entrypoints.orchestrator").main()


if __name__ == "__main__":
    main()
