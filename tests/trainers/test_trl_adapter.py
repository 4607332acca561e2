"""The TRL adapter against the installed trl (1.16.0) and the real service.

Runs only where trl is installed (the project's own test run skips it):

    scripts/test sets up .venv-trainers and runs it; by hand:
    .venv-trainers/bin/python -m pytest tests/trainers/test_trl_adapter.py

The trainer is a real ``DrCreditGRPOTrainer`` (a ``trl.GRPOTrainer``) around a randomly
initialised tiny Llama and a byte-level tokenizer built here (nothing is downloaded). The
generation step is TRL's own, fed by a ``rollout_func`` that plays a multi-turn search/visit
agent (TRL's supported hook for custom rollouts); rewards, reference/old log-probs, the
``_generate_and_score_completions`` batch and the loss are TRL's. The service is the real app
(embedded SQLite, offline judge) served by uvicorn on a free port.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")


from drcredit.client import DrCreditClient  # noqa: E402
from drcredit.trainers import trl as adapter  # noqa: E402
from drcredit.trainers.scoring import DrCreditSettings, make_turn_record  # noqa: E402
from drcredit.trainers.tokens import turn_advantages  # noqa: E402
from tests.trainers.tiny import byte_tokenizer  # noqa: E402

EXAMPLE = json.loads((Path(__file__).resolve().parents[2] / "examples" / "group.json").read_text())
NUM_GENERATIONS = 4
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def tiny_tokenizer() -> Any:
    return byte_tokenizer(CHAT_TEMPLATE)


def tiny_model(vocab_size: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=1,
    )
    return LlamaForCausalLM(config)


def dataset(rows: int) -> Any:
    from datasets import Dataset

    row = {
        "prompt": [{"role": "user", "content": "Research: " + EXAMPLE["question"]}],
        "question": EXAMPLE["question"],
        "rubrics": json.dumps(EXAMPLE["rubrics"]),
    }
    return Dataset.from_list([row] * rows)


class ScriptedAgent:
    """A ``rollout_func``: plays example rollouts turn by turn, as an agent with tools would.

    Each completion is the agent's generations (policy tokens, env_mask 1) interleaved with
    tool results (env_mask 0); it returns one DrCredit turn record per completion.
    """

    def __init__(self, tokenizer: Any, rollouts: list[int]) -> None:
        self.tokenizer, self.rollouts, self.calls = tokenizer, rollouts, 0
        self.layouts: list[tuple[list[dict[str, Any]], list[tuple[int, int]], list[int]]] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        tok = self.tokenizer
        prompt_ids, completion_ids, env_mask, records = [], [], [], []
        self.layouts = []
        for i, prompt in enumerate(prompts):
            prompt_ids.append(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)["input_ids"])
            turns = EXAMPLE["rollouts"][self.rollouts[i % len(self.rollouts)]]["turns"][:4]
            if turns[-1]["type"] != "answer":
                turns = [*turns, {"type": "answer", "reasoning": "done", "answer": "The coolant fitting failed."}]
            ids: list[int] = []
            mask: list[int] = []
            spans = []
            for turn in turns:
                generated = [*tok.encode(self.generation(turn), add_special_tokens=False), tok.eos_token_id]
                spans.append((len(ids), len(ids) + len(generated)))
                ids += generated
                mask += [1] * len(generated)
                if turn["type"] != "answer":
                    observation = tok.encode("\n<|im_start|>tool\n<tool_response>ok</tool_response><|im_end|>\n")
                    ids += observation
                    mask += [0] * len(observation)
            completion_ids.append(ids)
            env_mask.append(mask)
            records.append(make_turn_record(turns, spans))
            self.layouts.append((turns, spans, mask))
        self.calls += 1
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": [[0.0] * len(c) for c in completion_ids],
            "env_mask": env_mask,
            adapter.TURNS_KEY: records,
        }

    @staticmethod
    def generation(turn: dict[str, Any]) -> str:
        if turn["type"] == "answer":
            return "<answer>" + turn["answer"][:40] + "</answer>"
        arguments = turn["call"]
        return turn["reasoning"][:30] + f"<tool_call>{json.dumps({'name': turn['type'], 'arguments': arguments})[:60]}"


def reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """A stand-in rubric grader: a fixed reward per completion (the example's outcome rewards)."""
    return [EXAMPLE["rollouts"][i % 8]["outcome_reward"] for i in range(len(completions))]


def make_trainer(tmp_path: Path, service: str, agent: ScriptedAgent, tokenizer: Any, **config: Any) -> Any:
    from trl import GRPOConfig

    from drcredit.trainers.trl import DrCreditGRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=NUM_GENERATIONS * 2,
        num_generations=NUM_GENERATIONS,
        max_completion_length=4096,
        report_to="none",
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        **config,
    )
    return DrCreditGRPOTrainer(
        model=tiny_model(len(tokenizer)),
        reward_funcs=reward,
        args=args,
        train_dataset=dataset(NUM_GENERATIONS * 2),
        processing_class=tokenizer,
        rollout_func=agent,
        drcredit=DrCreditSettings(base_url=service, timeout_s=120, id_prefix="trl-"),
    )


def generation_inputs(trainer: Any) -> list[dict[str, Any]]:
    """The local generation batch as TRL's sampler gives it: each prompt num_generations times."""
    rows = [dict(trainer.train_dataset[0]) for _ in range(trainer.args.per_device_train_batch_size)]
    return [{**row, "rubrics": row["rubrics"]} for row in rows]


def test_per_token_advantages_replace_grpos(tmp_path: Path, service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = tiny_tokenizer()
    agent = ScriptedAgent(tokenizer, rollouts=[0, 1, 2, 3, 4, 5, 6, 7])
    trainer = make_trainer(tmp_path, service, agent, tokenizer)
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_inputs(trainer))

    advantages = output["advantages"]
    completion_mask, tool_mask = output["completion_mask"], output["tool_mask"]
    assert advantages.shape == output["completion_ids"].shape  # (B, T), not (B,)
    assert not advantages[(completion_mask * tool_mask) == 0].any()  # tool results and padding: 0

    # every policy token carries its turn's advantage from the service's own document
    with DrCreditClient(service) as client:
        for b, (turns, spans, _) in enumerate(agent.layouts):
            member = b % NUM_GENERATIONS
            document = client.advantages(trainer.drcredit_last_batch.group_ids[b], wait=30)
            values = turn_advantages(document, f"r{member}")
            assert len(values) == len(turns)
            rollout = next(r for r in document["rollouts"] if r["id"] == f"r{member}")
            assert rollout["outcome_reward"] == pytest.approx(EXAMPLE["rollouts"][b % 8]["outcome_reward"])
            for value, (start, end) in zip(values, spans, strict=True):
                torch.testing.assert_close(advantages[b, start:end], torch.full((end - start,), value))
    # turns differ within a rollout: process credit moved advantages off the outcome advantage
    assert any(
        len({round(float(v), 5) for v in advantages[b][advantages[b] != 0]}) > 1 for b in range(len(agent.layouts))
    )

    # TRL's own loss takes the (B, T) advantages as they are
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop
    loss = trainer.compute_loss(trainer.model, output)
    assert torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())


def test_eval_keeps_grpo_advantages(tmp_path: Path, service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = tiny_tokenizer()
    trainer = make_trainer(tmp_path, service, ScriptedAgent(tokenizer, rollouts=[0, 1, 2, 3]), tokenizer)
    trainer.model.eval()
    output = trainer._generate_and_score_completions(generation_inputs(trainer))
    assert output["advantages"].dim() == 1


def test_completion_record_from_trl_tool_loop_messages() -> None:
    """The shape TRL's built-in tool loop leaves: messages, and a tool_mask with one run per generation."""
    first = EXAMPLE["rollouts"][0]["turns"]
    results = {"results": [{k: r[k] for k in ("url", "title", "snippet")} for r in first[0]["results"]]}
    completion = [
        {
            "role": "assistant",
            "content": "Search first.",
            "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"queries": ["q"]}}}],
        },
        {"role": "tool", "name": "search", "content": json.dumps(results)},
        {
            "role": "assistant",
            "content": "Two pages.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "visit", "arguments": {"urls": [first[0]["results"][0]["url"]], "goal": "g"}},
                },
                {"type": "function", "function": {"name": "search", "arguments": {"queries": ["q2"]}}},
            ],
        },
        {"role": "tool", "name": "visit", "content": json.dumps({"pages": [{"evidence": "e", "summary": "s"}]})},
        {"role": "tool", "name": "search", "content": "No results found."},
        {"role": "assistant", "content": "<answer>done</answer>"},
    ]
    mask = [1] * 5 + [0] * 7 + [1] * 6 + [0] * 9 + [1] * 4
    record = adapter.completion_record(completion, mask)
    assert record["error"] is None, record["error"]
    assert [t["type"] for t in record["turns"]] == ["search", "visit", "search", "answer"]
    assert record["spans"] == [[0, 5], [12, 18], [12, 18], [27, 31]]  # one message, two calls: one span

    bad = adapter.completion_record(completion, [1] * 5 + [0] * 3 + [1] * 2)
    assert "3 assistant messages but 2 runs" in bad["error"]
    plain = adapter.completion_record("just text", [1, 1, 1])
    assert plain["turns"] == [{"type": "answer", "reasoning": "", "answer": "just text"}] and plain["spans"] == [[0, 3]]


def test_completion_record_keeps_the_ids_the_tools_printed() -> None:
    """TRL's tool loop hands the tools' return values over as text: two visits each printing their
    page as W101 (the later keeps it, the earlier takes W1), a search that failed, and a
    completion whose mask TRL left without a policy token (a rollout with no turns)."""
    url = EXAMPLE["rollouts"][0]["turns"][1]["call"]["urls"][0]

    def visit(k: int) -> list[dict[str, Any]]:
        arguments = {"urls": [url], "goal": f"g{k}"}
        pages = {"pages": [{"id": "W101", "url": url, "evidence": f"e{k}"}]}
        return [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "visit", "arguments": arguments}}],
            },
            {"role": "tool", "name": "visit", "content": json.dumps(pages)},
        ]

    completion = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "search", "arguments": {"query": "q"}}}],
        },
        {"role": "tool", "name": "search", "content": json.dumps({"error": "quota exceeded", "results": []})},
        *visit(0),
        *visit(1),
        {"role": "assistant", "content": '<answer><cite id="W101">e1</cite></answer>'},
    ]
    mask = [1, 0, 1, 0, 1, 0, 1]
    record = adapter.completion_record(completion, mask)
    assert record["error"] is None, record["error"]
    assert (record["turns"][0]["results"], record["turns"][0]["error"]) == ([], "quota exceeded")
    pages = [[(p["id"], p["evidence"]) for p in t["pages"]] for t in record["turns"][1:3]]
    assert pages == [[("W1", "e0")], [("W101", "e1")]]  # the report's W101 is the page it read last
    empty = adapter.completion_record(completion, [0] * 7)
    assert empty["error"] is None and empty["turns"] == [] and "no policy tokens" in empty["warning"]


def test_question_and_rubrics_from_rows() -> None:
    rubrics = EXAMPLE["rubrics"][:1]
    assert adapter.question_and_rubrics({"question": "q", "rubrics": json.dumps(rubrics)}) == ("q", rubrics)
    assert adapter.question_and_rubrics({"drcredit": {"question": "q", "rubrics": rubrics}}) == ("q", rubrics)
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "the question"}]
    assert adapter.question_and_rubrics({"prompt": prompt, "rubrics": rubrics}) == ("the question", rubrics)


def test_one_training_step(tmp_path: Path, service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``trainer.train()``: TRL buffers, shuffles and splits the (B, T) advantages and steps the optimizer."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = tiny_tokenizer()
    agent = ScriptedAgent(tokenizer, rollouts=[4, 5, 6, 7, 0, 1, 2, 3])
    trainer = make_trainer(tmp_path, service, agent, tokenizer, max_steps=1, gradient_accumulation_steps=2)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = trainer.train()
    assert result.global_step == 1 and agent.calls == 1
    # steps_per_generation = 2 accumulation steps: one generation batch of 2 x 8 completions = 4 groups
    assert trainer.drcredit_last_batch is not None and len(set(trainer.drcredit_last_batch.group_ids)) == 4
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters(), strict=True))
    logged = [entry for entry in trainer.state.log_history if "drcredit/token_advantage_abs_mean" in entry]
    assert logged and logged[0]["drcredit/token_advantage_abs_mean"] > 0
