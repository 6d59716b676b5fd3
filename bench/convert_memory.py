"""What one conversion (`POST /v1/convert`'s work) costs in memory, next to the parsed-size
estimate and to what the route charges the parse budget for it (docs/RELIABILITY.md).

Each measurement runs in a fresh process: a rollout of `n` steps of one shape is built,
then the route's conversion runs on it (`tracestore.api.routes.convert._answer`: parse,
validate, convert and serialize the answer). Growth: peak RSS (ru_maxrss) after, over
the peak before, next to the estimate and to the charge (`_cost`, the route's first pass,
run afterwards).

Shapes (to a trace unless said): `line`, one-line steps `{"reward": 0, "done": false}`;
`min`, `{"reward": 0}`; `tools`, steps with an empty observation and one tool call;
`strings`, 1 KB string observations; `events`, a trace of one-line environment events
converted to trajectories.

    .venv/bin/python -m bench.convert_memory [--shape line min tools strings events] [--n 20000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

MIB = 1024 * 1024
STEPS: dict[str, Any] = {
    "line": {"reward": 0, "done": False},
    "min": {"reward": 0},
    "tools": {"obs": {}, "reward": 0, "done": False, "tool_calls": [{}]},
    "strings": {"obs": "x" * 1000, "reward": 0},
}


def _document(shape: str, n: int) -> tuple[dict[str, Any], str]:
    metrics = {"episode_returns": [0], "mean_return": 0, "num_steps": n}
    if shape == "events":
        trace = {
            "session_id": "convert-memory",
            "session_time_steps": [{"step_id": "s", "events": []}],
            "event_history": [{"event_type": "environment", "reward": 0}] * n,
            "markov_blanket_message_history": [],
        }
        return {"run_id": "m", "trajectories": [], "metrics": metrics, "trace": trace}, (
            "trajectories"
        )
    steps = [STEPS[shape]] * n
    trajectory = {"env_id": "e", "policy_id": "p", "steps": steps}
    return {"run_id": "m", "trajectories": [trajectory], "metrics": metrics}, "trace"


def measure(shape: str, n: int) -> dict[str, Any]:
    """Body size, estimate, charge, growth and answer size (MiB) of one conversion."""
    import orjson

    from tracestore.api.body import parsed_estimate
    from tracestore.api.routes.convert import _answer, _cost

    doc, to = _document(shape, n)
    body = orjson.dumps(doc)
    del doc
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    answer = _answer(body, to, False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    growth = (after - before) * 1024
    # Afterwards, so that their own peaks are not in `before`.
    estimate = parsed_estimate(body)
    cost = _cost(body, to)
    return {
        "shape": shape,
        "to": to,
        "n": n,
        "body_mib": round(len(body) / MIB, 1),
        "estimate_mib": round(estimate / MIB, 1),
        "charged_mib": round(cost / MIB, 1),
        "growth_mib": round(growth / MIB, 1),
        "answer_mib": round(len(answer) / MIB, 1),
        "growth_per_estimate": round(growth / estimate, 2),
        "growth_per_charge": round(growth / cost, 2),
        "seconds": round(seconds, 2),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Measure each shape in a process of its own; print one JSON line each."""
    parser = argparse.ArgumentParser(prog="python -m bench.convert_memory", description=__doc__)
    parser.add_argument("--shape", nargs="+", default=[*STEPS, "events"])
    parser.add_argument("--n", type=int, nargs="+", default=[20_000])
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # the child's measurement
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one[0], int(args.one[1]))))
        return
    for shape in args.shape:
        for n in args.n:
            done = subprocess.run(
                [sys.executable, "-m", "bench.convert_memory", "--one", shape, str(n)],
                check=True,
                capture_output=True,
                text=True,
            )
            print(done.stdout.strip())


if __name__ == "__main__":
    main()
