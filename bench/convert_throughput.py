"""Conversion throughput (steps/s) over examples/rollouts.jsonl, parsed documents in memory.

Usage: .venv/bin/python bench/convert_throughput.py [rollouts.jsonl] [--repeat N]

Directions timed, each over every document it applies to:
- to trace: `trajectories_to_trace` on documents with trajectory steps;
- producer trace → trajectories: `trace_to_trajectories` on full/wrapped producer traces;
- our trace → trajectories: `trace_to_trajectories` on traces made by `trajectories_to_trace`
  (the exact reversal through the carry).
The source hash (sha256 of canonical JSON) is part of every conversion, so it is included.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from tracestore.convert import trace_to_trajectories, trajectories_to_trace
from tracestore.wire.trace import classify_trace

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
DEFAULT = Path(os.environ.get("TRACESTORE_EXAMPLES_DIR", EXAMPLES_DIR)) / "rollouts.jsonl"


def _steps(doc: Mapping[str, Any]) -> int:
    return sum(len(t.get("steps") or []) for t in doc.get("trajectories") or [])


def _time(name: str, inputs: list[Any], fn: Callable[[Any], Any], steps: int, repeat: int) -> None:
    for item in inputs:  # warm-up
        fn(item)
    start = time.perf_counter()
    for _ in range(repeat):
        for item in inputs:
            fn(item)
    elapsed = time.perf_counter() - start
    size = sum(len(orjson.dumps(item)) for item in inputs) / max(len(inputs), 1) / 1024
    print(
        f"{name:<34} {len(inputs):>3} docs (mean {size:6.1f} KB)"
        f"  {steps * repeat / elapsed:>10,.0f} steps/s"
        f"  {elapsed / (len(inputs) * repeat) * 1000:7.3f} ms/doc"
    )


def main() -> None:
    """Print steps/s and ms/doc for each conversion direction."""
    parser = argparse.ArgumentParser()
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    docs = [orjson.loads(line) for line in args.path.read_bytes().splitlines() if line.strip()]

    legacy = [d for d in docs if _steps(d)]
    legacy_steps = sum(_steps(d) for d in legacy)
    _time("trajectories -> trace", legacy, trajectories_to_trace, legacy_steps, args.repeat)

    producer = [d for d in docs if classify_trace(d.get("trace")) in ("full", "wrapped")]
    producer_steps = sum(len(t["steps"]) for d in producer for t in trace_to_trajectories(d).data)
    _time(
        "producer trace -> trajectories",
        producer,
        trace_to_trajectories,
        producer_steps,
        args.repeat,
    )

    ours = [trajectories_to_trace(d).data for d in legacy]
    _time(
        "our trace -> trajectories (carry)", ours, trace_to_trajectories, legacy_steps, args.repeat
    )


if __name__ == "__main__":
    main()
