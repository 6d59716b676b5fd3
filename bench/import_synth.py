"""Import throughput of `tracestore import synth-db` (issue 16): sessions/s and events/s.

Usage: .venv/bin/python -m bench.import_synth [--sessions 1000] [--steps 5]
       [--db sqlite|postgresql|both]

The database is written once by synth-ai's own SessionTracer and storage in the producer's
venv (scripts/synth-venv; tests/compat/synth_tracer.py, mode `bulk`: each session a system
prompt and STEPS decisions of a user message, an LM call event with a tool call, the
assistant's tool-call message and an environment event, plus event rewards and an outcome
reward) and kept under bench/results/.cache/ for later runs. Then, for each backend, on a
new store:

- read + rebuild: the sessions read with sqlite3 and rebuilt as documents, nothing stored
  (the importer's own cost);
- import: the `tracestore import synth-db` command itself, as a user runs it (its closing
  line gives sessions/s and events/s);
- again: the same command a second time (every session a duplicate: what a resumed or
  repeated import costs).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import TRACESTORE, fresh_database, pg_available
from tracestore.ingest.synth_db import Imported, SynthDatabase, iter_rollouts

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / "results" / ".cache"
PRODUCER_SCRIPT = ROOT / "tests" / "compat" / "synth_tracer.py"
_SHM = Path("/dev/shm")
_LINE = re.compile(r"([\d,]+) sessions \(([\d,]+) events, ([\d,]+) messages\) .* in ([\d.]+)s")


def producer_python() -> Path:
    """The producer venv's python (scripts/synth-venv builds it on first use)."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "synth-venv")], capture_output=True, text=True, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1])


def synth_database(sessions: int, steps: int) -> Path:
    """The cached database of `sessions` sessions of `steps` decisions (written once)."""
    path = CACHE / f"synth-{sessions}x{steps}.db"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    # synth-ai's store commits (and syncs) every row: written on a RAM disk when there is
    # one, then copied next to the results.
    work = Path(
        subprocess.check_output(
            ["mktemp", "-d", "-p", str(_SHM if _SHM.is_dir() else Path("/tmp"))], text=True
        ).strip()
    )
    try:
        target = work / path.name
        request = {"mode": "bulk", "db": str(target), "sessions": sessions, "steps": steps}
        started = time.monotonic()
        done = subprocess.run(
            [str(producer_python()), str(PRODUCER_SCRIPT)],
            input=json.dumps(request).encode(),
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            sys.exit(f"the producer failed:\n{done.stderr.decode()[-3000:]}")
        print(
            f"wrote {path.name} with synth-ai's tracer in {time.monotonic() - started:.1f}s",
            file=sys.stderr,
        )
        shutil.copyfile(target, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return path


def read_and_rebuild(path: Path) -> tuple[int, int, float]:
    """(sessions, events, seconds) to read and rebuild every session, storing nothing."""
    started = time.perf_counter()
    sessions = events = 0
    with SynthDatabase(path) as db:
        for built in iter_rollouts(db, db.session_ids()):
            if isinstance(built, Imported):
                sessions += 1
                events += built.n_events
    return sessions, events, time.perf_counter() - started


def import_command(path: Path, url: str) -> tuple[str, float]:
    """Run `tracestore import synth-db`; its closing line and the wall time."""
    started = time.perf_counter()
    done = subprocess.run(
        [TRACESTORE, "import", "synth-db", str(path), "--db", url],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"import failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    lines = done.stdout.strip().splitlines()
    return "\n".join(lines[:2]), wall


def _rates(line: str) -> str:
    found = _LINE.search(line)
    if found is None:
        return "?"
    sessions, events, _, seconds = found.groups()
    s = float(seconds)
    return (
        f"{int(sessions.replace(',', '')) / s:,.0f} sessions/s, "
        f"{int(events.replace(',', '')) / s:,.0f} events/s"
    )


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    args = parser.parse_args()
    path = synth_database(args.sessions, args.steps)
    with SynthDatabase(path) as db:
        n_sessions = len(db.session_ids())
    print(f"database: {path} ({path.stat().st_size / 1e6:.1f} MB, {n_sessions:,} sessions)")
    sessions, events, seconds = read_and_rebuild(path)
    print(
        f"read + rebuild: {sessions:,} sessions, {events:,} events in {seconds:.2f}s: "
        f"{sessions / seconds:,.0f} sessions/s, {events / seconds:,.0f} events/s"
    )
    backends = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    if "postgresql" in backends and not pg_available():
        print("PostgreSQL unreachable: SQLite only")
        backends.remove("postgresql")
    for backend in backends:
        with fresh_database(backend) as url:
            first, wall = import_command(path, url)
            print(f"{backend} import (wall {wall:.2f}s): {_rates(first)}")
            print("  " + first.replace("\n", "\n  "))
            again, wall = import_command(path, url)
            print(f"{backend} again (wall {wall:.2f}s): {_rates(again)}")
            print("  " + again.replace("\n", "\n  "))


if __name__ == "__main__":
    main()
