"""What *prepare* costs per rollout (validate, project, drift, reproduction), best of
several passes: the figure issue 19 asks to halve, made steady enough to compare two trees.

`bench.ingest_breakdown` times one pass, so a cold first pass (imports, caches, the
allocator's first arenas) lands in its figure: on 2026-12-04 its first round on one tree
gave 2.62 ms for the 108 KB corpus and its second 1.31. Here each pass prepares the same
documents again, the GC paused as ingest pauses it, and the best and median pass are
reported, with parse alone (orjson) for scale.

    .venv/bin/python -m bench.prepare_cost [--corpus multi|single] [--rollouts 200]
                                           [--passes 7]

To compare another tree (a `git worktree`), run this file as a script with that tree on
the path: `cd TREE && PYTHONPATH=TREE /work/main/.venv/bin/python
/work/main/bench/prepare_cost.py` (the corpus and tracestore then come from TREE).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.corpus import corpus
from tracestore.ingest.parse import parse_json
from tracestore.ingest.service import cyclic_gc_paused, prepare
from tracestore.store.rollouts import Prepared


def timed_pass(docs: Sequence[bytes]) -> tuple[float, float, list[Prepared]]:
    """One pass: seconds to parse `docs`, seconds to prepare them (their parse excluded),
    and the prepared rollouts."""
    start = time.perf_counter()
    for raw in docs:
        parse_json(raw)
    parse_s = time.perf_counter() - start
    start = time.perf_counter()
    with cyclic_gc_paused():  # as ingest_many does across a batch
        prepared = [prepare(raw) for raw in docs]  # parses again: less parse_s below
    return parse_s, time.perf_counter() - start - parse_s, prepared


def measure(kind: str, rollouts: int, passes: int) -> dict[str, Any]:
    """Milliseconds per rollout of prepare (parse excluded) and of parse, per pass."""
    docs = corpus(kind, rollouts)
    prepare_ms: list[float] = []
    parse_ms: list[float] = []
    for _ in range(passes):
        parse_s, prepare_s, prepared = timed_pass(docs)
        del prepared
        gc.collect()  # between passes, not inside one
        prepare_ms.append(prepare_s * 1000 / rollouts)
        parse_ms.append(parse_s * 1000 / rollouts)
    return {
        "corpus": kind,
        "rollouts": rollouts,
        "passes": passes,
        "prepare_best_ms": min(prepare_ms),
        "prepare_median_ms": statistics.median(prepare_ms),
        "parse_best_ms": min(parse_ms),
    }


def main() -> None:
    """Command line entry point: one line per corpus."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.prepare_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--corpus", choices=["multi", "single"], action="append")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    for kind in args.corpus or ["multi", "single"]:
        r = measure(kind, args.rollouts, args.passes)
        print(
            f"{kind}: prepare best {r['prepare_best_ms']:.3f} ms, median "
            f"{r['prepare_median_ms']:.3f} ms a rollout ({r['passes']} passes of "
            f"{r['rollouts']}); parse best {r['parse_best_ms']:.3f} ms"
        )


if __name__ == "__main__":
    main()
