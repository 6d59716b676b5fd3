"""Time `compare_rollout` per rollout over examples/rollouts.jsonl (parsed documents in memory).

Usage: .venv/bin/python bench/drift_compare_time.py [rollouts.jsonl] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import orjson

from tracestore.drift import compare_rollout

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
DEFAULT = Path(os.environ.get("TRACESTORE_EXAMPLES_DIR", EXAMPLES_DIR)) / "rollouts.jsonl"


def main() -> None:
    """Print the mean and percentiles of compare_rollout time per rollout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    raw = args.path.read_bytes().splitlines()
    docs = [orjson.loads(line) for line in raw if line.strip()]
    sizes = [len(line) for line in raw if line.strip()]
    for doc in docs:  # warm-up
        compare_rollout(doc)
    per_doc: list[float] = []
    comparable: list[float] = []
    for _ in range(args.repeat):
        for doc in docs:
            start = time.perf_counter()
            result = compare_rollout(doc)
            elapsed = time.perf_counter() - start
            per_doc.append(elapsed)
            if result.comparable:
                comparable.append(elapsed)
    ms = sorted(t * 1000 for t in per_doc)
    cms = sorted(t * 1000 for t in comparable)
    print(f"{len(docs)} rollouts x {args.repeat}, mean size {statistics.mean(sizes) / 1024:.1f} KB")
    print(
        f"all:        mean {statistics.mean(ms):.3f} ms  p50 {ms[len(ms) // 2]:.3f} ms"
        f"  p99 {ms[int(len(ms) * 0.99)]:.3f} ms  max {ms[-1]:.3f} ms"
    )
    if cms:
        print(
            f"comparable: mean {statistics.mean(cms):.3f} ms  p50 {cms[len(cms) // 2]:.3f} ms"
            f"  max {cms[-1]:.3f} ms  ({len(cms) // args.repeat} rollouts)"
        )


if __name__ == "__main__":
    main()
