"""The DuckDB extensions load, and reports run, with the network cut; and the fallback.

The offline runs happen in a child process inside a new, empty network namespace
(`unshare --net`: only a loopback interface, down), which first proves that it cannot
reach the internet nor resolve DuckDB's extension host. When no namespace can be made
here, the test process itself must be offline, else the test is skipped, never assumed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.reports.conftest import Store
from tracestore.reports import output
from tracestore.reports.catalog import get_report, list_reports
from tracestore.reports.connection import open_live
from tracestore.reports.filters import Filters
from tracestore.reports.runner import run_report

TRACESTORE = str(Path(sys.executable).parent / "tracestore")

PROVE_OFFLINE = textwrap.dedent(
    """
    import socket
    for host, port in (("1.1.1.1", 443), ("8.8.8.8", 53)):
        try:
            socket.create_connection((host, port), timeout=3).close()
        except OSError:
            pass
        else:
            raise SystemExit(f"NETWORK REACHABLE: {host}:{port}")
    try:
        socket.getaddrinfo("extensions.duckdb.org", 443)
    except OSError:
        pass
    else:
        raise SystemExit("NETWORK REACHABLE: extensions.duckdb.org resolves")
    """
)

LOAD_AND_RUN = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from tracestore.db.engine import create_engine
    from tracestore.reports import output
    from tracestore.reports.catalog import list_reports
    from tracestore.reports.connection import load_extension, new_connection, open_live
    from tracestore.reports.connection import open_snapshot
    from tracestore.reports.filters import Filters
    from tracestore.reports.runner import run_report

    con = new_connection()
    paths = [str(load_extension(con, b)) for b in ("sqlite", "postgresql")]
    loaded = sorted(
        name for (name,) in con.execute(
            "SELECT extension_name FROM duckdb_extensions() WHERE loaded"
        ).fetchall()
    )
    engine = create_engine(sys.argv[1])
    out = {"paths": paths, "loaded": loaded, "live": {}, "snapshot": {}}
    with open_live(engine, in_this_process=True) as analytics:
        out["notices"] = analytics.notices
        for report in list_reports():
            result = run_report(analytics, report, Filters())
            out["live"][report.name] = output.rows(result.table)
    with open_snapshot(Path(sys.argv[2])) as analytics:
        for report in list_reports():
            result = run_report(analytics, report, Filters())
            out["snapshot"][report.name] = output.rows(result.table)
    print(json.dumps(out))
    """
)


def _netns_prefix() -> list[str] | None:
    """A command prefix that runs in a new network namespace, or None when impossible."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    # As root a plain new namespace; otherwise inside a user namespace that maps us to root.
    candidates = [[unshare, "--net"]] if os.geteuid() == 0 else []
    candidates.append([unshare, "--net", "--map-root-user"])
    for prefix in candidates:
        probe = subprocess.run([*prefix, "true"], capture_output=True, check=False)
        if probe.returncode == 0:
            return prefix
    return None


def _offline(args: list[str]) -> subprocess.CompletedProcess[str]:
    prefix = _netns_prefix()
    if prefix is None:
        # No namespace here: the test process must already be offline, checked, not assumed.
        check = subprocess.run(
            [sys.executable, "-c", PROVE_OFFLINE], capture_output=True, text=True, check=False
        )
        if check.returncode != 0:
            pytest.skip(f"cannot cut the network here (no unshare --net): {check.stderr}")
        prefix = []
    return subprocess.run(
        [*prefix, *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_a_new_network_namespace_really_is_offline() -> None:
    if _netns_prefix() is None:
        pytest.skip("no network namespace available")
    done = _offline([sys.executable, "-c", PROVE_OFFLINE])
    assert done.returncode == 0, done.stdout + done.stderr


def test_extensions_load_and_reports_run_offline(stores: dict[str, Store]) -> None:
    if "sqlite" not in stores:
        pytest.skip("SQLite not selected")
    store = stores["sqlite"]
    script = PROVE_OFFLINE + LOAD_AND_RUN
    done = _offline([sys.executable, "-c", script, store.url, str(store.snapshot)])
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert {"postgres_scanner", "sqlite_scanner"} <= set(result["loaded"])
    assert all("site-packages/duckdb_extension_" in p for p in result["paths"])
    # Read through the extension, not the fallback: no notice.
    assert result["notices"] == []
    for report in list_reports():
        online = output.rows(run_report(store.live, report, Filters()).table)
        assert result["live"][report.name] == online, report.name
        assert result["snapshot"][report.name] == online, report.name


def test_the_cli_reports_offline(stores: dict[str, Store]) -> None:
    if "sqlite" not in stores:
        pytest.skip("SQLite not selected")
    store = stores["sqlite"]
    done = _offline([TRACESTORE, "report", "tools", "--db", store.url, "--format", "json"])
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    rows = json.loads(done.stdout)["rows"]
    assert rows == output.rows(run_report(store.live, get_report("tools"), Filters()).table)


@pytest.mark.parametrize("broken", ["missing", "corrupt"])
def test_an_extension_that_cannot_load_falls_back_to_reading_through_the_store(
    store: Store, tmp_path: Path, broken: str
) -> None:
    if broken == "corrupt":
        for name in ("sqlite_scanner", "postgres_scanner"):
            (tmp_path / f"{name}.duckdb_extension").write_bytes(b"\x7fELF not really")
    with open_live(store.engine, extension_dir=tmp_path, in_this_process=True) as analytics:
        assert len(analytics.notices) == 1
        assert "reading the store through SQLAlchemy" in analytics.notices[0]
        assert "\n" not in analytics.notices[0]
        # Through a cursor too (the API's way): the tables read into DuckDB are shared.
        with analytics.cursor() as cursor:
            for report in list_reports():
                want = run_report(store.live, report, Filters()).table
                assert run_report(analytics, report, Filters()).table.equals(want)
                assert run_report(cursor, report, Filters()).table.equals(want)


def test_the_cli_says_so_in_one_line_and_still_answers(
    stores: dict[str, Store], tmp_path: Path
) -> None:
    if "sqlite" not in stores:
        pytest.skip("SQLite not selected")
    store = stores["sqlite"]
    env = dict(os.environ, TRACESTORE_DUCKDB_EXTENSION_DIR=str(tmp_path))
    done = subprocess.run(
        [TRACESTORE, "report", "models", "--db", store.url, "-f", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "cannot load DuckDB's sqlite_scanner extension" in lines[0]
    body = json.loads(done.stdout)
    assert body["rows"] == output.rows(
        run_report(store.live, get_report("models"), Filters()).table
    )
    assert body["notices"] == [lines[0].removeprefix("note: ")]
