"""The prime-rl adapter on verifiers' data model (verifiers 0.4.0) and the real service.

Runs only where verifiers is installed (scripts/test runs it in .venv-trainers). The traces
are built the way verifiers' own train client builds them, turn by turn: the prompt rendered
by the ``renderers`` package's ``DefaultRenderer`` (the tokenizer's chat template, with
per-message attribution), the completion parsed by its Hermes tool parser, the turn committed
into the message graph by ``verifiers.v1.graph.prepare_turn(...).commit(...)``; only the
model is scripted. prime-rl itself (Python 3.12, CUDA, not on PyPI) is not installed: its
``Algorithm`` subclass is exercised on a stand-in base class with prime-rl's constructor.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

vf = pytest.importorskip("verifiers.v1")
pytest.importorskip("transformers")

import renderers  # noqa: E402
from renderers.configs import DefaultRendererConfig  # noqa: E402
from verifiers.v1.clients.train import response_from_generate  # noqa: E402
from verifiers.v1.configs.agent import WireAgentConfig  # noqa: E402
from verifiers.v1.dialects.chat import message_to_wire  # noqa: E402
from verifiers.v1.graph import prepare_turn  # noqa: E402
from verifiers.v1.types import ToolMessage, UserMessage  # noqa: E402

from drcredit.client import DrCreditClient  # noqa: E402
from drcredit.trainers import prime_rl as adapter  # noqa: E402
from drcredit.trainers.service import DrCreditUnavailable  # noqa: E402
from drcredit.trainers.settings import DrCreditSettings  # noqa: E402
from drcredit.trainers.tokens import turn_advantages  # noqa: E402
from tests.support.judge_server import Reply, running_judge  # noqa: E402
from tests.support.judged_service import judged_service  # noqa: E402
from tests.support.live import free_port  # noqa: E402
from tests.trainers.skyrl_parts import EXAMPLE, PAGE_IDS, observation, script, visit_page_ids  # noqa: E402
from tests.trainers.tiny import byte_tokenizer  # noqa: E402

#: ChatML that renders an assistant message exactly as the model wrote it (so the message graph
#: reuses the sampled node as the next turn's prefix instead of branching).
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    '{%- if m.tool_calls %}{%- for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", '
    '"arguments": {{ c.function.arguments | tojson }}}</tool_call>{%- endfor %}{%- endif %}<|im_end|>\n'
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "web search", "parameters": {}}},
    {"type": "function", "function": {"name": "visit", "description": "read pages", "parameters": {}}},
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer(TEMPLATE)


def generation(turns: list[dict[str, Any]]) -> str:
    """One assistant message: the calls of all ``turns`` (several = parallel calls), or the answer."""
    if turns[0]["type"] == "answer":
        return f"<answer>{turns[0]['answer'][:60]}</answer>"
    calls = []
    for turn in turns:
        if turn["type"] == "search":
            calls.append({"name": "search", "arguments": {"queries": turn["call"]["queries"]}})
        else:
            calls.append(
                {"name": "visit", "arguments": {"urls": turn["call"]["urls"], "goal": turn["call"]["goal"][:30]}}
            )
    return turns[0]["reasoning"][:30] + "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)


def play(
    tokenizer: Any, rollout: int, *, parallel: bool, budget: int | None = None, stopped_by_verifiers: bool = True
) -> tuple[Any, list[list[dict[str, Any]]]]:
    """A real verifiers trace of one scripted agent; returns it and the turns of each generation.

    ``budget``: the number of model calls, after which the rollout stops on its last call's tool
    results. ``stopped_by_verifiers``: the turn limit is verifiers' own (its interception server
    refuses the next model request and commits that request's messages, the tool results, into
    the trace, as ``commit_prompt`` does there); otherwise the harness stops by itself and the
    results never reach verifiers."""
    renderer = renderers.create_renderer(tokenizer, DefaultRendererConfig(tool_parser="qwen3"))
    turns = script(rollout)
    plan = (
        [[turns[0], turns[1]], *[[t] for t in turns[2:]]]
        if parallel and turns[1]["type"] != "answer"
        else [[t] for t in turns]
    )
    plan = plan[:budget]
    data = vf.WireTaskData(question=EXAMPLE["question"], rubrics=EXAMPLE["rubrics"])
    trace = vf.WireTrace(task=vf.TraceTask(type="Research", data=data), agent=vf.AgentInfo(config=WireAgentConfig()))
    prompt: list[Any] = [UserMessage(content="Research: " + EXAMPLE["question"])]
    for group in plan:
        turn = prepare_turn(trace, prompt, [])
        rendered = renderer.render([message_to_wire(m) for m in prompt], tools=TOOLS, add_generation_prompt=True)
        completion = [*tokenizer.encode(generation(group), add_special_tokens=False), tokenizer.eos_token_id]
        parsed = renderer.parse_response(completion, tools=TOOLS)
        result = {
            "prompt_ids": rendered.token_ids,
            "completion_ids": completion,
            "completion_logprobs": [-0.5] * len(completion),
            "content": parsed.content,
            "tool_calls": parsed.tool_calls,
            "prompt_attribution": rendered,
            "finish_reason": "stop",
        }
        response = response_from_generate(result, model="policy")
        node = turn.commit(response)
        prompt = [*prompt, trace.nodes[node].message]
        calls = response.message.tool_calls or []
        for call, played in zip(calls, group if calls else [], strict=True):
            answer = observation(played).removeprefix("<tool_response>").removesuffix("</tool_response>")
            prompt.append(ToolMessage(tool_call_id=call.id, content=answer))
    if budget is not None and stopped_by_verifiers and prompt[-1].role == "tool":
        prepare_turn(trace, prompt, []).commit_prompt()
    trace.record_reward("rubric", EXAMPLE["rollouts"][rollout]["outcome_reward"])
    trace.ok = True
    trace.stop("agent_completed" if budget is None else "max_turns")
    trace.info["rollout"] = rollout
    return trace, plan


def episodes(tokenizer: Any, rollouts: list[int]) -> list[Any]:
    out = []
    for k, rollout in enumerate(rollouts):
        trace, plan = play(tokenizer, rollout, parallel=k == 0)
        trace.info["plan"] = plan
        run = vf.TrainRunInfo(id="r-1", name="primerun", work=vf.TrainWorkInfo(step=5))
        out.append(vf.Episode(task=trace.task, group=vf.GroupInfo(id="q1"), run=run, traces=[trace], ok=True))
    return out


def test_group_scored_onto_message_nodes(tokenizer: Any, service: str) -> None:
    group = episodes(tokenizer, [0, 1, 2, 3])
    settings = DrCreditSettings(base_url=service, timeout_s=120, id_prefix="prime-")
    scored = adapter.score_episodes(group, settings)
    assert scored is not None and len(set(scored.group_ids)) == 1
    with DrCreditClient(service) as client:
        document = client.advantages(scored.group_ids[0], wait=30)
        assert client.group_status(scored.group_ids[0])["metadata"] == {"run": "primerun", "step": 5}
    assert any(len(e.traces[0].info["plan"][0]) == 2 for e in group)  # one message made two calls
    for episode in group:
        trace = episode.traces[0]
        values = turn_advantages(document, adapter.safe_id(trace.id))
        sampled = [node for node in trace.nodes if node.sampled]
        assert len(sampled) == len(trace.info["plan"])
        position = 0
        for node, turns in zip(sampled, trace.info["plan"], strict=True):
            expected = float(np.mean(values[position : position + len(turns)]))  # one message, several calls: mean
            position += len(turns)
            assert node.advantages is not None and len(node.advantages) == sum(node.mask) == len(node.logprobs)
            np.testing.assert_allclose(node.advantages, expected, rtol=0, atol=1e-6)
        assert position == len(values)
        for node in trace.nodes:
            assert node.sampled or node.advantages is None  # prompt and tool messages: no credit
        # verifiers' own view: the advantages spread over the branch's tokens, 0 off the sampled ones
        branch = trace.branches[-1]
        spread = np.asarray(branch.advantages)
        mask = np.asarray(branch.sampled_mask)
        assert spread.shape == (len(branch.token_ids),) and not spread[~mask].any()
        # the page ids the visit tool printed, renamed only where they collide (skyrl_parts.PAGE_IDS)
        row = adapter.trace_rollout(trace, settings, group_key="q1", where="trace")
        assert visit_page_ids({"turns": row.turns}) == PAGE_IDS[trace.info["rollout"]]
        # a record written to disk and read back keeps them (verifiers rounds them to 4 decimals)
        again = vf.WireTrace.model_validate(trace.to_record())
        np.testing.assert_allclose(again.branches[-1].advantages, spread, atol=1e-4)


def test_exclude_zeroes_unscorable_turns(tokenizer: Any, tmp_path: Path) -> None:
    group = episodes(tokenizer, [0, 1])
    with (
        running_judge(lambda c: Reply(content="no json")) as judge,
        judged_service(f"sqlite:///{tmp_path / 'p.sqlite3'}", judge.url) as url,
        pytest.warns(UserWarning, match="failed"),
    ):
        settings = DrCreditSettings(base_url=url, timeout_s=120, params={"on_judge_failure": "exclude"})
        scored = adapter.score_episodes(group, settings)
    assert scored is not None and scored.excluded_tokens > 0
    document = scored.documents[scored.group_ids[0]]
    zeroed = 0
    for episode in group:
        trace = episode.traces[0]
        rollout = next(r for r in document["rollouts"] if r["id"] == adapter.safe_id(trace.id))
        flags = iter(t["unscorable"] for t in rollout["turns"])
        for node, turns in zip([n for n in trace.nodes if n.sampled], trace.info["plan"], strict=True):
            unscorable = [next(flags) for _ in turns]
            if all(unscorable):
                zeroed += 1
                assert not any(node.advantages)
            else:
                assert all(node.advantages)
    assert zeroed


def test_service_down_assigns_nothing(tokenizer: Any) -> None:
    """The orchestrator's scoring raises after the deadline; no trace is left with made-up credit."""
    group = episodes(tokenizer, [0, 1])
    client = DrCreditClient(f"http://127.0.0.1:{free_port()}", max_attempts=1)
    settings = DrCreditSettings(base_url=client.base_url, unreachable_timeout_s=0.5)
    with pytest.raises(DrCreditUnavailable, match="could not be reached"):
        adapter.score_episodes(group, settings, client=client)
    client.close()
    assert all(node.advantages is None for e in group for node in e.traces[0].nodes)


def test_algorithm_subclass_scores_in_score_group(tokenizer: Any, service: str) -> None:
    """DrCreditAlgorithm on a stand-in for prime-rl's ``Algorithm`` (same constructor and hook)."""

    class Algorithm:
        def __init__(self, config: Any, policy_pool: Any) -> None:
            self.policy_pool = policy_pool

        async def score_group(self, episodes: list[Any]) -> None:
            raise AssertionError("replaced by the subclass")

    settings = DrCreditSettings(base_url=service, timeout_s=120, id_prefix="algo-")
    algorithm = adapter.build_algorithm(Algorithm, settings)(config=None, policy_pool="pool")
    assert algorithm.action_loss_type == "rl" and algorithm.policy_pool == "pool"
    group = episodes(tokenizer, [4, 5])
    asyncio.run(algorithm.score_group(group))
    assert all(node.advantages is not None for e in group for node in e.traces[0].nodes if node.sampled)


@pytest.mark.parametrize("stopped_by_verifiers", [True, False], ids=["verifiers-limit", "harness-limit"])
def test_a_rollout_stopped_after_a_tool_call(tokenizer: Any, stopped_by_verifiers: bool) -> None:
    """Three model calls, the third a tool call: when verifiers' own turn limit stops the rollout,
    the refused request's tool results are in the trace and the last turn keeps them; when the
    harness stops by itself they never reach verifiers, and the turn says it has no response."""
    settings = DrCreditSettings()
    for rollout in (0, 2, 6):
        trace, plan = play(tokenizer, rollout, parallel=False, budget=3, stopped_by_verifiers=stopped_by_verifiers)
        played = plan[-1][0]
        last = adapter.trace_rollout(trace, settings, group_key="q", where="trace").turns[-1]
        assert len(plan) == 3 and last["type"] == played["type"]
        if played["type"] == "search":
            got = ([r["url"] for r in last["results"]], last["error"])
            kept = ([r["url"] for r in played["results"]], None)
            assert got == (kept if stopped_by_verifiers else ([], "no response"))
        else:
            got_pages = [(p["url"], p["error"] or None) for p in last["pages"]]
            kept_pages = [(p["url"], p.get("error") or None) for p in played["pages"]]
            assert got_pages == (
                kept_pages if stopped_by_verifiers else [(p["url"], "no response") for p in played["pages"]]
            )
