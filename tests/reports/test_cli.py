"""`tracestore report`, `sql` and `export`: in-process through Typer's runner, and the
console script itself as a user runs it (a few real subprocesses: each costs seconds)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type stubs
import pytest
from typer.testing import CliRunner

from tests.conftest import row_counts
from tests.reports.conftest import Store
from tracestore.cli.main import app
from tracestore.reports import output
from tracestore.reports.catalog import get_report, list_reports
from tracestore.reports.filters import Filters
from tracestore.reports.runner import run_report
from tracestore.reports.snapshot import read_manifest, verify_snapshot

TRACESTORE = str(Path(sys.executable).parent / "tracestore")


@dataclass
class Done:
    """What a command printed and its exit status."""

    returncode: int
    stdout: str
    stderr: str


def run(*args: str, stdin: str | None = None) -> Done:
    """The command line, in-process (same code path as the console script, no startup)."""
    result = CliRunner().invoke(app, list(args), input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Done(result.exit_code, result.stdout, result.stderr)


def script(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, in a real subprocess."""
    return subprocess.run(
        [TRACESTORE, *args], input=stdin, capture_output=True, text=True, timeout=300, check=False
    )


def test_help_explains_every_option() -> None:
    for verb, options in {
        "report": (
            "--list",
            "--since",
            "--until",
            "--env",
            "--format",
            "--output",
            "--db",
            "--from",
        ),
        "sql": ("--format", "--output", "--db", "--from"),
        "export": ("--since", "--until", "--db"),
    }.items():
        done = run(verb, "--help")
        assert done.returncode == 0, done.stderr
        for option in options:
            assert option in done.stdout, (verb, option)


def test_report_list_names_each_report_with_its_description() -> None:
    done = script("report", "--list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == [r.name for r in list_reports()]
    for line, report in zip(lines, list_reports(), strict=True):
        assert line.endswith(report.description)


def test_report_in_every_format(stores: dict[str, Store], tmp_path: Path) -> None:
    # One backend suffices here: the figures are identical on both (test_identical).
    store = stores.get("sqlite") or stores["postgresql"]
    want = run_report(store.live, get_report("returns"), Filters(env="toolbox"))
    args = ("report", "returns", "--db", store.url, "--env", "toolbox")
    as_json = run(*args, "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    body = json.loads(as_json.stdout)
    assert body["report"] == "returns"
    assert body["parameters"]["env"] == "toolbox"
    assert body["rows"] == output.rows(want.table)
    as_csv = run(*args, "--format", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    assert next(iter(csv.reader(io.StringIO(as_csv.stdout)))) == want.columns
    assert as_csv.stdout == output.to_csv(want)
    table = run(*args)
    assert table.returncode == 0
    assert "toolbox" in table.stdout
    assert "mean_return" in table.stdout
    target = tmp_path / "returns.parquet"
    as_parquet = run(*args, "--format", "parquet", "-o", str(target))
    assert as_parquet.returncode == 0, as_parquet.stderr
    assert pq.read_table(target).equals(want.table)


def test_usage_errors_exit_2_with_one_line(store: Store, tmp_path: Path) -> None:
    cases = [
        (("report", "nope", "--db", store.url), "no report named 'nope'"),
        (("report", "returns", "--since", "soon", "--db", store.url), "since: cannot read"),
        (("report", "returns", "--format", "parquet", "--db", store.url), "give -o FILE"),
        (("report", "--db", store.url), "give a report NAME"),
        (("report", "returns", "--db", f"sqlite:///{tmp_path / 'none.db'}"), "no SQLite store"),
        (("report", "returns", "--from", str(tmp_path)), "not a tracestore snapshot"),
        (("sql", "DELETE FROM runs", "--db", store.url), "only SELECT queries"),
        (("sql", "SELEC 1", "--db", store.url), "bad SQL"),
        (("export", str(store.snapshot), "--db", store.url), "not an empty directory"),
    ]
    before = row_counts(store.engine)
    for args, message in cases:
        done = run(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "none.db").exists()
    assert row_counts(store.engine) == before


def test_sql_reads_stdin_and_snapshots(store: Store) -> None:
    query = "SELECT count(*) AS runs FROM run_facts WHERE step_source = 'trace'"
    live = run("sql", "-", "--db", store.url, "-f", "json", stdin=query)
    assert live.returncode == 0, live.stderr
    frozen = run("sql", query, "--from", str(store.snapshot), "-f", "json")
    assert frozen.returncode == 0, frozen.stderr
    assert json.loads(live.stdout)["rows"] == json.loads(frozen.stdout)["rows"]
    assert json.loads(live.stdout)["rows"][0]["runs"] > 0


def test_sql_past_a_double_or_64_bits_is_answered(store: Store) -> None:
    # "internal error": DuckDB writes 1e400's parse tree with `Infinity` (orjson refused
    # it), and a HUGEINT past 64 bits could not be written as JSON.
    inf = run("sql", "SELECT 1e400 AS x", "--db", store.url, "-f", "csv")
    assert inf.returncode == 0, inf.stderr
    assert inf.stdout.splitlines()[1] == "inf"
    big = run(
        "sql", "SELECT 12345678901234567890123::HUGEINT AS x", "--db", store.url, "-f", "json"
    )
    assert big.returncode == 0, big.stderr
    assert json.loads(big.stdout)["rows"] == [{"x": 12345678901234567890123}]


def test_export_since_keeps_later_runs_and_their_rows(store: Store, tmp_path: Path) -> None:
    target = tmp_path / "later"
    done = run("export", str(target), "--since", "2025-11-19", "--db", store.url)
    assert done.returncode == 0, done.stderr
    assert f"to {target}" in done.stdout
    assert verify_snapshot(target) == []
    manifest = read_manifest(target)
    assert manifest.data["since"] == "2025-11-19T00:00:00+00:00"
    days = {f.split("/")[1] for f in manifest.tables["steps"].files}
    assert days == {"day=2025-11-19", "day=2025-11-20"}
    counts = run(
        "sql",
        "SELECT (SELECT count(*) FROM runs) AS runs, (SELECT count(*) FROM steps) AS steps, "
        "(SELECT count(*) FROM trace_events) AS events",
        "--db",
        store.url,
        "-f",
        "json",
    )
    assert counts.returncode == 0, counts.stderr
    want = run(
        "sql",
        "SELECT count(*) FILTER (WHERE day >= DATE '2025-11-19') AS runs FROM run_facts",
        "--db",
        store.url,
        "-f",
        "json",
    )
    assert manifest.tables["runs"].rows == json.loads(want.stdout)["rows"][0]["runs"]
    assert manifest.tables["runs"].rows < json.loads(counts.stdout)["rows"][0]["runs"]
    # Children came along with their runs, and only theirs.
    orphans = run(
        "sql",
        "SELECT count(*) AS n FROM steps WHERE run_pk NOT IN (SELECT id FROM runs)",
        "--from",
        str(target),
        "-f",
        "json",
    )
    assert json.loads(orphans.stdout)["rows"] == [{"n": 0}]
    # legacy_reads are not runs: exported whole.
    assert manifest.tables["legacy_reads"].rows == 4


def test_console_script_exports_and_reports_from_the_snapshot(
    stores: dict[str, Store], tmp_path: Path
) -> None:
    if "sqlite" not in stores:
        pytest.skip("SQLite not selected")
    store = stores["sqlite"]
    target = tmp_path / "snap"
    done = script("export", str(target), "--db", store.url)
    assert done.returncode == 0, done.stderr
    assert verify_snapshot(target) == []
    frozen = script("report", "tools", "--from", str(target), "--format", "json")
    assert frozen.returncode == 0, frozen.stderr
    want = run_report(store.live, get_report("tools"), Filters())
    assert json.loads(frozen.stdout)["rows"] == output.rows(want.table)
