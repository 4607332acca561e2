"""Real SkyRL parts for the adapter tests, on the CPU: a SkyRL-Gym env, a scripted engine, configs.

The env plays examples/group.json rollouts: the agent's tool calls are Hermes ``<tool_call>``
blocks, the tools answer JSON in ``<tool_response>`` blocks, a search turn earns a small
turn-level reward. The visit tool numbers its pages per call from ``W101`` (as a tool that
does not count per rollout does), so rollouts with two visits print the same ids twice:
:data:`PAGE_IDS` is what the adapters must send (the rule of ``drcredit.trainers.tool_ids``,
worked out by hand per rollout).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from drcredit.client import DrCreditClient

EXAMPLE = json.loads((Path(__file__).resolve().parents[2] / "examples" / "group.json").read_text())
ENV_ID = "drcredit-test-research"
SEARCH_REWARD = 0.05
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


#: per example rollout, the page ids of its visits (first four turns) after conversion. Printed:
#: W101, W102, ... per call. Kept by the latest usable page printed under the id, else the
#: latest; every other occurrence takes the first id printed nowhere in the rollout (W1, ...).
PAGE_IDS: dict[int, list[list[str]]] = {
    0: [["W1"], ["W101", "W102"]],  # both W101 usable: the second visit's keeps it
    1: [["W101"], ["W1", "W102"]],  # the second visit's W101 failed: the first keeps it
    2: [["W101"]],
    3: [["W1"], ["W101"]],  # both failed: the latest keeps it
    4: [["W1", "W102"], ["W101"]],
    5: [["W101"]],
    6: [["W1"], ["W101"]],
    7: [["W1"], ["W101"]],
}


def script(rollout: int) -> list[dict[str, Any]]:
    """The turns an agent plays for one example rollout (first four turns, then an answer)."""
    turns = EXAMPLE["rollouts"][rollout]["turns"][:4]
    if turns[-1]["type"] != "answer":
        turns = [*turns, {"type": "answer", "reasoning": "done", "answer": "The coolant fitting failed."}]
    return turns


def action(turn: dict[str, Any]) -> str:
    """What the policy writes for a turn."""
    if turn["type"] == "answer":
        return f"{turn['reasoning'][:30]}<answer>{turn['answer'][:60]}</answer>"
    if turn["type"] == "search":
        call = {"name": "search", "arguments": {"queries": turn["call"]["queries"]}}
    else:
        call = {"name": "visit", "arguments": {"urls": turn["call"]["urls"], "goal": turn["call"]["goal"][:30]}}
    return f"{turn['reasoning'][:30]}<tool_call>{json.dumps(call)}</tool_call>"


def observation(turn: dict[str, Any]) -> str:
    """What the tools answer for a turn, as JSON the converters read."""
    if turn["type"] == "search":
        body: dict[str, Any] = {"results": [{k: r[k] for k in ("url", "title", "snippet")} for r in turn["results"]]}
    else:
        body = {
            "pages": [
                {"id": f"W{101 + j}", **{k: p.get(k) for k in ("url", "evidence", "summary", "error")}}
                for j, p in enumerate(turn["pages"])
            ]
        }
    return f"<tool_response>{json.dumps(body)}</tool_response>"


def visit_page_ids(rollout: dict[str, Any]) -> list[list[str]]:
    """The page ids of a posted rollout's visits, in turn order."""
    return [[p["id"] for p in t["pages"]] for t in rollout["turns"] if t["type"] == "visit"]


class PostingClient(DrCreditClient):
    """The real client; keeps every rollout it posts, by (group id, rollout id)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.posted: dict[tuple[str, str], dict[str, Any]] = {}

    def keep(self, group_id: str, rollouts: Any) -> None:
        for rollout in rollouts:
            self.posted[(group_id, str(rollout["id"]))] = dict(rollout)

    def submit_batch(self, groups: Any, **kwargs: Any) -> Any:
        groups = list(groups)
        for group in groups:
            self.keep(group["group_id"], group["rollouts"])
        return super().submit_batch(groups, **kwargs)

    def open_group(self, *args: Any, **kwargs: Any) -> Any:
        self.keep(kwargs["group_id"], kwargs.get("rollouts") or ())
        return super().open_group(*args, **kwargs)

    def add_rollout(self, group_id: str, rollout: Any) -> Any:
        self.keep(group_id, [rollout])
        return super().add_rollout(group_id, rollout)


def make_env_class() -> type:
    base = importlib.import_module("skyrl_gym.envs.base_text_env")

    class ResearchEnv(base.BaseTextEnv):  # type: ignore[misc, name-defined]
        """Answers the scripted agent's tool calls; the reward comes at the answer."""

        def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
            super().__init__()
            extras = extras or {}
            self.turns_played = script(int(extras["rollout"]))
            self.outcome = float(EXAMPLE["rollouts"][int(extras["rollout"])]["outcome_reward"])
            self.max_turns = int(extras.get("max_turns", 8))
            self.report_messages = bool(extras.get("report_messages"))
            #: answer a tool call even on the step that ends the trajectory (the turn budget)
            self.answer_last_call = bool(extras.get("answer_last_call"))
            self.messages: list[dict[str, Any]] = []

        def step(self, action: str) -> Any:
            turn = self.turns_played[self.turns]
            self.turns += 1
            done = turn["type"] == "answer" or self.turns >= self.max_turns
            self.messages.append(_assistant(action))
            if done:
                last = [] if turn["type"] == "answer" or not self.answer_last_call else [observation(turn)]
                return base.BaseTextEnvStepOutput(
                    observations=[{"role": "user", "content": text} for text in last],
                    reward=self.outcome,
                    done=True,
                    metadata={},
                )
            content = observation(turn)
            self.messages.append(
                {"role": "tool", "content": content.removeprefix("<tool_response>")[: -len("</tool_response>")]}
            )
            reward = SEARCH_REWARD if turn["type"] == "search" else 0.0
            return base.BaseTextEnvStepOutput(
                observations=[{"role": "user", "content": content}], reward=reward, done=False, metadata={}
            )

        def get_metrics(self) -> dict[str, Any]:
            return {"drcredit_messages": self.messages} if self.report_messages else {}

    return ResearchEnv


def _assistant(text: str) -> dict[str, Any]:
    if "<tool_call>" not in text:
        return {"role": "assistant", "content": text}
    head, rest = text.split("<tool_call>", 1)
    call = json.loads(rest.split("</tool_call>", 1)[0])
    return {"role": "assistant", "content": head, "tool_calls": [{"type": "function", "function": call}]}


class ScriptedEngine:
    """An inference engine client that plays each trajectory's script, token in, token out."""

    def __init__(self, tokenizer: Any, *, eos: bool = True) -> None:
        self.tokenizer = tokenizer
        #: end each generation with the EOS token (a model stopping on a stop string does not)
        self.eos = eos
        self.turn: dict[str, int] = {}
        self.rollout_of: dict[str, int] = {}
        #: per session, the token ids of each generation, in order
        self.generated: dict[str, list[list[int]]] = {}

    async def generate(self, engine_input: Any, model: Any = None) -> dict[str, Any]:
        session = engine_input["session_ids"][0]
        k = self.turn.get(session, 0)
        self.turn[session] = k + 1
        text = action(script(self.rollout_of[session])[k])
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id] * self.eos
        self.generated.setdefault(session, []).append(ids)
        return {"responses": [text], "response_ids": [ids], "stop_reasons": ["stop"], "response_logprobs": None}

    async def finish_session(self, session_id: str) -> None:
        return None
