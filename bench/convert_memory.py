"""What one conversion (`POST /v1/convert`'s work) costs in memory, next to the parsed-size
estimate the parse budget charges it (docs/RELIABILITY.md, limits).

Each measurement runs in a fresh process: a rollout of `--steps` one-line steps
(`{"reward": 0, "done": false}`) is built, then the route's two thread jobs run on it
(`tracestore.api.routes.convert._read`: parse, validate and the cost the route charges;
`_answer`: convert to a trace and serialize the answer). Growth: peak RSS (ru_maxrss)
after, over the peak before, next to the estimate and to the charged cost.

    .venv/bin/python -m bench.convert_memory [--steps 20000 200000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence

MIB = 1024 * 1024


def measure(steps: int) -> dict[str, float]:
    """Body size, estimate, growth and answer size (MiB) of converting `steps` steps."""
    import orjson

    from tracestore.api.body import parsed_estimate
    from tracestore.api.routes.convert import _answer, _read

    doc = {
        "run_id": "convert-memory",
        "trajectories": [
            {"env_id": "e", "policy_id": "p", "steps": [{"reward": 0, "done": False}] * steps}
        ],
        "metrics": {"episode_returns": [0], "mean_return": 0, "num_steps": steps},
    }
    body = orjson.dumps(doc)
    del doc
    estimate = parsed_estimate(body)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    parsed, cost = _read(body, "trace")
    answer = _answer(parsed, "trace", False)
    del parsed
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "steps": steps,
        "body_mib": round(len(body) / MIB, 1),
        "estimate_mib": round(estimate / MIB, 1),
        "growth_mib": round((after - before) / 1024, 1),
        "answer_mib": round(len(answer) / MIB, 1),
        "charged_mib": round(cost / MIB, 1),
        "growth_per_estimate": round((after - before) * 1024 / estimate, 2),
        "growth_per_charge": round((after - before) * 1024 / cost, 2),
        "seconds": round(seconds, 2),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Measure each step count in a process of its own; print one JSON line each."""
    parser = argparse.ArgumentParser(prog="python -m bench.convert_memory", description=__doc__)
    parser.add_argument("--steps", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child's measurement
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return
    for steps in args.steps:
        done = subprocess.run(
            [sys.executable, "-m", "bench.convert_memory", "--one", str(steps)],
            check=True,
            capture_output=True,
            text=True,
        )
        print(done.stdout.strip())


if __name__ == "__main__":
    main()
