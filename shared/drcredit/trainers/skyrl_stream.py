"""Streaming a SkyRL generation to the service: each trajectory posted the moment it ends.

SkyRL's ``SkyRLGymGenerator.generate`` runs one ``agent_loop`` per trajectory concurrently.
For the duration of one ``generate`` call the wrapped generator's ``agent_loop`` is wrapped
on the instance: when a trajectory ends, its rollout goes to its prompt's streaming group
(``open_group`` with ``expected_rollouts`` = the prompt's samples, then ``add_rollout``),
so the service judges it while the other trajectories are still being generated. After
``generate`` returns, the step waits for every group, under the same deadline as the batch
path (:class:`drcredit.trainers.service.StepDeadline`).

Both paths watch the wrapped generator's env steps (:func:`watching`): SkyRL leaves the
observation of the step that ends a trajectory out of ``response_ids``, so a trajectory cut
by its turn budget right after a tool call would lose that call's response; the watcher
keeps it for the trajectory's turns.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
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

    async def post(self, trajectory_id: Any, env_extras: Any, output: Any, final_observation: str | None) -> None:
        """Turn one finished trajectory into its rollout and add it to its prompt's group."""
        uid, repetition = str(trajectory_id.instance_id), int(trajectory_id.repetition_id)
        where = f"trajectory {uid}_{repetition}"
        record = read_turn_record(
            skyrl_rows.trajectory_record(
                output.response_ids,
                output.loss_mask,
                output.env_metrics,
                self.generator.tokenizer,
                self.settings,
                final_observation,
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


_TRAJECTORY: contextvars.ContextVar[str | None] = contextvars.ContextVar("drcredit_skyrl_trajectory", default=None)

AfterLoop = Callable[[Any, Any, Any, "str | None"], Awaitable[None]]


@contextlib.contextmanager
def watching(inner: Any, after: AfterLoop | None = None) -> Iterator[dict[str, str]]:
    """For one ``generate`` call of a ``SkyRLGymGenerator``: each trajectory's final observation.

    Yields a dict filled as trajectories end: by :func:`skyrl_rows.trajectory_key`, the text
    of the observations the env returned with ``done`` (SkyRL drops them from the response).
    Env steps are seen through the generator's ``_run_in_executor_if_available`` and tied to
    their trajectory by a context variable set in its ``agent_loop`` (each agent loop runs in
    a task of its own). ``after(trajectory_id, env_extras, output, final_observation)`` runs
    when a trajectory ends (the streaming path posts it there).
    """
    finals: dict[str, str] = {}
    loop = inner.agent_loop
    run = getattr(inner, "_run_in_executor_if_available", None)

    async def agent_loop(*args: Any, **kwargs: Any) -> Any:
        trajectory_id = kwargs.get("trajectory_id")
        key = None if trajectory_id is None else skyrl_rows.trajectory_key(trajectory_id)
        token = _TRAJECTORY.set(key)
        try:
            output = await loop(*args, **kwargs)
        finally:
            _TRAJECTORY.reset(token)
        if after is not None:
            env_extras = args[2] if len(args) > 2 else kwargs.get("env_extras")
            await after(trajectory_id, env_extras, output, finals.get(key or ""))
        return output

    async def run_watched(func: Any, *args: Any, **kwargs: Any) -> Any:
        assert run is not None
        result = await run(func, *args, **kwargs)
        key = _TRAJECTORY.get()
        if key is not None and getattr(func, "__name__", "") == "step" and isinstance(result, Mapping):
            text = observation_text(result.get("observations")) if result.get("done") else ""
            if text:
                finals[key] = text
        return result

    inner.agent_loop = agent_loop
    if callable(run):
        inner._run_in_executor_if_available = run_watched
    try:
        yield finals
    finally:
        del inner.agent_loop  # the class's own methods again
        if callable(run):
            del inner._run_in_executor_if_available


def observation_text(observations: Any) -> str:
    """The text of an env step's observation messages."""
    parts = []
    for message in observations or []:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str) and content.strip():
            parts.append(content)
    return "\n".join(parts)


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
    stream = GroupStream(generator, client, step, expected)

    async def post(trajectory_id: Any, env_extras: Any, output: Any, final_observation: str | None) -> None:
        if stream.failure is None:  # after a failure the step is lost: let generation end, then raise
            try:
                await stream.post(trajectory_id, env_extras, output, final_observation)
            except Exception as exc:  # noqa: BLE001 (re-raised by finish, once generation has ended)
                stream.failure = exc

    try:
        with watching(generator.inner, post):
            output = await generator.inner.generate(input_batch, **kwargs)
        return output, await stream.finish(list(trajectory_ids))
    finally:
        if own:
            client.close()
