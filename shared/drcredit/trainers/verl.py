"""VeRL adapter: DrCredit's per-turn advantages as a VeRL advantage estimator named ``drcredit``.

Targets **verl 0.9.1** (``verl.trainer.ppo.core_algos.register_adv_est``, the agent loop of
``verl.experimental.agent_loop``, and the v1 trainers of ``verl.trainer.ppo.v1``). Nothing here
imports verl, torch or transfer_queue at module import time; :func:`register` does, when called.

Three pieces, all selected by name from VeRL's own registries once :func:`register` has run
in the process (see ``docs/trainers.md``; the ``verl.plugins`` entry point or
``VERL_USE_EXTERNAL_MODULES=drcredit.trainers.verl`` runs it in every VeRL process):

1. **Recording turns** (rollout workers). The agent loop ``drcredit_tool_agent``
   (:data:`DrCreditToolAgentLoop`, a ``ToolAgentLoop``) records, per assistant generation, its
   half-open token span in the response, and at the end converts the conversation into API
   turns (kind ``search`` / ``visit`` / ``tool`` / ``answer``, queries, URLs, search results,
   pages) with :func:`drcredit.trainers.converters.from_chat_messages`. The result goes into
   the sample's ``extra_fields`` under :data:`TURNS_KEY` (``"drcredit_turns"``), which VeRL
   turns into ``non_tensor_batch["drcredit_turns"]``. Its format is :func:`make_turn_record`;
   a custom agent loop can write the same record itself.
2. **Scoring** (driver). :func:`compute_drcredit_advantage` takes a ``DataProto``: groups are
   ``non_tensor_batch["uid"]``, the policy-token mask is ``batch["response_mask"]``, outcome
   rewards are ``batch["token_level_rewards"].sum(-1)`` (the same scalar VeRL's GRPO uses) unless
   given. It builds one group per uid, posts them as one batch, waits, and fills
   ``batch["advantages"]`` and ``batch["returns"]`` (equal, as for GRPO) token by token with
   :func:`drcredit.trainers.tokens.broadcast_advantages`.
3. **Selection by name**. ``algorithm.adv_estimator=drcredit`` finds :func:`drcredit_advantage`
   through ``core_algos.get_adv_estimator_fn``. verl 0.9.1 hands a registered estimator only
   tensors and ``index`` (the uids), not ``non_tensor_batch`` (only GDPO gets that), so the
   turns reach the estimator in one of three ways: a ``non_tensor_batch`` keyword (what
   GDPO gets, and what a later VeRL may pass to every estimator that accepts it), an
   enclosing :func:`batch_context`, or, in the v1 trainers, the trainer modes
   ``drcredit_sync`` / ``drcredit_colocate_async`` / ``drcredit_separate_async`` registered here
   (``trainer.v1.trainer_mode=drcredit_sync``): subclasses whose ``_compute_advantage`` reads
   the samples' ``extra_fields`` from the TransferQueue and opens that context.

Configuration: ``algorithm.drcredit.*`` (``base_url``, ``api_key``, ``timeout_s``,
``id_prefix``, ``params``, ``search_tools``, ``visit_tools``), else the environment
(``DRCREDIT_URL``, ``DRCREDIT_API_KEY``, ``DRCREDIT_WAIT_TIMEOUT_S``, ``DRCREDIT_ID_PREFIX``).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import itertools
import math
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from drcredit.trainers.records import (
    TURNS_KEY,
    conversation_record,
    make_turn_record,
    question_and_rubrics,
    read_turn_record,
    record_spans,
)
from drcredit.trainers.scoring import (
    ScoredBatch,
    TokenRollout,
    safe_id,
    score_step,
    score_token_rollouts,
    token_values,
)
from drcredit.trainers.settings import DrCreditSettings, plain_value
from drcredit.trainers.verl_agent_loop import build_agent_loop

__all__ = [
    "AGENT_LOOP_NAME",
    "ESTIMATOR_NAME",
    "ROW_ID_KEY",
    "TARGET_VERL_VERSION",
    "TRAINER_MODE_PREFIX",
    "TURNS_KEY",
    "DrCreditSettings",
    "ScoredBatch",
    "TokenRollout",
    "batch_context",
    "compute_drcredit_advantage",
    "conversation_record",
    "drcredit_advantage",
    "make_turn_record",
    "read_turn_record",
    "register",
    "score_token_rollouts",
    "token_values",
]

TARGET_VERL_VERSION = "0.9.1"
#: Optional ``non_tensor_batch`` key: a stable id per row, used as the rollout id.
ROW_ID_KEY = "drcredit_row_id"
#: ``algorithm.adv_estimator`` value.
ESTIMATOR_NAME = "drcredit"
#: agent loop name (``actor_rollout_ref.rollout.agent.default_agent_loop`` or a dataset's ``agent_name``).
AGENT_LOOP_NAME = "drcredit_tool_agent"
#: ``trainer.v1.trainer_mode`` of the v1 trainers that feed the estimator: this prefix + a VeRL mode name.
TRAINER_MODE_PREFIX = "drcredit_"

_CONTEXT: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar("drcredit_verl_batch", default=None)


# ----------------------------------------------------------------------------- VeRL batches


@contextlib.contextmanager
def batch_context(non_tensor_batch: Mapping[str, Any]) -> Iterator[None]:
    """Make ``non_tensor_batch`` visible to :func:`drcredit_advantage` called inside the block.

    verl 0.9.1's ``compute_advantage`` passes a registered estimator no non-tensor data, so a
    trainer that calls it wraps the call: ``with batch_context(data.non_tensor_batch):
    compute_advantage(data, adv_estimator="drcredit", ...)``. The v1 trainer modes registered
    by :func:`register` do this for you.
    """
    token = _CONTEXT.set(non_tensor_batch)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def drcredit_advantage(
    token_level_rewards: Any,
    response_mask: Any,
    index: Any = None,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """The ``drcredit`` advantage estimator, with VeRL's estimator signature.

    Returns ``(advantages, returns)``, both ``(batch, response_length)`` float tensors on the
    device and dtype of ``token_level_rewards``; tool-observation and padding tokens get 0.
    ``index`` holds the uids. The turn records come from ``non_tensor_batch`` or the
    enclosing :func:`batch_context`.
    """
    torch = importlib.import_module("torch")
    non_tensor = non_tensor_batch if non_tensor_batch is not None else _CONTEXT.get()
    if non_tensor is None or TURNS_KEY not in non_tensor:
        raise RuntimeError(
            f"the {ESTIMATOR_NAME!r} advantage estimator needs the samples' {TURNS_KEY!r} records, but VeRL "
            "passed none: use trainer.v1.trainer_mode=drcredit_sync (or another drcredit_* mode), or call "
            "VeRL's compute_advantage inside drcredit.trainers.verl.batch_context(data.non_tensor_batch)"
        )
    uids = index if index is not None else non_tensor.get("uid")
    if uids is None:
        raise RuntimeError("no group ids: VeRL passes non_tensor_batch['uid'] as `index`")
    rewards = token_level_rewards.detach().float().sum(dim=-1).cpu().numpy()
    values, keep = _verl_advantages(
        uids, response_mask, non_tensor, rewards, DrCreditSettings.from_config(config), None
    )
    _leave_out(response_mask, keep)
    advantages = torch.as_tensor(values, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
    advantages = advantages * response_mask.to(advantages.dtype)
    return advantages, advantages.clone()


def _leave_out(response_mask: Any, keep: npt.NDArray[np.bool_] | None) -> None:
    """Mask the tokens of turns the service left out (``on_judge_failure: exclude``) out of
    the loss, in the batch's own ``response_mask`` (VeRL's policy loss reads that tensor)."""
    if keep is None:
        return
    torch = importlib.import_module("torch")
    response_mask.mul_(torch.as_tensor(keep, device=response_mask.device).to(response_mask.dtype))


def compute_drcredit_advantage(
    data: Any,
    *,
    config: Any = None,
    settings: DrCreditSettings | None = None,
    client: Any = None,
    outcome_rewards: npt.ArrayLike | None = None,
) -> Any:
    """Fill ``data.batch["advantages"]`` and ``["returns"]`` of a VeRL ``DataProto``; return ``data``.

    Needs ``non_tensor_batch["uid"]`` and ``[TURNS_KEY]``, ``batch["response_mask"]``, and
    ``batch["token_level_rewards"]`` unless ``outcome_rewards`` (one float per row) is given.
    ``client`` defaults to a :class:`drcredit.client.DrCreditClient` made from ``settings``
    (default: :meth:`DrCreditSettings.from_config` of ``config``).
    """
    torch = importlib.import_module("torch")
    mask = data.batch["response_mask"]
    if outcome_rewards is None:
        rewards = data.batch["token_level_rewards"].detach().float().sum(dim=-1).cpu().numpy()
    else:
        rewards = np.asarray(outcome_rewards, dtype=np.float64)
    values, keep = _verl_advantages(
        data.non_tensor_batch["uid"],
        mask,
        data.non_tensor_batch,
        rewards,
        settings or DrCreditSettings.from_config(config),
        client,
        _global_step(data),
    )
    _leave_out(mask, keep)
    advantages = torch.as_tensor(values, dtype=torch.float32, device=mask.device) * mask.to(torch.float32)
    data.batch["advantages"] = advantages
    data.batch["returns"] = advantages.clone()
    return data


#: The step of a batch scored without VeRL's ``global_steps``: this process's count.
_BATCHES_SCORED = itertools.count()


def _global_step(data: Any) -> int | None:
    """VeRL's training step, from the batch's ``meta_info`` when it carries one."""
    step = (getattr(data, "meta_info", None) or {}).get("global_steps")
    return int(step) if isinstance(step, (int, np.integer)) else None


def _verl_advantages(
    uids: Any,
    response_mask: Any,
    non_tensor: Mapping[str, Any],
    rewards: npt.NDArray[Any],
    settings: DrCreditSettings,
    client: Any,
    step: int | None = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_] | None]:
    """Per-token advantages, and the policy tokens to keep in the loss (None: all of them)."""
    mask = np.asarray(response_mask.detach().cpu().numpy() if hasattr(response_mask, "detach") else response_mask)
    if mask.ndim != 2:
        raise ValueError(f"response_mask must be (batch, response_length), got shape {mask.shape}")
    rows = _rows(list(np.asarray(uids, dtype=object)), mask, non_tensor, rewards)
    scored = score_step(rows, settings, client=client, step=step if step is not None else next(_BATCHES_SCORED))
    values, keep = scored.padded(mask.shape[1])
    return values, (keep if scored.excluded_tokens else None)


def _rows(
    uids: list[Any], mask: npt.NDArray[Any], non_tensor: Mapping[str, Any], rewards: npt.NDArray[Any]
) -> list[TokenRollout]:
    n = len(uids)
    if mask.shape[0] != n or len(rewards) != n:
        raise ValueError(f"batch sizes differ: {n} uids, {mask.shape[0]} mask rows, {len(rewards)} rewards")
    records = non_tensor[TURNS_KEY]
    extra_info = non_tensor.get("extra_info")
    row_ids = non_tensor.get(ROW_ID_KEY)
    counters: dict[str, int] = {}
    rows = []
    for b in range(n):
        key = str(uids[b])
        where = f"row {b} (uid {key})"
        record = read_turn_record(records[b], where)
        info = plain_value(extra_info[b]) if extra_info is not None else None
        question, rubrics = _question_and_rubrics(record, info, where)
        position = counters.get(key, 0)
        counters[key] = position + 1
        rollout_id = safe_id(str(row_ids[b])) if row_ids is not None else f"r{position}"
        reward = float(rewards[b])
        if not math.isfinite(reward):
            raise ValueError(f"{where}: outcome reward is not finite ({reward})")
        rows.append(
            TokenRollout(
                group_key=key,
                rollout_id=rollout_id,
                question=question,
                rubrics=rubrics,
                turns=record["turns"],
                spans=record_spans(record),
                policy_mask=mask[b],
                outcome_reward=reward,
            )
        )
    return rows


def _question_and_rubrics(record: Mapping[str, Any], info: Any, where: str) -> tuple[str, list[dict[str, Any]]]:
    return question_and_rubrics([record, info], where, "extra_info")


# ----------------------------------------------------------------------------- v1 trainers (driver)


def _build_trainer_classes() -> dict[str, type]:
    trainer_base = importlib.import_module("verl.trainer.ppo.v1.trainer_base")
    importlib.import_module("verl.trainer.ppo.v1")  # registers VeRL's own modes
    tq = importlib.import_module("transfer_queue")

    class _FeedTurns:
        """Reads the samples' turn records from the TransferQueue around ``_compute_advantage``."""

        config: Any

        def _compute_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
            parent: Any = super()
            if str(self.config.algorithm.adv_estimator) != ESTIMATOR_NAME:
                return parent._compute_advantage(batch, metrics)
            # the agent loop's extra_fields and the prompt's extra_info are stored with each sample
            fields = ["extra_fields", "extra_info"]
            rows = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
            extra = list(rows["extra_fields"])  # a list of per-sample dicts
            non_tensor: dict[str, Any] = {
                TURNS_KEY: np.array([(e or {}).get(TURNS_KEY) for e in extra], dtype=object),
                # keys are {uid}_{session}_{output}: the rollout id is the session and output
                ROW_ID_KEY: np.array(["s" + "-o".join(str(k).rsplit("_", 2)[1:]) for k in batch.keys], dtype=object),
            }
            if "extra_info" in rows:
                non_tensor["extra_info"] = np.array(list(rows["extra_info"]), dtype=object)
            with batch_context(non_tensor):
                return parent._compute_advantage(batch, metrics)

    made: dict[str, type] = {}
    for name, base in list(trainer_base.TRAINER_REGISTRY.items()):
        if name.startswith(TRAINER_MODE_PREFIX):
            continue
        mode = TRAINER_MODE_PREFIX + name
        existing = trainer_base.TRAINER_REGISTRY.get(mode)
        if existing is not None:
            made[mode] = existing
            continue
        cls = type(f"DrCredit{base.__name__}", (_FeedTurns, base), {"__module__": __name__})
        made[mode] = trainer_base.register_trainer(mode)(cls)
    return made


# ----------------------------------------------------------------------------- registration

_AGENT_LOOP: type | None = None


def register() -> dict[str, Any]:
    """Register the estimator, the agent loop and the v1 trainer modes in VeRL's registries.

    Idempotent. Pieces whose VeRL modules cannot be imported in this process (e.g. the v1
    trainers without ``transfer_queue``) are skipped and reported as the exception.
    """
    global _AGENT_LOOP
    done: dict[str, Any] = {}
    core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
    current = core_algos.ADV_ESTIMATOR_REGISTRY.get(ESTIMATOR_NAME)
    if current is None:
        core_algos.register_adv_est(ESTIMATOR_NAME)(drcredit_advantage)
    elif getattr(current, "__module__", None) != __name__:
        raise ValueError(f"another advantage estimator is registered as {ESTIMATOR_NAME!r}: {current!r}")
    done["estimator"] = core_algos.get_adv_estimator_fn(ESTIMATOR_NAME)
    try:
        agent_loop = importlib.import_module("verl.experimental.agent_loop.agent_loop")
        if _AGENT_LOOP is None:
            _AGENT_LOOP = build_agent_loop()
        agent_loop.register(AGENT_LOOP_NAME)(_AGENT_LOOP)
        done["agent_loop"] = _AGENT_LOOP
    except ImportError as exc:
        done["agent_loop"] = exc
    try:
        done["trainers"] = _build_trainer_classes()
    except ImportError as exc:
        done["trainers"] = exc
    return done


def __getattr__(name: str) -> Any:
    """``DrCreditToolAgentLoop`` is built on first access, so hydra can locate it by path."""
    global _AGENT_LOOP
    if name == "DrCreditToolAgentLoop":
        if _AGENT_LOOP is None:
            _AGENT_LOOP = build_agent_loop()
        return _AGENT_LOOP
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_when_loaded_by_verl() -> None:
    """Imported by VeRL's plugin loader or ``VERL_USE_EXTERNAL_MODULES``: register at once."""
    if "verl" in sys.modules and os.environ.get("DRCREDIT_VERL_AUTOREGISTER", "1") != "0":
        with contextlib.suppress(ImportError):
            register()


_register_when_loaded_by_verl()
