"""What Python's cyclic collector costs a worker under single posts (bench/README.md item
18): `tracestore serve` (one worker) runs with a `gc.callbacks` probe that times every
collection by generation; 32 clients post the 1.2 KB corpus; the probe's counts and
seconds over the measurement are printed next to the worker's CPU.

    .venv/bin/python -m bench.gc_probe [--db sqlite|postgresql] [--posts 5000]
        [--clients 32] [--tree PATH]   # --tree: serve that checkout's tracestore (A/B)
"""

from __future__ import annotations

import argparse
import ast
import gc
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

STATS_ENV = "TRACESTORE_BENCH_GC_STATS"


def _serve_probed(argv: list[str]) -> None:
    """Run the tracestore CLI with every collection timed into the file STATS_ENV names
    (rewritten every 0.2 s: the worker is stopped by a signal, not left to exit)."""
    stats: dict[str, list[Any]] = {"n": [0, 0, 0], "seconds": [0.0, 0.0, 0.0]}
    started: dict[int, float] = {}

    def timed(phase: str, info: dict[str, Any]) -> None:
        generation = info["generation"]
        if phase == "start":
            started[generation] = time.perf_counter()
        else:
            stats["n"][generation] += 1
            stats["seconds"][generation] += time.perf_counter() - started[generation]

    gc.callbacks.append(timed)
    path = Path(os.environ[STATS_ENV])

    def write_forever() -> None:
        # Renamed into place: the reader never sees a file half written (write_text
        # truncates first, and a read in between found it empty).
        staged = path.with_name(path.name + ".new")
        while True:
            time.sleep(0.2)
            staged.write_text(repr(stats))
            os.replace(staged, path)

    threading.Thread(target=write_forever, daemon=True).start()
    from tracestore.cli.main import app

    sys.argv = ["tracestore", *argv]
    app()


def _read(path: Path) -> dict[str, list[Any]]:
    time.sleep(0.5)  # the probe's next write
    stats: dict[str, list[Any]] = ast.literal_eval(path.read_text())
    return stats


def main(argv: list[str] | None = None) -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(prog="python -m bench.gc_probe", description=__doc__)
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="postgresql")
    parser.add_argument("--posts", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--tree", default=None)
    parser.add_argument("--serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        _serve_probed(args.serve)
        return
    # Here, not at the top: the server side runs this file alone, with another tree first.
    from bench.common import free_port, fresh_database
    from bench.concurrency import LOG, Seeds, measure, serving

    seeds = Seeds()
    with tempfile.TemporaryDirectory() as tmp, fresh_database(args.db) as url:
        stats = Path(tmp) / "gc-stats"
        env = {STATS_ENV: str(stats)}
        # The probe from this checkout; tracestore from --tree when given.
        env["PYTHONPATH"] = os.pathsep.join(
            [*([args.tree] if args.tree else []), str(Path(__file__).resolve().parent.parent)]
        )
        port = free_port()
        serve = ["serve", "--db", url, "--port", str(port), "--workers", "1", *LOG]
        # By path, not `-m`: `-m` puts the working directory first on sys.path, where
        # this checkout's tracestore would shadow the tree's.
        command = [sys.executable, str(Path(__file__).resolve()), "--serve", *serve]
        with serving(command, port, env, 1) as (base, pid):
            measure(base, pid, seeds.take("single", 40), 4, batch=False)  # warm-up
            before = _read(stats)
            f = measure(base, pid, seeds.take("single", args.posts), args.clients, batch=False)
            after = _read(stats)
    n = [a - b for a, b in zip(after["n"], before["n"], strict=True)]
    seconds = [a - b for a, b in zip(after["seconds"], before["seconds"], strict=True)]
    cpu = f["server_cpu_ms_per_rollout"] * args.posts / 1000
    print(
        f"{args.db}, {args.clients} clients, {args.posts} posts, one worker"
        f"{' of ' + args.tree if args.tree else ''}: {f['rollouts_per_s']} posts/s, "
        f"{f['server_cpu_ms_per_rollout']} ms of CPU per post ({cpu:.2f} s)\n"
        f"collections by generation 0/1/2: {n[0]} / {n[1]} / {n[2]}, taking "
        f"{seconds[0]:.3f} / {seconds[1]:.3f} / {seconds[2]:.3f} s "
        f"({100 * sum(seconds) / cpu:.0f}% of the worker's CPU)"
    )


if __name__ == "__main__":
    main()
