"""Totals of the garbage collections the probe in ``bench/gc_probe`` recorded.

BENCH_GC_DIR=/tmp/gc PYTHONPATH=bench/gc_probe python -m bench.run --sections repeat --repeat 4 --repeat-outcome --no-baseline
python -m bench.gc_report /tmp/gc
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    for path in sorted(Path(sys.argv[1]).glob("gc-*.json")):
        doc = json.loads(path.read_text())
        collections = doc["collections"]
        by_generation: dict[int, list[float]] = {}
        for generation, _, seconds in collections:
            by_generation.setdefault(generation, []).append(seconds)
        generations = ", ".join(f"gen{g}: {len(s)} in {sum(s):.3f} s" for g, s in sorted(by_generation.items()))
        longest = max((s for *_, s in collections), default=0.0)
        print(
            f"{doc['role']:6} pid {path.stem[3:]:>7}  threshold {doc['threshold']:>7}"
            f"  collections {len(collections):3}  GC {sum(s for *_, s in collections):.3f} s"
            f"  longest {longest:.3f} s  process CPU {doc['process_cpu_s']:.1f} s"
            f"  peak RSS {doc['peak_rss_kb'] // 1024} MB  ({generations or 'none'})"
        )


if __name__ == "__main__":
    main()
