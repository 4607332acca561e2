"""Score examples/group.json through a running DrCredit service with the client SDK.

Posts the group as a one-group batch (a trainer posts one batch per training step), waits
with a progress bar on stderr and prints the per-turn advantages of every rollout, then
the per-token advantages a trainer would put in its loss (with a toy tokenizer). It
starts nothing itself; run a service first, e.g. ``drcredit serve --port 8000``:

    python examples/sdk_batch.py --url http://127.0.0.1:8000

The URL defaults to $DRCREDIT_URL (else http://127.0.0.1:8000), the key to
$DRCREDIT_API_KEY. Each run uses fresh ids (``new_group_id``), so it scores anew; a
trainer would derive them from its run and step instead, so that re-posting after a
crash returns the stored results.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from drcredit.client import DrCreditClient, DrCreditError, new_group_id
from drcredit.trainers.tokens import broadcast_advantages, turn_advantages

GROUP = Path(__file__).with_name("group.json")


def _number(value: float | None) -> str:
    return "      -" if value is None else f"{value:+7.3f}"


def print_advantages(doc: dict[str, Any]) -> None:
    """One block per rollout: each turn's credit, process advantage and fused advantage."""
    stats = doc.get("stats") or {}
    print(f"group {doc['group_id']}: {doc['status']}  " + "  ".join(f"{k}={_number(v)}" for k, v in stats.items()))
    for ro in doc["rollouts"]:
        reward = "-" if ro["outcome_reward"] is None else f"{ro['outcome_reward']:.2f}"
        print(f"\nrollout {ro['id']}  reward {reward}  outcome advantage {_number(ro['outcome_advantage'])}")
        print("  turn  type     credit  process  advantage")
        for t in ro["turns"]:
            print(
                f"  {t['index']:>4}  {t['type']:<7} {_number(t['credit'])} {_number(t['process_advantage'])}"
                f"    {_number(t['advantage'])}"
            )


def toy_tokens(turn: dict[str, Any]) -> tuple[list[str], list[int]]:
    """A stand-in for a trainer's tokenizer: whitespace words of one turn.

    The words the policy wrote (reasoning, call, answer) get mask 1; the tool's
    observation (results, pages) gets mask 0, as a trainer masks it out of the loss.
    """
    policy = (
        " ".join(str(turn.get(k) or "") for k in ("reasoning", "answer")) + " " + json.dumps(turn.get("call") or {})
    )
    observation = json.dumps(turn.get("results") or turn.get("pages") or turn.get("response") or "")
    words, mask = policy.split(), [1] * len(policy.split())
    if turn["type"] != "answer":
        obs = observation.split()
        words += obs
        mask += [0] * len(obs)
    return words, mask


def print_token_advantages(doc: dict[str, Any], group: dict[str, Any]) -> None:
    """Per-token advantages: every policy token of a turn carries that turn's advantage."""
    print("\ntoken-level advantages (toy whitespace tokens; tool observations masked):")
    for ro, source in zip(doc["rollouts"], group["rollouts"], strict=True):
        spans, mask = [], []
        for turn in source["turns"]:
            _, turn_mask = toy_tokens(turn)
            spans.append((len(mask), len(mask) + len(turn_mask)))
            mask += turn_mask
        tokens = broadcast_advantages(turn_advantages(doc, ro["id"]), spans, mask)
        policy = [float(x) for x, m in zip(tokens, mask, strict=True) if m]
        head = " ".join(f"{x:+.2f}" for x in tokens[:12])
        print(f"  {ro['id']}: {len(tokens)} tokens ({len(policy)} policy), first 12: {head} ...")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", help="service URL (default: $DRCREDIT_URL, else http://127.0.0.1:8000)")
    parser.add_argument("--api-key", help="API key (default: $DRCREDIT_API_KEY)")
    parser.add_argument("--group", type=Path, default=GROUP, help="group JSON file (default: examples/group.json)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the results")
    args = parser.parse_args(argv)

    group = json.loads(args.group.read_text())
    group["group_id"] = new_group_id("sdk-example")
    try:
        with DrCreditClient(args.url, api_key=args.api_key) as client:
            accepted = client.submit_batch([group], batch_id=new_group_id("sdk-example-batch"))
            print(f"posted batch {accepted['batch_id']} to {client.base_url}: groups {accepted['group_ids']}")
            batch = client.wait_for_batch(accepted["batch_id"], timeout=args.timeout, progress=True)
    except DrCreditError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for doc in batch["groups"]:
        print_advantages(doc)
        print_token_advantages(doc, group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
