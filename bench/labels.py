"""Labels from people on embedded defaults: import 1,000 labels, then audit the judge against them.

    python -m bench.labels [--labels 1000] [--repeats 3]

The service runs in this process as ``drcredit serve`` would without configuration: the
embedded SQLite database, in-process execution, the offline judge. Copies of
``examples/group.json`` are scored first (not timed); each repeat then imports
``--labels`` labels in one ``POST /v1/labels/import`` (two labelers of its own, who
overlap on a fifth of the keys, values drawn with a fixed seed) and runs
``POST /v1/audits`` with ``"judge": "human"`` over those labelers; both are timed from the
request to its answer. Prints the median and worst of the repeats.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from drcredit.settings import Settings
from drcredit_api.app import create_app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "group.json"
TOPS = {"visit": 2, "snippet": 1, "report_rubric": 4, "citation": 2}


def _groups(client: TestClient, wanted_keys: int) -> list[dict[str, Any]]:
    """Score copies of the example until their judgments give ``wanted_keys`` items; the items."""
    example = json.loads(EXAMPLE.read_text())
    items: list[dict[str, Any]] = []
    k = 0
    while len(items) < wanted_keys:
        group_id = f"bench-labels-{k}"
        r = client.post("/v1/groups", json={**example, "group_id": group_id, "metadata": {"run": "bench", "step": k}})
        assert r.status_code == 202, r.text
        done = client.get(f"/v1/groups/{group_id}/advantages", params={"wait": 120})
        assert done.status_code == 200, done.text
        queue = client.get(
            "/v1/labels/queue", params={"group_ids": group_id, "labeler": "nobody", "n": 500, "kind": "visit,snippet"}
        )
        assert queue.status_code == 200, queue.text
        items += queue.json()["items"]
        k += 1
    return items


def _labels(items: list[dict[str, Any]], count: int, repeat: int) -> list[dict[str, Any]]:
    """``count`` labels: the first labeler's on 60% of as many items, the second's on the
    next 20% and on the last fifth of the first's (where the two overlap)."""
    rng = random.Random(repeat)
    first, overlap = int(count * 0.6), int(count * 0.2)
    ann = items[:first]
    ben = items[first - overlap : first] + items[first : first + count - first - overlap]
    labels = [
        {"item_id": i["item_id"], "value": rng.randint(0, TOPS[i["kind"]]), "labeler": name}
        for name, chosen in ((f"ann-{repeat}", ann), (f"ben-{repeat}", ben))
        for i in chosen
    ]
    assert len(labels) == count, len(labels)
    return labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'drcredit.sqlite3'}", judge="offline", broker_url=None
        )
        with TestClient(create_app(settings)) as client:
            started = time.perf_counter()
            items = _groups(client, args.labels)
            print(
                f"setup: {len(items)} labelable judgments scored in {time.perf_counter() - started:.1f} s",
                file=sys.stderr,
            )
            imports, audits = [], []
            for repeat in range(args.repeats):
                labels = _labels(items, args.labels, repeat)
                t0 = time.perf_counter()
                r = client.post("/v1/labels/import", json={"labels": labels})
                t1 = time.perf_counter()
                assert r.status_code == 201 and r.json()["stored"] == args.labels, r.text
                body = {"judge": "human", "scope": {"run": "bench"}, "labelers": [f"ann-{repeat}", f"ben-{repeat}"]}
                r = client.post("/v1/audits", json=body)
                assert r.status_code == 202, r.text
                doc = client.get(f"/v1/audits/{r.json()['audit_id']}")
                t2 = time.perf_counter()
                assert doc.status_code == 200 and doc.json()["usage"]["labels"] == args.labels, doc.text
                imports.append(t1 - t0)
                audits.append(t2 - t1)
    totals = [a + b for a, b in zip(imports, audits, strict=True)]
    for name, values in (("import", imports), ("audit", audits), ("import + audit", totals)):
        print(
            f"{name:>15}: median {statistics.median(values):.3f} s, worst {max(values):.3f} s ({args.repeats} repeats)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
