"""DuckDB's memory: kept out of the API worker's process and bounded by a limit.

A report's working set on a PostgreSQL store used to land in the process serving the
API (hundreds of MiB for a million steps, in a worker whose ingest keeps to a few
hundred), and DuckDB's own limit is 80% of the machine's RAM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, free_port
from tests.reports.conftest import Store
from tracestore.errors import InvalidRequest
from tracestore.reports import live
from tracestore.reports.connection import AnalyticsError, new_connection
from tracestore.reports.filters import Filters
from tracestore.reports.memory import CGROUP_LIMITS, MEMORY_LIMIT_ENV
from tracestore.settings import Settings

MiB = 1 << 20
# DuckDB's work needs some memory per thread, one thread a core: a limit it can work in.
LIMIT_MIB = max(64, 8 * (os.cpu_count() or 1))
# A hash table of ~40 bytes an integer, past the limit (DuckDB spills it to disk).
DISTINCT_ROWS = LIMIT_MIB * 150_000
DISTINCT = f"SELECT count(*) AS n FROM (SELECT DISTINCT range FROM range({DISTINCT_ROWS}))"
# One list of 8-byte integers twice the limit: a single value, which DuckDB cannot spill.
ONE_LIST = f"SELECT length(list(range)) AS n FROM range({LIMIT_MIB * MiB // 4})"


def _status(field: str) -> int:
    """A figure of this process's /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


@pytest.fixture
def limited(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Fresh analytics children that read the environment this test sets (a child reads
    it when it starts), and fresh ones again after."""
    live.shutdown()
    yield monkeypatch
    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    live.shutdown()


def test_duckdb_work_takes_no_memory_in_this_process(store: Store) -> None:
    # The API calls live.* from its worker: what DuckDB holds must not be the worker's.
    live.query(store.url, "SELECT 1")  # the child started, the store attached
    Path("/proc/self/clear_refs").write_text("5")  # restart the peak (VmHWM) from now
    before = _status("VmHWM")
    got = live.query(store.url, DISTINCT)
    assert got.table.column("n").to_pylist() == [DISTINCT_ROWS]
    grown = _status("VmHWM") - before
    assert grown < 48 * MiB, f"this process's peak grew by {grown / MiB:.0f} MiB"


def test_the_memory_limit_applies_and_running_out_says_so(
    store: Store, limited: pytest.MonkeyPatch
) -> None:
    limited.setenv(MEMORY_LIMIT_ENV, f"{LIMIT_MIB}MiB")
    shown = live.query(store.url, "SELECT current_setting('memory_limit') AS limit")
    assert shown.table.column("limit").to_pylist() == [f"{LIMIT_MIB}.0 MiB"]
    spilled = live.query(store.url, DISTINCT)  # past the limit, spilled to disk
    assert spilled.table.column("n").to_pylist() == [DISTINCT_ROWS]
    with pytest.raises(InvalidRequest) as refused:
        live.query(store.url, ONE_LIST)
    assert "Out of Memory" in str(refused.value)
    assert f"memory limit here is {LIMIT_MIB}MiB: {MEMORY_LIMIT_ENV} sets it" in str(refused.value)


def test_without_a_setting_the_limit_is_an_eighth_of_the_memory_available(
    store: Store, limited: pytest.MonkeyPatch
) -> None:
    limited.delenv(MEMORY_LIMIT_ENV, raising=False)
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for cgroup in CGROUP_LIMITS:  # a container's limit, when lower
        path = Path(cgroup)
        if path.exists() and path.read_text().strip().isdigit():
            ram = min(ram, int(path.read_text()))
    shown = live.query(
        store.url,
        "SELECT current_setting('memory_limit') AS limit, "
        "current_setting('temp_directory') AS spill",
    )
    limit = shown.table.column("limit").to_pylist()[0]
    number, unit = limit.split()
    assert unit == "GiB" or unit == "MiB"
    got = float(number) * (1 << 30 if unit == "GiB" else MiB)
    assert abs(got - max(ram // 8, 256 * MiB)) < 0.01 * ram, limit
    # Spilled intermediates go to a directory of the child's own, not `.tmp` wherever the
    # server was started.
    spill = Path(shown.table.column("spill").to_pylist()[0])
    assert spill.parent.name.startswith("tracestore-duckdb-"), spill


def test_a_report_out_of_memory_is_a_503_with_the_error_shape(
    store: Store, limited: pytest.MonkeyPatch
) -> None:
    limited.setenv(MEMORY_LIMIT_ENV, "1MiB")
    with (
        LiveServer(Settings(database_url=store.url)) as server,
        httpx.Client(base_url=server.url, timeout=120) as client,
    ):
        got = client.get("/v1/reports/returns")
    assert got.status_code == 503, got.text
    error = got.json()["error"]
    assert error["code"] == "analytics_error"
    assert "Out of Memory" in error["message"]
    assert MEMORY_LIMIT_ENV in error["message"]


def test_a_limit_duckdb_cannot_read_is_named(store: Store, limited: pytest.MonkeyPatch) -> None:
    limited.setenv(MEMORY_LIMIT_ENV, "lots")
    with pytest.raises(AnalyticsError) as refused:
        live.report(store.url, "returns", Filters())
    assert f"{MEMORY_LIMIT_ENV}='lots' is not a memory size" in str(refused.value)


def test_serve_refuses_a_limit_duckdb_cannot_read_before_starting(tmp_path: Path) -> None:
    # Else each worker's reports would fail one by one, the server looking healthy.
    db = tmp_path / "store.db"
    done = subprocess.run(
        [
            *(str(Path(sys.executable).parent / "tracestore"), "serve", "--db", str(db)),
            *("--port", str(free_port())),  # were it to start: not on a port in use
        ],
        env={**os.environ, MEMORY_LIMIT_ENV: "lots"},
        capture_output=True,
        text=True,
        timeout=20,  # the refusal takes a second; a server started instead never ends
    )
    assert done.returncode == 2, done.stderr
    assert f"{MEMORY_LIMIT_ENV}='lots' is not a memory size DuckDB reads" in done.stderr
    assert "uvicorn" not in done.stderr.lower()  # no server started
    assert not db.exists()  # refused before the store was made


def test_an_export_out_of_memory_is_an_analytics_error_naming_the_limit(
    store: Store, limited: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Not the report's query: opening the store and the export's own statements, whose
    # DuckDB errors no caller maps (a 500 in the API, "internal error" in the CLI).
    limited.setenv(MEMORY_LIMIT_ENV, "1MiB")
    with pytest.raises(AnalyticsError) as refused:
        live.export(store.url, tmp_path / "snap", Filters())
    assert "Out of Memory" in str(refused.value)
    assert MEMORY_LIMIT_ENV in str(refused.value)


def test_a_killed_child_leaves_no_spilled_files(store: Store, limited: pytest.MonkeyPatch) -> None:
    limited.setenv(MEMORY_LIMIT_ENV, f"{LIMIT_MIB}MiB")
    live.query(store.url, DISTINCT)  # spilled under the pool's directory
    (root,) = live._spill_roots.values()
    assert Path(root).is_dir()
    pool = live._pool
    assert pool is not None
    for child in list(pool._processes.values()):  # as the OOM killer would
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    assert live.query(store.url, "SELECT 42 AS n").table.column("n").to_pylist() == [42]
    assert not Path(root).exists()
    assert root not in live._spill_roots.values()


def test_two_duckdbs_in_one_process_spill_apart() -> None:
    # DuckDB names its spill files alike in every instance and deletes them on close: in
    # one shared directory, the second DuckDB's close took the first one's spilled data.
    first, second = new_connection(), new_connection()
    try:
        for con in (first, second):
            con.execute("SET memory_limit = '64MiB'")
        first.execute("CREATE TABLE kept AS SELECT range AS x FROM range(20000000)")
        second.execute("CREATE TABLE t AS SELECT range AS x FROM range(20000000)")
        second.close()
        assert first.execute("SELECT sum(x) FROM kept").fetchone() == (199999990000000,)
    finally:
        first.close()


def test_checking_a_limit_leaves_duckdb_out_of_the_checking_process() -> None:
    # `tracestore serve`'s supervisor checks the limit and then runs no report: importing
    # duckdb to check kept ~40 MiB in it for its life.
    code = (
        "import sys\n"
        "from tracestore.reports.memory import check_memory_limit\n"
        "check_memory_limit()\n"
        "print('duckdb' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, MEMORY_LIMIT_ENV: "300MiB"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
