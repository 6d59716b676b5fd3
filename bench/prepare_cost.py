"""What *prepare* costs per rollout (validate, project, drift, reproduction), best of
several passes: the figure issue 19 asks to halve, made steady enough to compare two trees.

`bench.ingest_breakdown` times one pass, so a cold first pass (imports, caches, the
allocator's first arenas) lands in its figure: on 2026-12-04 its first round on one tree
gave 2.62 ms for the 108 KB corpus and its second 1.31. Here each pass prepares the same
documents again, the GC paused as ingest pauses it, and the best and median pass are
reported, with parse alone (orjson) for scale.

    .venv/bin/python -m bench.prepare_cost [--corpus multi|single] [--rollouts 200]
                                           [--passes 7] [--stages]

`--stages` also times prepare's own calls one by one (validation, correlation, the trace's
view, projection, drift comparison and reproduction check, content hash): where a
rollout's prepare goes.

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
from tracestore.correlation import resolve_correlation
from tracestore.drift.rows import drift_rows
from tracestore.ingest.parse import parse_json, validate_rollout
from tracestore.ingest.project import project_rollout
from tracestore.ingest.service import cyclic_gc_paused, prepare
from tracestore.store.documents import content_hash
from tracestore.store.rollouts import Prepared
from tracestore.wire.trace import reusing_views, view_trace

STAGES = ("validate", "correlation", "view", "project", "drift", "hash")


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


def stage_times(kind: str, rollouts: int, passes: int) -> dict[str, float]:
    """Milliseconds per rollout of each of prepare's own calls, best of `passes`: as
    `prepare` makes them, the view read first (projection and drift then reuse it)."""
    raws = corpus(kind, rollouts)
    docs = [parse_json(raw) for raw in raws]
    best = dict.fromkeys(STAGES, float("inf"))
    for _ in range(passes):
        spent = dict.fromkeys(STAGES, 0.0)
        with cyclic_gc_paused():
            for raw, doc in zip(raws, docs, strict=True):
                t0 = time.perf_counter()
                valid = validate_rollout(doc)
                t1 = time.perf_counter()
                resolution = resolve_correlation(valid)
                t2 = time.perf_counter()
                with reusing_views():
                    trace = valid.get("trace")
                    if isinstance(trace, dict):
                        view_trace(trace)
                    t3 = time.perf_counter()
                    project_rollout(valid, resolution)
                    t4 = time.perf_counter()
                    drift_rows(valid, resolution)
                    t5 = time.perf_counter()
                content_hash(raw)
                t6 = time.perf_counter()
                for name, took in zip(
                    STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5), strict=True
                ):
                    spent[name] += took
        gc.collect()
        for name in STAGES:
            best[name] = min(best[name], spent[name] * 1000 / rollouts)
    return best


def main() -> None:
    """Command line entry point: one line per corpus."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.prepare_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--corpus", choices=["multi", "single"], action="append")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--stages", action="store_true", help="also time each stage")
    args = parser.parse_args()
    for kind in args.corpus or ["multi", "single"]:
        r = measure(kind, args.rollouts, args.passes)
        print(
            f"{kind}: prepare best {r['prepare_best_ms']:.3f} ms, median "
            f"{r['prepare_median_ms']:.3f} ms a rollout ({r['passes']} passes of "
            f"{r['rollouts']}); parse best {r['parse_best_ms']:.3f} ms"
        )
        if args.stages:
            stages = stage_times(kind, args.rollouts, args.passes)
            print("  stages, best: " + ", ".join(f"{k} {v:.3f} ms" for k, v in stages.items()))


if __name__ == "__main__":
    main()
