"""SkyRL adapter: DrCredit's per-turn advantages through SkyRL's own extension points.

Targets **skyrl 0.3.0** (``skyrl.train`` and ``skyrl.backends.skyrl_train``; the pieces used
here are unchanged in 0.4.0). Nothing here imports skyrl, torch or ray at module import
time; :func:`register` and :data:`DrCreditGenerator` do, when used.

Two pieces, both SkyRL extension points:

1. **The generator** (:data:`DrCreditGenerator`, a ``GeneratorInterface`` wrapping yours,
   typically the ``SkyRLGymGenerator`` that ``BasePPOExp.get_generator`` makes). After each
   training generation it builds one group per prompt (``TrajectoryID.instance_id``, SkyRL's
   uid; rollout ids ``r{repetition_id}``), reads each trajectory's turns (the messages a
   SkyRL-Gym env reports as ``get_metrics()["drcredit_messages"]``, else the response tokens
   decoded run by run: :func:`drcredit.trainers.segments.record_from_tokens`), takes the
   question and rubrics from the prompt's ``env_extras`` and the outcome reward from the
   trajectory's reward (a turn-level env's per-token rewards add up to it), scores the step
   and replaces ``rewards`` by **per-token rewards that are the advantages**: every policy
   token of a turn (``loss_mask`` 1) carries that turn's advantage, every other token 0.
   An EOS token SkyRL appends follows its ``loss_mask``: in single-turn mode
   (``use_conversation_multi_turn=false``) it is appended with mask 1 after the last
   generation, so it carries the last turn's advantage; in multi-turn mode (after a stop
   string) its mask is 0, so it gets 0. Turns the service left out (``on_judge_failure:
   exclude``) leave ``loss_masks``. A trajectory cut by its turn budget right after a tool
   call keeps that call's response when the env returned one (SkyRL leaves it out of the
   tokens; :func:`drcredit.trainers.skyrl_stream.watching` keeps it). With a
   ``SkyRLGymGenerator`` the trajectories are posted as they finish (a streaming group per
   prompt), so judging overlaps generation (:mod:`drcredit.trainers.skyrl_stream`).
   Evaluation generations pass through untouched.
2. **The estimator** ``drcredit`` (``trainer.algorithm.advantage_estimator=drcredit``), in
   SkyRL's ``AdvantageEstimatorRegistry``: it returns the per-token rewards as advantages
   and returns (``rewards * response_mask``), refuses rows the generator did not score and
   refuses ``use_kl_in_reward`` (a KL penalty folded into the rewards would change the
   service's advantages; use ``use_kl_loss``).

Python 3.11: skyrl 0.3.0 declares it, but its ``skyrl.tinker.types`` (under every
``skyrl.backends`` and ``skyrl.train.generators`` import) puts a ``typing.TypedDict`` in a
pydantic model, which pydantic refuses below Python 3.12 (``PydanticUserError``).
:func:`import_skyrl` imports skyrl modules so that they load there too; :func:`register`
and :data:`DrCreditGenerator` go through it, so call :func:`register` before importing
``skyrl.train.entrypoints`` (as ``examples/skyrl/main_drcredit.py`` does).

Configuration: a :class:`DrCreditSettings` (default from the environment: ``DRCREDIT_URL``,
``DRCREDIT_API_KEY``, ``DRCREDIT_WAIT_TIMEOUT_S``, ``DRCREDIT_UNREACHABLE_TIMEOUT_S``,
``DRCREDIT_ID_PREFIX``, ``DRCREDIT_RUN``).
"""

from __future__ import annotations

import asyncio
import importlib
import re
import sys
import typing
from collections.abc import Sequence
from typing import Any

from drcredit.recent import Recent
from drcredit.trainers import skyrl_stream
from drcredit.trainers.scoring import ScoredBatch, score_step
from drcredit.trainers.settings import DrCreditSettings
from drcredit.trainers.skyrl_rows import MESSAGES_KEY, apply_scores, rows_from_output, training_step

__all__ = [
    "ESTIMATOR_NAME",
    "MESSAGES_KEY",
    "TARGET_SKYRL_VERSION",
    "drcredit_advantage",
    "import_skyrl",
    "register",
    "rows_from_output",
]

TARGET_SKYRL_VERSION = "0.3.0"
#: ``trainer.algorithm.advantage_estimator`` value.
ESTIMATOR_NAME = "drcredit"
_PAD_UID = re.compile(r"pad\d+")

#: uids whose rows the generator scored lately (the estimator refuses others); bounded.
_SCORED_UIDS_KEPT = 100_000
_SCORED_UIDS: Recent[str, bool] = Recent(size=_SCORED_UIDS_KEPT)


def _remember(uids: Sequence[str]) -> None:
    for uid in uids:
        _SCORED_UIDS.put(uid, True)


# ----------------------------------------------------------------------------- importing skyrl

_TINKER_TYPES = "skyrl.tinker.types"


def import_skyrl(module: str) -> Any:
    """Import a skyrl module, on Python 3.11 too (see the module doc).

    Below Python 3.12, ``skyrl.tinker.types`` is first imported with
    ``typing_extensions.TypedDict`` standing in for ``typing.TypedDict`` (the class pydantic
    accepts there), and ``typing`` is given its own back at once; nothing else changes.
    """
    if sys.version_info < (3, 12) and _TINKER_TYPES not in sys.modules:
        import typing_extensions  # pydantic's own dependency

        original = typing.TypedDict
        typing.TypedDict = typing_extensions.TypedDict
        try:
            importlib.import_module(_TINKER_TYPES)
        finally:
            typing.TypedDict = original
    return importlib.import_module(module)


# ----------------------------------------------------------------------------- the estimator


def drcredit_advantage(
    token_level_rewards: Any, response_mask: Any, index: Any = None, config: Any = None, **kwargs: Any
) -> tuple[Any, Any]:
    """The ``drcredit`` advantage estimator, with SkyRL's estimator signature.

    The rewards are already the service's per-token advantages (written by
    :data:`DrCreditGenerator`); they are returned as advantages and returns, masked to the
    response. ``index`` holds the rows' uids: a row the generator did not score means the
    generator was not wrapped, and training on raw rewards as advantages is refused.
    """
    if config is not None and getattr(config, "use_kl_in_reward", False):
        raise ValueError(
            f"advantage_estimator={ESTIMATOR_NAME!r} takes the service's advantages as the per-token rewards; "
            "use_kl_in_reward would subtract a KL penalty from them. Use trainer.algorithm.use_kl_loss instead"
        )
    uids = [str(u) for u in (index if index is not None else [])]
    unknown = [u for u in uids if u not in _SCORED_UIDS and not _PAD_UID.fullmatch(u)]
    if unknown:
        raise RuntimeError(
            f"the {ESTIMATOR_NAME!r} advantage estimator got rows that DrCreditGenerator did not score "
            f"(uids {sorted(set(unknown))[:3]}...): return DrCreditGenerator(...) from your experiment's "
            "get_generator, or the raw rewards would be trained as advantages"
        )
    advantages = token_level_rewards * response_mask.to(token_level_rewards.dtype)
    return advantages, advantages.clone()


def register() -> Any:
    """Register :func:`drcredit_advantage` in SkyRL's ``AdvantageEstimatorRegistry`` (idempotent).

    Call it in the driver before the trainer is built (``BasePPOExp.__init__`` or your
    entrypoint); with Ray initialized, SkyRL's registry shares it with the workers.
    """
    ppo_utils = import_skyrl("skyrl.backends.skyrl_train.utils.ppo_utils")
    registry = ppo_utils.AdvantageEstimatorRegistry
    if ESTIMATOR_NAME in registry.list_available():
        current = registry.get(ESTIMATOR_NAME)
        if getattr(current, "__wrapped__", current) is not drcredit_advantage:
            raise ValueError(f"another advantage estimator is registered as {ESTIMATOR_NAME!r}: {current!r}")
        return current
    ppo_utils.register_advantage_estimator(ESTIMATOR_NAME)(drcredit_advantage)
    return registry.get(ESTIMATOR_NAME)


# ----------------------------------------------------------------------------- the generator


def _build_generator() -> type:
    base_module = import_skyrl("skyrl.train.generators.base")
    base: Any = base_module.GeneratorInterface

    class DrCreditGenerator(base):  # type: ignore[misc]
        """A ``GeneratorInterface`` whose training outputs carry DrCredit's per-token advantages.

        ``DrCreditGenerator(inner, tokenizer=tokenizer, settings=DrCreditSettings(...),
        client=None, stream=True)``: ``inner`` is the generator to wrap (its outputs are
        kept, only ``rewards``, ``loss_masks`` and ``rollout_metrics`` change); ``stream``
        posts each trajectory as soon as it ends when ``inner`` runs SkyRL's ``agent_loop``.
        """

        def __init__(
            self,
            inner: Any,
            *,
            tokenizer: Any = None,
            settings: DrCreditSettings | None = None,
            client: Any = None,
            stream: bool = True,
        ) -> None:
            self.inner = inner
            self.tokenizer = tokenizer if tokenizer is not None else getattr(inner, "tokenizer", None)
            self.settings = settings or DrCreditSettings.from_config()
            self.client = client
            self.stream = stream and callable(getattr(inner, "agent_loop", None))
            cfg = getattr(inner, "generator_cfg", None)
            if cfg is not None and getattr(cfg, "step_wise_trajectories", False):
                raise ValueError(
                    "DrCreditGenerator scores whole trajectories: set generator.step_wise_trajectories=false"
                )
            #: the last training step's scoring (batch id, each trajectory's group id)
            self.last_scored: ScoredBatch | None = None

        async def generate(self, input_batch: Any, **kwargs: Any) -> Any:
            training, step = training_step(input_batch)
            if not training:
                return await self.inner.generate(input_batch, **kwargs)
            if self.stream:
                output, scored = await skyrl_stream.generate_streaming(self, input_batch, step, **kwargs)
            else:
                finals: dict[str, str] = {}
                if callable(getattr(self.inner, "agent_loop", None)):
                    with skyrl_stream.watching(self.inner) as finals:
                        output = await self.inner.generate(input_batch, **kwargs)
                else:
                    output = await self.inner.generate(input_batch, **kwargs)
                rows = rows_from_output(input_batch, output, self.tokenizer, self.settings, finals)
                scored = await asyncio.to_thread(score_step, rows, self.settings, client=self.client, step=step)
            self.last_scored = scored
            _remember([str(t.instance_id) for t in input_batch["trajectory_ids"]])
            return apply_scores(dict(output), scored)

    DrCreditGenerator.__module__ = __name__
    DrCreditGenerator.__qualname__ = "DrCreditGenerator"
    return DrCreditGenerator


_GENERATOR: type | None = None


def __getattr__(name: str) -> Any:
    """``DrCreditGenerator`` is built on first access (it subclasses skyrl's ``GeneratorInterface``)."""
    global _GENERATOR
    if name == "DrCreditGenerator":
        if _GENERATOR is None:
            _GENERATOR = _build_generator()
        return _GENERATOR
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
