"""The benchmarks the docs name still run to their end.

CI runs `python -m bench all --quick`; the others ran only when someone measured with
them, and two had stopped running unnoticed (bench.inspector_render posted a rollout the
parsed-size limit refuses; bench.drift_ingest_cost patched a function ingest no longer
calls). Each runs here once, as small as its options allow, on SQLite, in a subprocess,
and must exit 0 and leave bench/ as it was. What they measure is not checked: speed
targets live in the benchmarks themselves.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# module: arguments ({tmp} is a scratch directory of the test's).
SMALL_RUNS: dict[str, list[str]] = {
    "app_overhead": ["--posts", "200", "--rounds", "1"],
    "analytics_load": ["--db", "sqlite", "--steps", "2000", "--seconds", "2"],
    "analytics_memory": ["--db", "sqlite", "--steps", "5000"],
    "cli_startup": ["--runs", "2"],
    "convert_memory": ["--n", "2000"],
    "convert_throughput": ["--repeat", "1"],
    "delete_bench": ["--steps", "5000", "--no-pg", "--out", "{tmp}/delete"],
    "drift_compare_time": ["--repeat", "1"],
    "drift_ingest_cost": ["--copies", "1", "--rounds", "1", "--repeat", "1", "--no-pg"],
    "gc_probe": ["--db", "sqlite", "--posts", "200", "--clients", "4"],
    "group_cost": ["--db", "sqlite", "--groups", "1", "4", "--rollouts", "20", "--stored", "50"],
    "ingest": ["--db", "sqlite", "--rollouts", "20", "--repeats", "1"],
    "ingest_breakdown": ["--n-multi", "10", "--n-single", "50", "--db", "sqlite"],
    "inspector_render": ["--steps", "50", "--repeats", "1", "--out", "{tmp}/inspector.json"],
    "prepare_cost": ["--rollouts", "10", "--passes", "2", "--stages"],
    "reports_bench": ["--steps", "5000", "--repeat", "1", "--no-pg"],
    # Over the store bench.reports_bench keeps (made first: FIRST below).
    "reports_profile": ["{tmp}/reports", "--steps", "5000"],
    "request_floor": ["--clients", "1", "4", "--requests", "200"],
    "served_reads": [],
    "single_post_parts": ["--db", "sqlite", "--posts", "200"],
}


# A run another needs first: module -> (module, arguments).
FIRST = {
    "reports_profile": (
        "reports_bench",
        ["--steps", "5000", "--repeat", "1", "--no-pg", "--keep", "{tmp}/reports"],
    ),
}


def _run(module: str, args: list[str], tmp: Path) -> None:
    args = [a.format(tmp=tmp) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"bench.{module} {' '.join(args)}:\n{done.stderr[-3000:]}"


def _bench_state() -> str:
    done = subprocess.run(
        ["git", "status", "--porcelain", "--", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout if done.returncode == 0 else ""


@pytest.mark.parametrize("module", sorted(SMALL_RUNS))
def test_the_benchmark_runs_to_its_end(module: str, tmp_path: Path) -> None:
    before = _bench_state()
    if module in FIRST:
        _run(*FIRST[module], tmp_path)
    _run(module, SMALL_RUNS[module], tmp_path)
    assert _bench_state() == before, f"bench.{module} changed bench/"


def test_every_benchmark_with_an_entry_point_is_run_here_or_elsewhere() -> None:
    # A new benchmark joins the list above, or says where it runs instead.
    elsewhere = {
        "concurrency": "bench all --quick (CI)",
        "hostile_memory": "minutes a run: its attacks are the reliability suite's, in tests",
        "lookup": "a million-run store",
        "lookup_http": "a million-run store (bench.lookup --keep)",
        "lookup_asgi": "a million-run store (bench.lookup --keep)",
        "import_synth": "the producer's venv (scripts/synth-venv)",
        "overload": "writes bench/results/overload.* on every run",
        "disk_breakdown": "PostgreSQL and SQLite both, no option for one",
        "group_write": "PostgreSQL",
        "pg_insert_forms": "PostgreSQL",
        "ingest_examples": "PostgreSQL",
    }
    modules = {
        path.stem
        for path in (ROOT / "bench").glob("*.py")
        if "__main__" in path.read_text() and path.stem != "__main__"
    }
    assert modules - set(SMALL_RUNS) - set(elsewhere) == set()
    assert set(SMALL_RUNS) <= modules
