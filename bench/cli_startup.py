"""How long `tracestore --help` takes, and what `import tracestore.cli.main` costs.

Usage: .venv/bin/python -m bench.cli_startup [--runs N] [--source DIR]

Runs the console script's entry point (`python -c 'from tracestore.cli.main import app;
app()' --help`, what .venv/bin/tracestore does) N times in fresh interpreters and prints
the median and best wall time, then the slowest imports from `python -X importtime`.
`--source DIR` measures another copy of the package (e.g. an older revision unpacked with
`git archive`), imported from DIR instead of the checkout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ENTRY = (
    "import sys; sys.argv = ['tracestore', '--help']; from tracestore.cli.main import app; app()"
)


def _env(source: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    return env


def wall_times(runs: int, source: Path | None) -> list[float]:
    """Seconds for each of `runs` fresh `tracestore --help`."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", ENTRY],
            stdout=subprocess.DEVNULL,
            check=True,
            env=_env(source),
            cwd=source or Path.cwd(),
        )
        times.append(time.perf_counter() - started)
    return times


def slowest_imports(source: Path | None, n: int = 12) -> list[tuple[int, str]]:
    """(cumulative microseconds, module) of the slowest imports of the CLI module."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import tracestore.cli.main"],
        capture_output=True,
        text=True,
        check=True,
        env=_env(source),
        cwd=source or Path.cwd(),
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    return sorted(rows, reverse=True)[:n]


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--source", type=Path, default=None)
    args = parser.parse_args()
    times = wall_times(args.runs, args.source)
    print(
        f"tracestore --help: median {statistics.median(times):.3f}s, best {min(times):.3f}s "
        f"over {args.runs} runs ({sys.executable})"
    )
    print("slowest imports of tracestore.cli.main (cumulative):")
    for micros, module in slowest_imports(args.source):
        print(f"  {micros / 1000:8.1f} ms  {module}")


if __name__ == "__main__":
    main()
