"""GRPO with DrCredit's per-token advantages in TRL (trl 1.16): a minimal script.

    pip install -e ".[trl]"                            # from the repository root
    drcredit serve &                                   # or point DRCREDIT_URL at your deployment
    DRCREDIT_URL=http://127.0.0.1:8000 python examples/trl/train_grpo_drcredit.py --model Qwen/Qwen3-0.6B

The agent answers the question of ``examples/group.json`` with TRL's own multi-turn tool loop
(``tools=[search, visit]``); the stub tools below return canned JSON, so replace them with a
real search backend and page reader. ``rubric_reward`` stands in for your rubric grader (the
outcome reward). DrCredit adds process credit per turn; see ``docs/trainers.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from drcredit.trainers.scoring import DrCreditSettings
from drcredit.trainers.trl import DrCreditGRPOTrainer

GROUP = json.loads((Path(__file__).resolve().parents[1] / "group.json").read_text())


def search(queries: list[str]) -> str:
    """Search the web.

    Args:
        queries: One or more search queries.
    """
    hits = GROUP["rollouts"][0]["turns"][0]["results"]  # canned: replace with your search API
    # Return JSON text: TRL passes str(result) to the model, and DrCredit reads the same text back.
    return json.dumps({"results": [{k: h[k] for k in ("url", "title", "snippet")} for h in hits]})


def visit(urls: list[str], goal: str) -> str:
    """Read web pages and extract what serves the goal.

    Args:
        urls: The pages to read.
        goal: What to look for in them.
    """
    pages = [{"url": url, "evidence": "", "summary": "", "error": "offline example"} for url in urls]
    return json.dumps({"pages": pages})


def rubric_reward(completions: list[Any], rubrics: list[str], **_: Any) -> list[float]:
    """Outcome reward placeholder: the share of positive rubrics whose id the answer cites."""
    rewards = []
    for completion, rubric_json in zip(completions, rubrics, strict=True):
        answer = completion[-1]["content"] if isinstance(completion, list) else str(completion)
        positive = [r for r in json.loads(rubric_json) if r["weight"] > 0]
        rewards.append(sum(r["id"] in answer for r in positive) / max(len(positive), 1))
    return rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a chat model whose template supports tool calling")
    parser.add_argument("--output-dir", default="grpo-drcredit")
    parser.add_argument("--run-name", default="example", help="prefix of the DrCredit group and batch ids")
    args = parser.parse_args()

    row = {
        "prompt": [{"role": "user", "content": GROUP["question"]}],
        "question": GROUP["question"],  # what DrCredit's judge sees
        "rubrics": json.dumps(GROUP["rubrics"]),  # the group's rubrics (list or JSON text)
    }
    config = GRPOConfig(
        output_dir=args.output_dir,
        num_generations=8,  # one DrCredit group per prompt
        per_device_train_batch_size=8,
        max_completion_length=8192,
        max_steps=10,
        logging_steps=1,
        report_to="none",
    )
    trainer = DrCreditGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model),
        processing_class=AutoTokenizer.from_pretrained(args.model),
        reward_funcs=rubric_reward,
        args=config,
        train_dataset=Dataset.from_list([row] * 16),
        tools=[search, visit],
        drcredit=DrCreditSettings.from_config({"drcredit": {"id_prefix": f"{args.run_name}-"}}),
    )
    trainer.train()


if __name__ == "__main__":
    main()
