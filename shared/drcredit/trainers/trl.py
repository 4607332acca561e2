"""TRL adapter: a ``GRPOTrainer`` whose advantages are DrCredit's, token by token.

Targets **trl 1.16.0** (with transformers 5.x). trl, torch and accelerate are imported only
when :data:`DrCreditGRPOTrainer` is first accessed (``from drcredit.trainers.trl import
DrCreditGRPOTrainer``), so this module imports without them.

How it hooks in (all three are ``GRPOTrainer`` methods of the installed version):

* ``_generate`` returns, per sample, the completion as chat messages (``assistant`` messages
  with parsed ``tool_calls`` and the ``tool`` messages of TRL's own multi-turn tool loop,
  ``tools=[...]`` / ``environment_factory``) and the ``tool_mask`` (1 = policy token, 0 = tool
  result token). The subclass keeps both: each maximal run of policy tokens is one assistant
  generation, in order, so the ``k``-th assistant message's turns get the ``k``-th run as their
  span. With a user ``rollout_func`` (no built-in tool loop), the function returns its own
  ``env_mask`` and, under ``"drcredit_turns"``, one turn record per sample
  (:func:`drcredit.trainers.scoring.make_turn_record`: API turns and their token spans in the
  completion); when it returns none, the decoded completion is one ``answer`` turn.
* ``_calculate_rewards`` returns the reward functions' outputs for the whole (gathered) batch;
  the outcome reward of a completion is their weighted sum (``reward_weights``), as TRL sums
  them before normalizing.
* ``_generate_and_score_completions`` returns the batch dict whose ``"advantages"`` is one value
  per completion, shape ``(B,)``. The subclass posts the step's groups (``num_generations``
  consecutive completions of the gathered batch = one group) to the service, waits, and
  replaces ``"advantages"`` by a ``(B, T)`` tensor aligned with ``"completion_ids"``: every
  policy token of a turn carries that turn's advantage, tool-result and padding tokens 0.
  TRL 1.16's ``_compute_loss`` takes ``(B, T)`` advantages as they are (it unsqueezes only
  ``(B,)``), so the clipped surrogate is per token.

Question and rubrics come from the dataset row: columns ``question`` and ``rubrics`` (a list
of rubric objects or its JSON text), or a ``drcredit`` column holding both; without a
``question`` column the last user message of the prompt is the question.

Caveats (see ``docs/trainers.md``): ``scale_rewards`` and ``multi_objective_aggregation`` no
longer shape the advantages (the service normalizes, docs/method.md, "Advantages"); TRL's logged
``advantages`` column is its own, computed before the replacement; ``off_policy_mask_threshold``
and ``loss_type="vespo"`` decide per token (by the sign of the token's turn advantage) instead
of per sequence; any loss kernel that takes one advantage per sequence (a fused/Liger GRPO
loss, ``use_liger_loss`` of older TRL) cannot be used and is refused; evaluation keeps TRL's
advantages unless ``apply_in_eval``. Every data-parallel rank posts the same
content-addressed batch (the service keeps one copy) and reads its own slice.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from drcredit.trainers.converters import ToolNames
from drcredit.trainers.records import (
    TURNS_KEY,
    conversation_record,
    error_record,
    make_turn_record,
    no_turns_record,
    read_turn_record,
    record_spans,
)
from drcredit.trainers.scoring import ScoredBatch, TokenRollout, score_step
from drcredit.trainers.settings import DrCreditSettings
from drcredit.trainers.tokens import policy_spans

__all__ = ["TARGET_TRL_VERSION", "TURNS_KEY", "completion_record", "question_and_rubrics"]

TARGET_TRL_VERSION = "1.16.0"


def completion_record(
    completion: Any,
    policy_mask: Sequence[int] | npt.NDArray[Any],
    *,
    tools: ToolNames = ToolNames(),
) -> dict[str, Any]:
    """The turn record of one TRL completion: its messages and its policy-token mask.

    ``completion`` is what TRL's ``_generate`` returns for a sample: a list of ``assistant``
    and ``tool`` messages (conversational) or a string. The ``k``-th assistant message owns
    the ``k``-th run of policy tokens.
    """
    runs = policy_spans(np.asarray(policy_mask, dtype=np.int64))
    if isinstance(completion, str):
        span = (0, len(policy_mask)) if len(policy_mask) else None
        return make_turn_record([{"type": "answer", "reasoning": "", "answer": completion}], [span])
    messages = [dict(m) for m in completion]
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not runs:
        return no_turns_record("the completion has no policy tokens")
    if len(assistant) != len(runs):
        return error_record(f"{len(assistant)} assistant messages but {len(runs)} runs of policy tokens")
    return conversation_record(messages, list(zip(runs, assistant, strict=True)), tools=tools)


def question_and_rubrics(row: Mapping[str, Any]) -> tuple[str | None, list[dict[str, Any]] | None]:
    """Question and rubrics of a dataset row (see the module doc)."""
    nested = row.get("drcredit")
    source: Mapping[str, Any] = nested if isinstance(nested, Mapping) else row
    question = source.get("question")
    rubrics = source.get("rubrics")
    if isinstance(rubrics, (str, bytes)):
        rubrics = json.loads(rubrics)
    if not question:
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            question = prompt
        elif isinstance(prompt, Sequence):
            users = [m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
            question = users[-1] if users and isinstance(users[-1], str) else None
    return (str(question) if question else None), ([dict(r) for r in rubrics] if rubrics else None)


def _build_trainer() -> type:
    trl = importlib.import_module("trl")
    torch = importlib.import_module("torch")
    gather_object = importlib.import_module("accelerate.utils").gather_object
    base: Any = trl.GRPOTrainer

    class DrCreditGRPOTrainer(base):  # type: ignore[misc]
        """``trl.GRPOTrainer`` with DrCredit's per-token advantages (see the module doc).

        Extra keyword arguments: ``drcredit`` (a :class:`DrCreditSettings`; default from the
        environment: ``DRCREDIT_URL``, ``DRCREDIT_API_KEY``, ``DRCREDIT_WAIT_TIMEOUT_S``,
        ``DRCREDIT_ID_PREFIX``), ``drcredit_client`` (a ``DrCreditClient`` to use instead of
        making one per step), ``apply_in_eval`` (replace advantages in evaluation too).
        """

        def __init__(
            self,
            *args: Any,
            drcredit: DrCreditSettings | None = None,
            drcredit_client: Any = None,
            apply_in_eval: bool = False,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            if getattr(self.args, "use_liger_loss", False):
                raise ValueError(
                    "DrCreditGRPOTrainer needs per-token advantages; a fused Liger GRPO loss takes one per sequence"
                )
            self.drcredit = drcredit or DrCreditSettings.from_config()
            self.drcredit_client = drcredit_client
            self.drcredit_apply_in_eval = apply_in_eval
            self._drcredit_generation: dict[str, Any] | None = None
            self._drcredit_rewards: Any = None
            #: the last scored batch (batch id, each completion's group id), to look credits up
            self.drcredit_last_batch: ScoredBatch | None = None

        # -------------------------------------------------------------- capture

        def _generate(self, prompts: list[Any]) -> Any:
            result = super()._generate(prompts)
            _, completion_ids, tool_mask, completions, _, extra_fields, _, _ = result
            self._drcredit_generation = {
                "completions": completions,
                "masks": [list(m) for m in tool_mask]
                if tool_mask is not None
                else [[1] * len(c) for c in completion_ids],
                "records": (extra_fields or {}).get(TURNS_KEY),
            }
            return result

        def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self._drcredit_rewards = rewards
            return rewards

        # -------------------------------------------------------------- replacement

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            output: dict[str, Any] = super()._generate_and_score_completions(inputs)
            if self.model.training or self.drcredit_apply_in_eval:
                output["advantages"] = self.drcredit_advantages(inputs, output)
            return output

        def drcredit_advantages(self, inputs: list[dict[str, Any]], output: Mapping[str, Any]) -> Any:
            """``(B, T)`` advantages for this process's rows of ``output`` (TRL's batch dict)."""
            generation, rewards_per_func = self._drcredit_generation, self._drcredit_rewards
            if generation is None or rewards_per_func is None:
                raise RuntimeError(
                    "no captured generation: drcredit_advantages runs after _generate_and_score_completions"
                )
            mode = "train" if self.model.training else "eval"
            group_size = self.num_generations if mode == "train" else self.num_generations_eval
            local = [self._drcredit_row(b, row, generation) for b, row in enumerate(inputs)]
            rows = gather_object(local)
            weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
            summed = (rewards_per_func * weights).nansum(dim=1)
            unscorable = torch.isnan(rewards_per_func).all(dim=1).tolist()
            outcome = [float(v) for v in summed.tolist()]
            if len(rows) != len(outcome):
                raise RuntimeError(f"{len(rows)} gathered completions but {len(outcome)} rewards")
            step = int(self.state.global_step)
            rollouts = []
            for g, row in enumerate(rows):
                group = g // group_size
                members = range(group * group_size, min((group + 1) * group_size, len(rows)))
                scorable = [outcome[m] for m in members if not unscorable[m]]
                reward = outcome[g] if not unscorable[g] else (math.fsum(scorable) / len(scorable) if scorable else 0.0)
                where = f"completion {g} (group {group})"
                record = read_turn_record(row["record"], where)
                if not row["question"] or not row["rubrics"]:
                    raise ValueError(
                        f"{where}: the dataset row has no question/rubrics (columns 'question', 'rubrics')"
                    )
                rollouts.append(
                    TokenRollout(
                        group_key=f"{mode}-s{step}-g{group}",
                        rollout_id=f"r{g - group * group_size}",
                        question=row["question"],
                        rubrics=row["rubrics"],
                        turns=record["turns"],
                        spans=record_spans(record),
                        policy_mask=np.asarray(row["mask"], dtype=np.int64),
                        outcome_reward=reward,
                    )
                )
            start = self.accelerator.process_index * len(inputs)
            self.drcredit_last_batch = scored = self._drcredit_score(rollouts)
            width = output["completion_ids"].shape[1]
            out, keep = scored.padded(width, rows=range(start, start + len(inputs)))
            for b in range(len(inputs)):
                if unscorable[start + b]:
                    out[b] = 0.0  # TRL gives unscorable completions no learning signal; so do we
            if scored.excluded_tokens:
                # Turns the service left out (on_judge_failure: exclude) leave the loss.
                mask = output["completion_mask"]
                mask.mul_(torch.as_tensor(keep, device=mask.device).to(mask.dtype))
            advantages = torch.as_tensor(out, device=output["completion_ids"].device)
            self._metrics[mode]["drcredit/token_advantage_abs_mean"].append(float(np.abs(out).mean()))
            return advantages

        def _drcredit_row(self, b: int, row: Mapping[str, Any], generation: Mapping[str, Any]) -> dict[str, Any]:
            mask = generation["masks"][b]
            records = generation["records"]
            if records is not None:
                record = records[b]
            else:
                record = completion_record(generation["completions"][b], mask, tools=self.drcredit.tool_names)
            question, rubrics = question_and_rubrics(row)
            return {"record": record, "mask": mask, "question": question, "rubrics": rubrics}

        def _drcredit_score(self, rollouts: list[TokenRollout]) -> ScoredBatch:
            return score_step(rollouts, self.drcredit, client=self.drcredit_client, step=int(self.state.global_step))

    DrCreditGRPOTrainer.__module__ = __name__
    DrCreditGRPOTrainer.__qualname__ = "DrCreditGRPOTrainer"
    return DrCreditGRPOTrainer


_TRAINER: type | None = None


def __getattr__(name: str) -> Any:
    """``DrCreditGRPOTrainer`` is built on first access (it needs trl)."""
    global _TRAINER
    if name == "DrCreditGRPOTrainer":
        if _TRAINER is None:
            _TRAINER = _build_trainer()
        return _TRAINER
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
