"""Benchmark harness: `python -m bench.run` (see BENCHMARKS.md)."""
