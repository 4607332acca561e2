"""VeRL's agent loop, extended to record DrCredit turns on the rollout workers.

Built on first use (:func:`build_agent_loop`), since it subclasses VeRL's ``ToolAgentLoop``
and nothing of VeRL is imported before :func:`drcredit.trainers.verl.register` runs. Per
assistant generation it records the half-open token span in the response; at the end it
converts the conversation into the turn record of :func:`drcredit.trainers.scoring.make_turn_record`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import Any

from drcredit.trainers.scoring import (
    TURNS_KEY,
    DrCreditSettings,
    conversation_record,
    error_record,
    plain_value,
    tool_call_message,
)

ADAPTER_MODULE = "drcredit.trainers.verl"


def build_agent_loop() -> type:
    tool_agent_loop = importlib.import_module("verl.experimental.agent_loop.tool_agent_loop")
    base: Any = tool_agent_loop.ToolAgentLoop

    class DrCreditToolAgentLoop(base):  # type: ignore[misc]
        """VeRL's ``ToolAgentLoop`` that also writes the DrCredit turn record (see the module doc)."""

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            # (span, position of the assistant message in agent_data.messages, or -1 for the unparsed tail)
            self._drcredit_generations: list[tuple[tuple[int, int], int]] = []
            self._drcredit_tail: dict[str, Any] | None = None
            self._drcredit_data: Any = None
            output = await super().run(sampling_params, **kwargs)
            output.extra_fields[TURNS_KEY] = self._drcredit_record(kwargs)
            return output

        async def _handle_generating_state(
            self, agent_data: Any, sampling_params: dict[str, Any], ignore_termination: bool = False
        ) -> Any:
            self._drcredit_data = agent_data
            start, before = len(agent_data.response_mask), len(agent_data.messages)
            state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
            span = (start, len(agent_data.response_mask))
            if len(agent_data.messages) > before:
                self._drcredit_generations.append((span, before))
            else:
                # stopped by a length or turn limit before the calls were parsed: parse them here
                active: Any = getattr(agent_data, "_active_tools", self.tools)
                content, calls = await self.tool_parser.extract_tool_calls(
                    agent_data.response_ids, [t.tool_schema for t in active.values()]
                )
                self._drcredit_tail = tool_call_message(content, calls[: self.max_parallel_calls])
                self._drcredit_generations.append((span, -1))
            return state

        def _drcredit_record(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
            data = self._drcredit_data
            if data is None:
                return error_record("no generation was recorded")
            prompt_length = len(kwargs["raw_prompt"])
            messages = [dict(m) for m in data.messages[prompt_length:]]
            generations: list[tuple[tuple[int, int], int | None]] = []
            for span, position in self._drcredit_generations:
                if position == -1:
                    if self._drcredit_tail is None:
                        continue
                    messages.append(self._drcredit_tail)
                    generations.append((span, len(messages) - 1))
                else:
                    generations.append((span, position - prompt_length))
            info: Any = plain_value(kwargs.get("extra_info")) or {}
            nested: Any = info.get("drcredit") if isinstance(info.get("drcredit"), Mapping) else {}
            settings = DrCreditSettings.from_config(self.config.get("algorithm"))
            rubrics = nested.get("rubrics") or info.get("rubrics")
            return conversation_record(
                messages,
                generations,
                tools=settings.tool_names,
                question=nested.get("question") or info.get("question"),
                rubrics=json.loads(rubrics) if isinstance(rubrics, str) else rubrics,
            )

    # Located by hydra and pickled by Ray through the adapter module, which builds it on
    # first access (drcredit.trainers.verl.__getattr__).
    DrCreditToolAgentLoop.__module__ = ADAPTER_MODULE
    DrCreditToolAgentLoop.__qualname__ = "DrCreditToolAgentLoop"
    return DrCreditToolAgentLoop
