"""The VeRL adapter against the installed verl (0.9.1) and the real service.

Runs only where verl is installed (the project's own test run skips it):

    scripts/test sets up .venv-trainers and runs it; by hand:
    .venv-trainers/bin/python -m pytest tests/trainers/test_verl_adapter.py

The service is the real app (embedded SQLite, offline judge) served by uvicorn on a free
port; batches are VeRL's own ``DataProto``; the estimator is reached through VeRL's registry
(``core_algos.get_adv_estimator_fn``) and VeRL's own ``compute_advantage`` functions (the
legacy trainer's and the v1 trainers'); the v1 trainer mode's ``_compute_advantage`` runs
against a real TransferQueue; the agent loop is VeRL's ``ToolAgentLoop`` state machine driven
by a scripted LLM server and a tokenizer built here.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

verl = pytest.importorskip("verl")
torch = pytest.importorskip("torch")


from drcredit.client import DrCreditClient  # noqa: E402
from drcredit.trainers import service  # noqa: E402
from drcredit.trainers import verl as adapter  # noqa: E402
from drcredit.trainers.tokens import turn_advantages  # noqa: E402
from tests.trainers.tiny import byte_tokenizer  # noqa: E402

EXAMPLE = json.loads((Path(__file__).resolve().parents[2] / "examples" / "group.json").read_text())
RESPONSE_LENGTH = 160


# ----------------------------------------------------------------------------- the service


@pytest.fixture
def env(service: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DRCREDIT_URL", service)
    monkeypatch.setenv("DRCREDIT_WAIT_TIMEOUT_S", "120")
    return service


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimator makes its own client from config/env: make it one that records group ids."""
    monkeypatch.setattr(service, "make_client", lambda settings: RecordingClient(settings.base_url))


@pytest.fixture(scope="module")
def registered() -> dict[str, Any]:
    return adapter.register()


# ----------------------------------------------------------------------------- batches


def token_layout(turns: list[dict[str, Any]], seed: int, length: int) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Spans and a response mask as VeRL's tool agent loop lays them out.

    Each turn is a run of policy tokens (mask 1); after each tool turn come observation
    tokens (mask 0); the rest of the response is padding (mask 0). Turns past the response
    length are cut, as VeRL truncates the response.
    """
    rng = np.random.default_rng(seed)
    mask = np.zeros(length, dtype=np.int64)
    spans, cursor = [], 0
    for turn in turns:
        size = int(rng.integers(2, 7))
        spans.append((cursor, cursor + size))
        mask[cursor : min(cursor + size, length)] = 1
        cursor += size
        if turn["type"] != "answer":
            cursor += int(rng.integers(3, 9))  # the tool observation
    return spans, mask


def make_batch(
    uid_of: list[str], rollout_ix: list[int], *, with_extra_info: bool = True, length: int = RESPONSE_LENGTH
) -> tuple[Any, list]:
    """A DataProto like VeRL's after generation and reward: rows of several uid groups."""
    from verl import DataProto

    records, masks, rewards, extra_info = [], [], [], []
    layouts = []
    for b, ix in enumerate(rollout_ix):
        rollout = EXAMPLE["rollouts"][ix]
        spans, mask = token_layout(rollout["turns"], seed=ix, length=length)
        layouts.append((rollout, spans, mask))
        records.append(adapter.make_turn_record(rollout["turns"], spans))
        masks.append(mask)
        score = torch.zeros(length)
        score[int(np.flatnonzero(mask)[-1])] = rollout["outcome_reward"]  # reward on the last policy token
        rewards.append(score)
        extra_info.append({"question": EXAMPLE["question"], "rubrics": EXAMPLE["rubrics"], "index": b})
    non_tensors: dict[str, Any] = {
        "uid": np.array(uid_of, dtype=object),
        adapter.TURNS_KEY: np.array(records, dtype=object),
    }
    if with_extra_info:
        non_tensors["extra_info"] = np.array(extra_info, dtype=object)
    data = DataProto.from_dict(
        tensors={
            "response_mask": torch.tensor(np.stack(masks)),
            "token_level_rewards": torch.stack(rewards),
            "token_level_scores": torch.stack(rewards),
        },
        non_tensors=non_tensors,
    )
    return data, layouts


def expected_rows(service: str, data: Any, layouts: list, prefix: str) -> np.ndarray:
    """Per-token advantages from the service's own documents, by hand: for checking."""
    with DrCreditClient(service) as client:
        uids = list(data.non_tensor_batch["uid"])
        length = data.batch["response_mask"].shape[1]
        out = np.zeros((len(uids), length), dtype=np.float32)
        positions: dict[str, int] = {}
        documents: dict[str, dict[str, Any]] = {}
        for b, (rollout, spans, mask) in enumerate(layouts):
            uid = uids[b]
            position = positions.get(uid, 0)
            positions[uid] = position + 1
            if uid not in documents:
                documents[uid] = client.advantages(_GROUPS[prefix + uid], wait=30)
            values = turn_advantages(documents[uid], f"r{position}")
            assert len(values) == len(rollout["turns"])
            for value, (start, end) in zip(values, spans, strict=True):
                for t in range(start, min(end, length)):
                    out[b, t] = value if mask[t] else 0.0
    return out


_GROUPS: dict[str, str] = {}


class RecordingClient(DrCreditClient):
    """The real client; remembers the group ids it posted (uid -> group id)."""

    def submit_batch(self, groups: Any, *, batch_id: str | None = None) -> Any:
        answer = super().submit_batch(groups, batch_id=batch_id)
        for group in groups:
            _GROUPS[group["group_id"].rsplit("-", 1)[0]] = group["group_id"]
        return answer


# ----------------------------------------------------------------------------- tests


def test_registered_in_verls_registries(registered: dict[str, Any]) -> None:
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, PPOTrainer

    assert core_algos.get_adv_estimator_fn("drcredit") is adapter.drcredit_advantage
    assert adapter.register()["estimator"] is adapter.drcredit_advantage  # idempotent
    loop = registered["agent_loop"]
    assert issubclass(loop, ToolAgentLoop)
    assert _agent_loop_registry["drcredit_tool_agent"] == {"_target_": "drcredit.trainers.verl.DrCreditToolAgentLoop"}
    assert adapter.DrCreditToolAgentLoop is loop  # what hydra's locate finds by that path
    for mode in ("sync", "colocate_async", "separate_async"):
        cls = TRAINER_REGISTRY[f"drcredit_{mode}"]
        assert issubclass(cls, TRAINER_REGISTRY[mode]) and issubclass(cls, PPOTrainer)


def test_estimator_through_legacy_compute_advantage(env: str, registered: dict[str, Any], recording: None) -> None:
    """``algorithm.adv_estimator=drcredit`` in VeRL's ``ray_trainer.compute_advantage``."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import compute_advantage

    uids = ["uid-a"] * 4 + ["uid-b"] * 4
    data, layouts = make_batch(uids, list(range(8)))
    algorithm = OmegaConf.create({"adv_estimator": "drcredit", "drcredit": {"id_prefix": "legacy-", "timeout_s": 120}})
    with pytest.raises(RuntimeError, match="batch_context"):
        compute_advantage(data, adv_estimator="drcredit", config=algorithm)  # VeRL passes no non-tensor data
    with adapter.batch_context(data.non_tensor_batch):
        out = compute_advantage(data, adv_estimator="drcredit", config=algorithm)
    advantages = out.batch["advantages"].numpy()
    np.testing.assert_allclose(advantages, expected_rows(env, out, layouts, "legacy-"), rtol=0, atol=1e-6)
    assert torch.equal(out.batch["advantages"], out.batch["returns"])
    mask = out.batch["response_mask"].numpy()
    assert not advantages[mask == 0].any()  # observations and padding: 0
    for b, (rollout, spans, _) in enumerate(layouts):  # one value per turn; the answer gets the outcome advantage
        values = {float(advantages[b, s]) for s, e in spans[:-1] if s < RESPONSE_LENGTH}
        assert len(values) >= 1
        last_start = spans[-1][0]
        assert (
            rollout["turns"][-1]["type"] != "answer" or last_start >= RESPONSE_LENGTH or advantages[b, last_start] != 0
        )
    # different groups: different group ids, per-group normalisation
    assert _GROUPS["legacy-uid-a"] != _GROUPS["legacy-uid-b"]


def test_non_tensor_keyword_and_v1_multi_trajectories(env: str, registered: dict[str, Any], recording: None) -> None:
    """The v1 trainers' ``compute_advantage_for_multi_trajectories`` and GDPO-style forwarding."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    uids = ["q1", "q2", "q1", "q2", "q1", "q2"]  # interleaved, as after balancing
    data, layouts = make_batch(uids, [0, 4, 1, 5, 2, 6], with_extra_info=False)
    # question and rubrics copied into the record by the agent loop instead of extra_info
    records = []
    for record in data.non_tensor_batch[adapter.TURNS_KEY]:
        records.append({**record, "question": EXAMPLE["question"], "rubrics": EXAMPLE["rubrics"]})
    data.non_tensor_batch[adapter.TURNS_KEY] = np.array(records, dtype=object)
    algorithm = OmegaConf.create({"adv_estimator": "drcredit", "drcredit": {"id_prefix": "v1-"}})
    keys = [f"{u}_{i // 2}_0" for i, u in enumerate(uids)]
    with adapter.batch_context(data.non_tensor_batch):
        out = compute_advantage_for_multi_trajectories(
            copy.deepcopy(data), batch_keys=keys, adv_estimator="drcredit", config=algorithm
        )
    np.testing.assert_allclose(out.batch["advantages"].numpy(), expected_rows(env, data, layouts, "v1-"), atol=1e-6)

    # the same estimator, given non_tensor_batch as VeRL gives GDPO's: the same numbers
    fn = core_algos.get_adv_estimator_fn("drcredit")
    advantages, returns = fn(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
        config=algorithm,
        non_tensor_batch=data.non_tensor_batch,
        batch=data.batch,
    )
    np.testing.assert_allclose(advantages.numpy(), out.batch["advantages"].numpy(), atol=1e-6)
    assert torch.equal(advantages, returns)


def test_compute_drcredit_advantage_on_a_dataproto(env: str) -> None:
    """The function form, with given outcome rewards, a given client and truncated rollouts."""
    uids = ["t"] * 3
    data, layouts = make_batch(uids, [3, 2, 0], length=60)  # rollout 3's 12 turns run past 60 tokens
    assert sum(1 for s, _ in layouts[0][1] if s >= 60) >= 2 and any(s < 60 < e for s, e in layouts[0][1])
    with RecordingClient(env) as client:
        settings = adapter.DrCreditSettings(id_prefix="fn-", timeout_s=120)
        rewards = np.array([0.1, 0.5, 0.9])
        out = adapter.compute_drcredit_advantage(data, settings=settings, client=client, outcome_rewards=rewards)
        document = client.advantages(_GROUPS["fn-t"], wait=30)
    assert [r["outcome_reward"] for r in document["rollouts"]] == [0.1, 0.5, 0.9]
    np.testing.assert_allclose(out.batch["advantages"].numpy(), expected_rows(env, out, layouts, "fn-"), atol=1e-6)


def test_errors_name_the_row(env: str) -> None:
    data, _ = make_batch(["x", "x"], [0, 1])
    records = list(data.non_tensor_batch[adapter.TURNS_KEY])
    records[1] = {"version": 1, "turns": [], "spans": [], "error": "messages[3]: tool call 'search' has no response"}
    data.non_tensor_batch[adapter.TURNS_KEY] = np.array(records, dtype=object)
    with pytest.raises(ValueError, match=r"row 1 \(uid x\).*has no response"):
        adapter.compute_drcredit_advantage(data)
    single, _ = make_batch(["only"], [0])
    with pytest.raises(ValueError, match="at least 2"):
        adapter.compute_drcredit_advantage(single)


def test_v1_trainer_mode_reads_the_transfer_queue(env: str, registered: dict[str, Any], recording: None) -> None:
    """``trainer.v1.trainer_mode=drcredit_sync``: ``_compute_advantage`` on a real TransferQueue."""
    tq = pytest.importorskip("transfer_queue")
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    ray = pytest.importorskip("ray")
    # TransferQueue's controller and storage unit each reserve a (logical) CPU
    ray.init(num_cpus=4, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        uids = ["p1", "p1", "p2", "p2"]
        data, layouts = make_batch(uids, [0, 1, 4, 5])
        keys = [f"{u}_{i % 2}_0" for i, u in enumerate(uids)]
        mask = data.batch["response_mask"]
        rows = []
        for b in range(len(uids)):
            n = int(mask[b].nonzero().max()) + 1  # VeRL stores unpadded responses
            rows.append(
                {
                    "uid": uids[b],
                    "response_mask": mask[b, :n].clone(),
                    "rm_scores": data.batch["token_level_scores"][b, :n].clone(),
                    "extra_fields": {adapter.TURNS_KEY: data.non_tensor_batch[adapter.TURNS_KEY][b], "turn_scores": []},
                    "extra_info": data.non_tensor_batch["extra_info"][b],
                }
            )
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows))
        meta = tq.KVBatchMeta(partition_id="train", keys=keys, tags=[{} for _ in keys])
        trainer = object.__new__(TRAINER_REGISTRY["drcredit_sync"])
        trainer.config = OmegaConf.create(
            {
                "algorithm": {
                    "adv_estimator": "drcredit",
                    "gamma": 1.0,
                    "lam": 1.0,
                    "use_kl_in_reward": False,
                    "norm_adv_by_std_in_grpo": True,
                    "drcredit": {"id_prefix": "tq-", "timeout_s": 120},
                },
                "actor_rollout_ref": {"rollout": {"n": 2}},
            }
        )
        trainer._compute_advantage(meta, metrics={})
        stored = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", "returns"])
        advantages = stored["advantages"]
        with DrCreditClient(env) as client:
            for b, (_, spans, row_mask) in enumerate(layouts):
                document = client.advantages(_GROUPS[f"tq-{uids[b]}"], wait=30)
                values = turn_advantages(document, f"s{b % 2}-o0")  # rollout id from the TQ key
                got = advantages[b].numpy() if hasattr(advantages[b], "numpy") else np.asarray(advantages[b])
                for value, (start, end) in zip(values, spans, strict=True):
                    for t in range(start, min(end, len(got))):
                        assert got[t] == pytest.approx(value if row_mask[t] else 0.0, abs=1e-6)
    finally:
        tq.close()
        ray.shutdown()


# ----------------------------------------------------------------------------- the agent loop

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}<tool_call>"
    "{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}</tool_call>{%- endfor %}"
    "<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>tool\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def tiny_tokenizer() -> Any:
    return byte_tokenizer(CHAT_TEMPLATE)


def function_tools() -> list[Any]:
    from verl.tools.function_tool import FunctionTool
    from verl.tools.schemas import OpenAIFunctionToolSchema

    first = EXAMPLE["rollouts"][0]["turns"]
    search_results = {"results": [{k: r[k] for k in ("url", "title", "snippet")} for r in first[0]["results"]]}
    # the visit tool numbers its pages per call from W101 (not per rollout from W1)
    pages = {
        "pages": [
            {"id": f"W{101 + j}", **{k: p[k] for k in ("url", "evidence", "summary")}}
            for j, p in enumerate(first[1]["pages"])
        ]
    }

    def search(queries: list[str]) -> dict[str, Any]:
        return search_results

    def visit(urls: list[str], goal: str) -> dict[str, Any]:
        return pages

    def schema(name: str, properties: dict[str, Any]) -> Any:
        return OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": name,
                    "parameters": {"type": "object", "properties": properties, "required": list(properties)},
                },
            }
        )

    strings = {"type": "array", "items": {"type": "string"}}
    return [
        FunctionTool(name="search", fn=search, tool_schema=schema("search", {"queries": strings})),
        FunctionTool(
            name="visit", fn=visit, tool_schema=schema("visit", {"urls": strings, "goal": {"type": "string"}})
        ),
    ]


class ScriptedServer:
    """Stands in for VeRL's LLM server manager: answers each generate call from a script."""

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: Any, **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.prompts.append(list(prompt_ids))
        text = self.replies.pop(0)
        return TokenOutput(token_ids=self.tokenizer.encode(text, add_special_tokens=False), stop_reason="completed")


def call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def run_agent_loop(loop_cls: type | None, tokenizer: Any, replies: list[str], *, response_length: int = 4000) -> Any:
    import asyncio

    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": 2048,
                    "response_length": response_length,
                    "full_determinism": False,
                    "multi_turn": {
                        "max_user_turns": 8,
                        "max_assistant_turns": 8,
                        "max_parallel_calls": 2,
                        "max_tool_response_length": 100_000,
                        "tool_response_truncate_side": "middle",
                        "format": "hermes",
                    },
                }
            },
            "data": {"apply_chat_template_kwargs": {}},
            "algorithm": {
                "adv_estimator": "drcredit",
                "drcredit": {"search_tools": ["search"], "visit_tools": ["visit"]},
            },
        }
    )
    extra_info = {"drcredit": {"question": EXAMPLE["question"], "rubrics": EXAMPLE["rubrics"]}}
    prompt = [{"role": "user", "content": "Research: " + EXAMPLE["question"]}]

    async def main() -> Any:  # the agent loop binds to the running event loop when it is made
        if loop_cls is None:  # as VeRL's workers make it: hydra, from examples/verl/agent_loop.yaml
            import hydra

            entries = OmegaConf.load(Path(__file__).resolve().parents[2] / "examples" / "verl" / "agent_loop.yaml")
            (entry,) = [e for e in entries if e.name == adapter.AGENT_LOOP_NAME]
            make: Any = functools.partial(hydra.utils.instantiate, entry, hf_model_type=None)
        else:
            make = loop_cls
        loop = make(
            trainer_config=DictConfigWrap(config),
            server_manager=ScriptedServer(tokenizer, replies),
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap(function_tools()),
        )
        return await loop.run({"temperature": 1.0}, raw_prompt=prompt, extra_info=extra_info)

    return asyncio.run(main())


def test_agent_loop_records_turns_and_spans(env: str, registered: dict[str, Any]) -> None:
    """VeRL's ToolAgentLoop state machine, run for real: the record names every turn and its tokens."""
    tokenizer = tiny_tokenizer()
    first = EXAMPLE["rollouts"][0]["turns"]
    url = first[1]["call"]["urls"][0]
    replies = [
        "<think>Start broad.</think>" + call("search", {"queries": ["Calder Bay battery fire cause"]}) + "<|im_end|>",
        "Open the board's report." + call("visit", {"urls": [url], "goal": "root cause"}) + "<|im_end|>",
        "<answer>The coolant fitting failed; see the SESB final report.</answer><|im_end|>",
    ]
    output = run_agent_loop(None, tokenizer, replies)
    record = output.extra_fields[adapter.TURNS_KEY]
    assert record["error"] is None, record["error"]
    assert [t["type"] for t in record["turns"]] == ["search", "visit", "answer"]
    assert record["turns"][0]["call"]["queries"] == ["Calder Bay battery fire cause"]
    assert [r["url"] for r in record["turns"][0]["results"]] == [r["url"] for r in first[0]["results"]]
    assert record["turns"][1]["call"]["urls"] == [url]
    assert record["turns"][1]["pages"][0]["evidence"] == first[1]["pages"][0]["evidence"]
    assert record["turns"][1]["pages"][0]["id"] == "W101"  # as the tool printed it
    assert "coolant fitting failed" in record["turns"][2]["answer"]
    assert record["question"] == EXAMPLE["question"] and record["rubrics"] == EXAMPLE["rubrics"]
    mask = np.asarray(output.response_mask)
    for (start, end), reply in zip(record["spans"], replies, strict=True):
        assert mask[start:end].all()  # the span is policy tokens only
        assert tokenizer.decode(output.response_ids[start:end]) == reply  # exactly that generation
    assert mask.sum() == sum(e - s for s, e in record["spans"])  # and every policy token is in one


def test_agent_loop_keeps_printed_page_ids_and_renames_only_a_collision(env: str, registered: dict[str, Any]) -> None:
    """Two visits, each printing its page as W101: the later one keeps W101 (the report's
    citation names it), the earlier takes W1, the first id the tool printed nowhere."""
    tokenizer = tiny_tokenizer()
    url = EXAMPLE["rollouts"][0]["turns"][1]["call"]["urls"][0]
    replies = [
        call("visit", {"urls": [url], "goal": "cause"}) + "<|im_end|>",
        call("visit", {"urls": [url], "goal": "confirm"}) + "<|im_end|>",
        '<answer># R\n## S\n<cite id="W101">The fitting failed.</cite></answer><|im_end|>',
    ]
    record = run_agent_loop(None, tokenizer, replies).extra_fields[adapter.TURNS_KEY]
    assert record["error"] is None, record["error"]
    assert [[p["id"] for p in t["pages"]] for t in record["turns"][:2]] == [["W1"], ["W101"]]
    assert '<cite id="W101">' in record["turns"][2]["answer"]


def test_agent_loop_truncated_rollout_and_scoring(env: str, registered: dict[str, Any], recording: None) -> None:
    """A rollout cut by the response length still records its turns; two rollouts then score."""
    from verl import DataProto

    tokenizer = tiny_tokenizer()
    url = EXAMPLE["rollouts"][0]["turns"][1]["call"]["urls"][0]
    search = call("search", {"queries": ["Calder Bay fire"]}) + "<|im_end|>"
    visit = call("visit", {"urls": [url], "goal": "cause"}) + "<|im_end|>"
    full = run_agent_loop(
        registered["agent_loop"], tokenizer, [search, visit, "<answer>Coolant leak.</answer><|im_end|>"]
    )
    cut_at = full.extra_fields[adapter.TURNS_KEY]["spans"][1][0] + 10  # inside the second generation
    cut = run_agent_loop(registered["agent_loop"], tokenizer, [search, visit, "unused"], response_length=cut_at)
    record = cut.extra_fields[adapter.TURNS_KEY]
    assert record["error"] is None, record["error"]
    assert [t["type"] for t in record["turns"]] == ["search", "visit"]
    assert record["turns"][1]["pages"][0]["error"] == "no response"  # the visit never ran
    width = max(len(full.response_mask), len(cut.response_mask))
    masks = torch.zeros((2, width), dtype=torch.int64)
    masks[0, : len(full.response_mask)] = torch.tensor(full.response_mask)
    masks[1, : len(cut.response_mask)] = torch.tensor(cut.response_mask)
    data = DataProto.from_dict(
        tensors={"response_mask": masks},
        non_tensors={
            "uid": np.array(["loop", "loop"], dtype=object),
            adapter.TURNS_KEY: np.array([full.extra_fields[adapter.TURNS_KEY], record], dtype=object),
        },
    )
    out = adapter.compute_drcredit_advantage(data, outcome_rewards=[1.0, 0.0], settings=adapter.DrCreditSettings())
    with DrCreditClient(env) as client:
        document = client.advantages(_GROUPS["loop"], wait=30)
    for b, rollout_id in enumerate(["r0", "r1"]):
        values = turn_advantages(document, rollout_id)
        rec = data.non_tensor_batch[adapter.TURNS_KEY][b]
        for value, (start, end) in zip(values, rec["spans"], strict=True):
            end = min(end, int(masks[b].shape[0]))
            got = out.batch["advantages"][b, start:end][masks[b, start:end] == 1]
            assert torch.allclose(got, torch.full_like(got, value))
    assert not out.batch["advantages"][masks == 0].any()
