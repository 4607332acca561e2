"""Streaming a SkyRL generation to the service: each trajectory posted the moment it ends.

SkyRL's ``SkyRLGymGenerator.generate`` runs one ``agent_loop`` per trajectory concurrently.
For the duration of one ``generate`` call the wrapped generator's ``agent_loop`` is wrapped
on the instance: when a trajectory ends, its rollout goes to its prompt's streaming group
(``open_group`` with ``expected_rollouts`` = the prompt's samples, then ``add_rollout``),
so the service judges it while the other trajectories are still being generated. After
``generate`` returns, the step waits for every group, under the same deadline as the batch
path (:class:`drcredit.trainers.service.StepDeadline`).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

from drcredit.trainers import service, skyrl_rows
from drcredit.trainers.records import question_and_rubrics, read_turn_record, record_spans
from drcredit.trainers.scoring import ScoredBatch, TokenRollout, safe_id, scored_from_documents
from drcredit.trainers.settings import DrCreditSettings


class GroupStream:
    """The streaming groups of one training step, one per prompt (uid)."""

    def __init__(self, generator: Any, client: Any, step: int | None, expected: Mapping[str, int]) -> None:
        self.generator = generator
        self.settings: DrCreditSettings = generator.settings
        self.client = client
        self.step = step
        self.expected = dict(expected)
        self.deadline = service.StepDeadline.for_step(
            self.settings, client, "training step" if step is None else f"training step {step}"
        )
        self.nonce = uuid.uuid4().hex[:8]
        self.group_ids: dict[str, str] = {}
        self.rows: dict[tuple[str, int], TokenRollout] = {}
        self.locks: collections.defaultdict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        #: the first error of a post (the step cannot be scored; raised by :meth:`finish`)
        self.failure: Exception | None = None

    def group_id(self, uid: str) -> str:
        step = "" if self.step is None else f"s{self.step}-"
        suffix = f"-{self.nonce}"
        return safe_id(f"{self.settings.id_prefix}{step}{uid}")[: 128 - len(suffix)] + suffix

    async def post(self, trajectory_id: Any, env_extras: Any, output: Any) -> None:
        """Turn one finished trajectory into its rollout and add it to its prompt's group."""
        uid, repetition = str(trajectory_id.instance_id), int(trajectory_id.repetition_id)
        where = f"trajectory {uid}_{repetition}"
        record = read_turn_record(
            skyrl_rows.trajectory_record(
                output.response_ids, output.loss_mask, output.env_metrics, self.generator.tokenizer, self.settings
            ),
            where,
        )
        question, rubrics = question_and_rubrics([env_extras], where, "env_extras")
        reward = skyrl_rows.outcome_reward(output.reward)
        cfg = getattr(self.generator.inner, "generator_cfg", None)
        if cfg is not None and getattr(cfg, "zero_reward_on_non_stop", False) and output.stop_reason != "stop":
            reward = 0.0  # what SkyRL's generate does to such a reward after the agent loop
        row = TokenRollout(
            group_key=uid,
            rollout_id=f"r{repetition}",
            question=question,
            rubrics=rubrics,
            turns=record["turns"],
            spans=record_spans(record),
            policy_mask=np.asarray(output.loss_mask, dtype=np.int64),
            outcome_reward=reward,
        )
        self.rows[(uid, repetition)] = row
        rollout: dict[str, Any] = {"id": row.rollout_id, "turns": row.turns}
        if (self.settings.params or {}).get("outcome_source") != "judge":
            rollout["outcome_reward"] = reward
        async with self.locks[uid]:
            if uid not in self.group_ids:
                group_id = self.group_id(uid)
                opened = functools.partial(
                    self.client.open_group,
                    question,
                    rubrics,
                    self.expected[uid],
                    group_id=group_id,
                    rollouts=[rollout],
                    params=self.settings.params,
                    metadata=self.settings.metadata(self.step),
                )
                await asyncio.to_thread(self.deadline.call, opened, f"opening group {group_id}")
                self.group_ids[uid] = group_id
            else:
                group_id = self.group_ids[uid]
                added = functools.partial(self.client.add_rollout, group_id, rollout)
                await asyncio.to_thread(self.deadline.call, added, f"adding {row.rollout_id} to group {group_id}")

    async def finish(self, trajectory_ids: list[Any]) -> ScoredBatch:
        """Wait for every group and spread the advantages over each row's tokens, in batch order."""
        if self.failure is not None:
            raise self.failure
        documents: dict[str, dict[str, Any]] = {}
        for group_id in self.group_ids.values():
            waited = functools.partial(self._wait, group_id)
            documents[group_id] = await asyncio.to_thread(self.deadline.call, waited, f"waiting for group {group_id}")
        rows = [self.rows[(str(t.instance_id), int(t.repetition_id))] for t in trajectory_ids]
        return scored_from_documents(rows, [self.group_ids[r.group_key] for r in rows], documents)

    def _wait(self, group_id: str) -> dict[str, Any]:
        document: dict[str, Any] = self.client.wait_for_advantages(
            group_id, timeout=self.deadline.remaining(), progress=self.settings.progress
        )
        return document


async def generate_streaming(
    generator: Any, input_batch: Any, step: int | None, **kwargs: Any
) -> tuple[Any, ScoredBatch]:
    """Run the wrapped generator with its trajectories streamed to the service; return its
    output and the step's scoring."""
    trajectory_ids = input_batch.get("trajectory_ids")
    if not trajectory_ids:
        raise ValueError("DrCreditGenerator needs input_batch['trajectory_ids'] to form groups")
    expected = collections.Counter(str(t.instance_id) for t in trajectory_ids)
    small = sorted(uid for uid, n in expected.items() if n < 2)
    if small:
        raise ValueError(f"prompts {small[:3]} have one sample: DrCredit needs n_samples_per_prompt >= 2")
    own = generator.client is None
    client = service.make_client(generator.settings) if own else generator.client
    inner = generator.inner
    stream = GroupStream(generator, client, step, expected)
    original = inner.agent_loop

    async def agent_loop(*args: Any, **loop_kwargs: Any) -> Any:
        output = await original(*args, **loop_kwargs)
        if stream.failure is None:  # after a failure the step is lost: let generation end, then raise
            env_extras = args[2] if len(args) > 2 else loop_kwargs.get("env_extras")
            try:
                await stream.post(loop_kwargs.get("trajectory_id"), env_extras, output)
            except Exception as exc:  # noqa: BLE001 (re-raised by finish, once generation has ended)
                stream.failure = exc
        return output

    inner.agent_loop = agent_loop
    try:
        output = await inner.generate(input_batch, **kwargs)
        return output, await stream.finish(list(trajectory_ids))
    finally:
        del inner.agent_loop  # the class's own method again
        if own:
            client.close()
