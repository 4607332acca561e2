"""Times every cyclic garbage collection of the platform's processes during a benchmark.

Put this directory on PYTHONPATH and name an output directory in BENCH_GC_DIR; every
``drcredit serve`` and ``drcredit worker`` process then writes, every 2 s, its
collections since ``tune_gc`` set the threshold (generation, objects freed, CPU seconds)
to ``gc-<pid>.json`` there. ``BENCH_GC_THRESHOLD`` replaces the threshold ``tune_gc``
sets, for an A/B of thresholds (the benchmark passes no DRCREDIT_ setting to the
platform). ``python -m bench.gc_report DIR`` prints the totals. The probe's own cost is
a thread waking every 2 s.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from typing import Any

_OUT = os.environ.get("BENCH_GC_DIR")
_ROLE = next((a for a in sys.argv[1:3] if a in ("serve", "worker")), None)

if _OUT and _ROLE:
    _collections: list[tuple[int, int, float]] = []
    _started: list[float] = [0.0]

    def _observe(phase: str, info: dict[str, Any]) -> None:
        if gc.get_threshold()[0] <= 700:
            return  # start-up, before tune_gc
        if phase == "start":
            _started[0] = time.process_time()
        else:
            _collections.append((info["generation"], info["collected"], time.process_time() - _started[0]))

    gc.callbacks.append(_observe)

    _threshold = int(os.environ.get("BENCH_GC_THRESHOLD", "0"))
    if _threshold:
        _set_threshold = gc.set_threshold

        def _replaced(first: int, *rest: int) -> None:
            _set_threshold(_threshold, *rest)

        gc.set_threshold = _replaced

    def _write() -> None:
        path = os.path.join(_OUT, f"gc-{os.getpid()}.json")
        while True:
            time.sleep(2)
            with open("/proc/self/status") as status:
                peak = next((line.split()[1] for line in status if line.startswith("VmHWM")), "0")
            document = {
                "role": _ROLE,
                "argv": sys.argv[1:],
                "threshold": gc.get_threshold()[0],
                "collections": list(_collections),
                "process_cpu_s": time.process_time(),
                "peak_rss_kb": int(peak),
            }
            with open(path + ".tmp", "w") as f:
                json.dump(document, f)
            os.replace(path + ".tmp", path)

    os.makedirs(_OUT, exist_ok=True)
    threading.Thread(target=_write, name="bench-gc-probe", daemon=True).start()
