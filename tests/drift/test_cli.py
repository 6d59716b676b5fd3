"""`tracestore drift` as a user runs it (a real subprocess), on both databases."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, delete

from tests.conftest import Database, Example
from tests.drift.helpers import created, ingest_examples, label_figures
from tracestore.db.uow import write_session
from tracestore.models.drift import DriftCheck, DriftFinding

TRACESTORE = shutil.which("tracestore", path=str(Path(sys.executable).parent)) or "tracestore"


def drift(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRACESTORE, "drift", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def stored(engine: Engine, database: Database, examples: list[Example]) -> str:
    """The examples ingested; the database URL."""
    ingest_examples(engine, examples)
    return database.url


def test_help_explains_every_option() -> None:
    done = drift("--help")
    assert done.returncode == 0, done.stderr
    for option in ("--format", "--output", "--fail-above", "--recompute", "--stale", "--since"):
        assert option in done.stdout


def test_json_report_has_the_label_figures(stored: str, examples: list[Example]) -> None:
    done = drift("--db", stored, "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    expected = label_figures(examples)
    assert report["summary"]["comparable_runs"] == expected["comparable_runs"]
    assert report["summary"]["drift_rate"] == pytest.approx(expected["drift_rate"])
    assert [p["phase"] for p in report["status"]["phases"]] == [1, 2, 3]
    worst = {r["run_id"] for r in report["worst_runs"]}
    assert worst == {e.label["run_id"] for e in created(examples) if e.label["drift"]}


def test_table_shows_the_headline(stored: str, examples: list[Example]) -> None:
    done = drift("--db", stored)
    assert done.returncode == 0, done.stderr
    expected = label_figures(examples)
    assert f"{expected['drift_rate']:.2%}" in done.stdout
    assert "migration gates" in done.stdout
    assert "reward_mismatch" in done.stdout


def test_fail_above_gates_ci(stored: str, examples: list[Example], tmp_path: Path) -> None:
    rate = label_figures(examples)["drift_rate"]
    out = tmp_path / "report.html"
    above = drift("--db", stored, "--fail-above", f"{rate / 2:.4f}", "-f", "html", "-o", str(out))
    assert above.returncode == 1
    assert "above" in above.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")  # the report is written anyway
    below = drift("--db", stored, "--fail-above", f"{min(rate * 2, 1):.4f}", "-f", "json")
    assert below.returncode == 0, below.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--since", "last tuesday"],
        ["--format", "pdf"],
        ["--fail-above", "2"],
        ["--stale"],
        ["--kind", "nonsense"],
    ],
)
def test_usage_errors_exit_2(stored: str, args: list[str]) -> None:
    done = drift("--db", stored, *args)
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip()


def _forget_drift(engine: Engine) -> None:
    """Every stored check and finding gone, as in a store from before drift."""
    with write_session(engine) as session:
        session.execute(delete(DriftFinding))
        session.execute(delete(DriftCheck))


def test_recompute_checks_runs_stored_before_drift(
    engine: Engine, stored: str, examples: list[Example]
) -> None:
    _forget_drift(engine)
    before = json.loads(drift("--db", stored, "-f", "json").stdout)
    assert before["summary"]["unchecked_runs"] == len(created(examples))
    assert before["status"]["notes"]  # says to recompute
    done = drift("--db", stored, "-f", "json", "--recompute", "--stale", "--batch-size", "25")
    assert done.returncode == 0, done.stderr
    n = len(created(examples))
    assert f"recomputed {n} of {n} runs in {-(-n // 25)} batches" in done.stderr
    after = json.loads(done.stdout)
    assert after["summary"]["unchecked_runs"] == 0
    assert (
        after["summary"]["comparable_runs_with_drift"]
        == label_figures(examples)["comparable_runs_with_drift"]
    )


def test_recompute_names_run_ids_not_in_the_store_and_exits_2(
    engine: Engine, stored: str, examples: list[Example]
) -> None:
    _forget_drift(engine)
    known = created(examples)[0].label["run_id"]
    done = drift(
        "--db", stored, "-f", "json", "--recompute", "--run", "no-such-run", "--run", known
    )
    assert done.returncode == 2, done.stderr
    assert "--run names no stored run: 'no-such-run'" in done.stderr
    assert known not in done.stderr
    # The known run was still recomputed, and the report still written.
    assert "recomputed 1 of 1 runs" in done.stderr
    report = json.loads(done.stdout)
    assert report["summary"]["unchecked_runs"] == len(created(examples)) - 1


def test_fail_above_without_comparable_runs_says_nothing_was_checked(stored: str) -> None:
    typo = drift("--db", stored, "--env", "no-such-env", "--fail-above", "0", "-f", "json")
    assert typo.returncode == 0, typo.stderr  # --help: without a rate the check passes
    assert "--fail-above checked nothing: no runs match the filters" in typo.stderr
    # Runs that match but cannot be compared (summary traces only) say so too.
    summary_only = drift("--db", stored, "--env", "banking", "--fail-above", "0", "-f", "json")
    assert summary_only.returncode == 0, summary_only.stderr
    runs = json.loads(summary_only.stdout)["summary"]["runs"]
    assert runs > 0
    assert f"none of the {runs} runs matching the filters is comparable" in summary_only.stderr
