"""The command line never shows a traceback (issues 13 and 18): every verb, given bad paths,
FIFOs, corrupt gzip or bad URLs, says what is wrong in one line on stderr and exits 2.

Most cases run in-process (Typer's runner goes through the same group, which turns any
error into one line); a few run the console script itself, and FIFOs run with a short
TRACESTORE_FIFO_WAIT so that nothing can hang.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from tests.conftest import EXAMPLES, free_port, minimal_rollout
from tracestore.cli.main import app

TRACESTORE = shutil.which("tracestore", path=str(Path(sys.executable).parent)) or "tracestore"
LINES = (EXAMPLES / "rollouts.jsonl").read_bytes().splitlines(keepends=True)
FIFO_WAIT = "0.5"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a good store, good and bad input files, FIFOs nobody opens."""
    tmp_path = tmp_path_factory.mktemp("cli-errors")
    good = tmp_path / "good.jsonl"
    good.write_bytes(b"".join(LINES[:3]))
    whole = gzip.compress(b"".join(LINES[:15]))
    (tmp_path / "truncated.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])
    (tmp_path / "notgzip.jsonl.gz").write_bytes(b"".join(LINES[:2]))
    (tmp_path / "empty-dir").mkdir()
    os.mkfifo(tmp_path / "silent.jsonl")
    os.mkfifo(tmp_path / "silent.out")
    done = CliRunner().invoke(app, ["ingest", str(good), "--db", _db(tmp_path / "store.db")])
    assert done.exit_code == 0, done.stderr
    return tmp_path


@pytest.fixture
def place(files: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`files`, with a short FIFO wait and no store URL from the environment."""
    monkeypatch.setenv("TRACESTORE_FIFO_WAIT", FIFO_WAIT)
    monkeypatch.delenv("TRACESTORE_DATABASE_URL", raising=False)
    return files


def _db(path: Path) -> str:
    return f"sqlite:///{path}"


def one_line_error(args: list[str], expect: str, code: int = 2) -> None:
    """Run `tracestore ARGS` in-process: exit `code`, one line on stderr containing `expect`."""
    started = time.monotonic()
    done = CliRunner().invoke(app, args)
    assert done.exit_code == code, (args, done.exit_code, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, (args, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, (args, done.stderr)
    assert lines[0].startswith("error: "), (args, lines)
    assert expect in lines[0], (args, lines[0])
    assert time.monotonic() - started < 30, args  # and never a hang


BAD_URLS = [
    ("mysql://user@host/db", "not 'mysql'"),
    ("nonsense", "cannot read 'nonsense' as a database URL"),
    ("postgresql+psycopg://nobody@127.0.0.1:1/none", "cannot use the database"),
]
STORE_VERBS = [
    ["show", "some-run"],
    ["cid", "some-cid"],
    ["drift"],
    ["backfill"],
    ["report", "returns"],
    ["sql", "SELECT 1"],
    ["db", "current"],
    ["db", "check"],
    ["db", "upgrade"],
    ["db", "downgrade", "base"],
]


@pytest.mark.parametrize(("url", "expect"), BAD_URLS)
@pytest.mark.parametrize("verb", STORE_VERBS, ids=lambda v: "-".join(v))
def test_bad_database_urls(place: Path, verb: list[str], url: str, expect: str) -> None:
    one_line_error([*verb, "--db", url], expect)


@pytest.mark.parametrize(("url", "expect"), BAD_URLS)
def test_demo_reads_a_bad_database_url_as_every_verb_does(
    place: Path, url: str, expect: str
) -> None:
    # It said "bad database URL: Could not parse SQLAlchemy URL from given URL string",
    # naming neither the URL nor the forms it takes.
    one_line_error(["demo", "--db", url], expect)


@pytest.mark.parametrize("verb", [["ingest", "good.jsonl"], ["demo"]], ids=lambda v: v[0])
def test_ingest_and_demo_post_to_tracestore_url_as_the_read_verbs_read_from_it(
    place: Path, verb: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Exported for `show` and `runs`, TRACESTORE_URL was ignored by these two: the
    # rollouts went to a new ./tracestore.db, the summary saying "created". A server that
    # cannot be reached now says so, and no local store is made.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRACESTORE_URL", "http://127.0.0.1:1")
    args = [str(place / verb[1]) if v.endswith(".jsonl") else v for v in verb]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 2, done.stdout + done.stderr
    assert "http://127.0.0.1:1" in done.stderr
    assert not (tmp_path / "tracestore.db").exists()


@pytest.mark.parametrize("port", ["99999", "0", "-1"])
def test_serve_refuses_a_port_outside_the_range(place: Path, port: str) -> None:
    # 99999 was announced while the server listened on 99999 mod 65536 (34463).
    done = CliRunner().invoke(app, ["serve", "--port", port, "--db", _db(place / "x.db")])
    assert done.exit_code == 2, done.stderr
    assert "--port" in done.stderr
    assert not (place / "x.db").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_taken_port_or_an_unknown_host_is_one_line(place: Path, workers: str) -> None:
    # uvicorn printed its start-up lines after the banner, then the bind's errno, exit 3.
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        for host, expect in [
            ("127.0.0.1", f"cannot listen on 127.0.0.1:{port}: Address already in use"),
            ("no-such-host.invalid", f"cannot listen on no-such-host.invalid:{port}: "),
        ]:
            args = ["serve", "--host", host, "--port", port, "--workers", workers]
            done = subprocess.run(
                [TRACESTORE, *args, "--db", _db(place / "served.db")],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 2, (host, done.stdout, done.stderr)
            assert done.stderr.startswith("error: " + expect), done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
            assert "tracestore" not in done.stdout, done.stdout  # no banner: nothing served


@pytest.mark.parametrize(
    "verb",
    [["runs"], ["dataset", "create", "later"], ["drift"], ["report", "returns"], ["export"]],
    ids=lambda v: "-".join(v),
)
def test_a_since_not_before_until_is_refused_by_every_verb(place: Path, verb: list[str]) -> None:
    # `runs` and `dataset create` selected nothing without a word (a dataset of no runs
    # was then refused as empty); the reports said it.
    args = [*verb, "--since", "1d", "--until", "2d", "--db", _db(place / "store.db")]
    if verb == ["export"]:
        args.append(str(place / "never-written"))
    one_line_error(args, "must be before until")
    assert not (place / "never-written").exists()


@pytest.mark.parametrize("where", ["--db", "--url"])
def test_drift_days_have_the_apis_bounds_whatever_answers(place: Path, where: str) -> None:
    # --db took any number of days, --url refused past 3660 (the route's bound).
    target = _db(place / "store.db") if where == "--db" else "http://127.0.0.1:1"
    one_line_error(["drift", "--days", "3661", where, target], "less than or equal to 3660")
    one_line_error(["drift", "--days", "0", where, target], "greater than or equal to 1")


def test_the_bind_check_binds_as_the_server_will() -> None:
    # An IPv6 wildcard is bound IPv6-only (asyncio's create_server does so): a port that
    # IPv4's wildcard holds is free for it. The first check probed a dual-stack socket and
    # refused `serve --host ::` that uvicorn would have served.
    from tracestore.api.server import check_address

    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6")
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        try:
            assert check_address("::", port) == socket.AF_INET6
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:  # no IPv6 on this machine
                pytest.skip(f"no IPv6 address to bind: {exc}")
            raise
        with pytest.raises(OSError, match="in use"):
            check_address("0.0.0.0", port)
        with pytest.raises(OSError, match="in use"):
            check_address("localhost", port)  # resolves to 127.0.0.1 (and ::1): taken


def test_an_unknown_schema_revision_is_named_and_makes_no_store(place: Path) -> None:
    # "internal error: CommandError", and `upgrade` had made an empty store (an Alembic
    # version table only) that every verb then called out of date.
    new = place / "never-made.db"
    for verb in (["db", "upgrade", "bogusrev"], ["db", "downgrade", "bogusrev"]):
        one_line_error([*verb, "--db", _db(new)], "no schema revision 'bogusrev'")
    assert not new.exists()
    # A step Alembic refuses, on a real store: its reason, not an internal error.
    one_line_error(["db", "upgrade", "+9", "--db", _db(place / "store.db")], "+9")


def test_a_structured_setting_that_is_not_json_is_named(
    place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "internal error: SettingsError: error parsing value for field ...", where every
    # other bad setting is named.
    monkeypatch.setenv("TRACESTORE_RETENTION_RULES", "not json")
    for verb in (["retention", "show"], ["runs"]):
        one_line_error(
            [*verb, "--db", _db(place / "store.db")], "TRACESTORE_RETENTION_RULES: not valid JSON"
        )


@pytest.mark.parametrize("verb", STORE_VERBS, ids=lambda v: "-".join(v))
def test_bad_sqlite_paths(place: Path, verb: list[str]) -> None:
    if verb != ["db", "upgrade"]:  # upgrade creates a new store; the others need one
        one_line_error([*verb, "--db", _db(place / "missing.db")], "no SQLite store at")
        assert not (place / "missing.db").exists()
    one_line_error([*verb, "--db", _db(place / "empty-dir")], "is not a SQLite database file")
    # SQLite would block forever reading a FIFO.
    one_line_error([*verb, "--db", _db(place / "silent.out")], "is not a SQLite database file")


def test_markup_in_arguments_is_text(place: Path) -> None:
    db = _db(place / "store.db")
    one_line_error(["show", "[/x]", "--db", db], "no rollout with run_id '[/x]'")
    # Nor emoji codes: Rich printed `NAME:KEY:admin` with a key emoji in the middle.
    one_line_error(["show", "NAME:KEY:admin :fire:", "--db", db], "'NAME:KEY:admin :fire:'")
    one_line_error(["cid", "[/x]", "--db", db], "'[/x]'")
    one_line_error(["show", "[bold]x[/bold]", "--db", db], "'[bold]x[/bold]'")
    # An ingest summary quoting such a run id (a conflict).
    doc = orjson.loads(LINES[0])
    doc["run_id"] = "[/x] [bold]r :fire:"
    first, second = place / "markup-1.json", place / "markup-2.json"
    first.write_bytes(orjson.dumps(doc))
    doc["metrics"]["mean_return"] = 1234.5
    second.write_bytes(orjson.dumps(doc))
    markup_db = _db(place / "markup.db")
    assert CliRunner().invoke(app, ["ingest", str(first), "--db", markup_db]).exit_code == 0
    done = CliRunner().invoke(app, ["ingest", str(second), "--db", markup_db])
    assert done.exit_code == 2, done.stderr
    assert "run_id '[/x] [bold]r :fire:' was already stored" in done.stdout
    assert done.stderr == ""


def test_usage_errors_are_one_line(place: Path) -> None:
    one_line_error(["--db", "x", "show", "a"], "No such option: --db")
    one_line_error(["show"], "Missing argument")
    one_line_error(["report", "returns", "--format", "nope"], "'nope' is not one of")
    one_line_error(["nosuchverb"], "No such command")


def test_export_to_bad_places(place: Path) -> None:
    db = _db(place / "store.db")
    one_line_error(["export", str(place / "good.jsonl"), "--db", db], "good.jsonl")
    one_line_error(["export", str(place / "silent.out"), "--db", db], "not an empty directory")
    one_line_error(["report", "returns", "--from", str(place / "empty-dir")], "not a tracestore")


def test_outputs_to_bad_places(place: Path) -> None:
    db = _db(place / "store.db")
    nowhere = str(place / "no-such-dir" / "out")
    one_line_error(["sql", "SELECT 1 AS x", "--db", db, "-o", nowhere], "No such file or directory")
    one_line_error(["drift", "--db", db, "-o", nowhere], "No such file or directory")
    one_line_error(["drift", "--db", db, "-o", str(place / "empty-dir")], "Is a directory")
    good = str(place / "good.jsonl")
    one_line_error(["convert", "to-trace", good, "-o", nowhere], "No such file or directory")
    # A FIFO nobody reads: given up after TRACESTORE_FIFO_WAIT, never a hang.
    fifo = str(place / "silent.out")
    one_line_error(["sql", "SELECT 1 AS x", "--db", db, "-o", fifo], "a FIFO nobody read from")
    one_line_error(["drift", "--db", db, "-f", "json", "-o", fifo], "a FIFO nobody read from")
    one_line_error(["convert", "to-trace", good, "-o", fifo], "a FIFO nobody read from")


def test_convert_bad_inputs(place: Path) -> None:
    one_line_error(
        ["convert", "to-trace", str(place / "notgzip.jsonl.gz")], "notgzip.jsonl.gz: not gzip data"
    )
    one_line_error(
        ["convert", "to-trace", str(place / "silent.jsonl")], "a FIFO nobody wrote to within 0.5s"
    )
    done = CliRunner().invoke(
        app, ["convert", "to-trace", str(place / "truncated.jsonl.gz"), "-o", str(place / "o")]
    )
    assert done.exit_code == 2
    assert "truncated.jsonl.gz: the gzip data ends early after" in done.stderr
    assert "Traceback" not in done.stderr
    # What came before the damage was converted and written.
    assert (place / "o").read_bytes().count(b"\n") >= 1


@pytest.mark.parametrize("setting", ["ten", "-1", "nan", "-inf"])
def test_a_bad_fifo_wait_is_refused_not_replaced(
    place: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    # It fell back to 10 s without a word: a typo in the setting went unnoticed.
    monkeypatch.setenv("TRACESTORE_FIFO_WAIT", setting)
    refusal = (
        f"TRACESTORE_FIFO_WAIT must be a number of seconds, 0 or more, or inf (got {setting!r})"
    )
    started = time.monotonic()
    one_line_error(
        ["convert", "to-trace", str(place / "silent.jsonl")],
        f"silent.jsonl: {refusal}",
    )
    one_line_error(
        ["sql", "SELECT 1 AS x", "--db", _db(place / "store.db"), "-o", str(place / "silent.out")],
        f"silent.out: {refusal}",
    )
    assert time.monotonic() - started < 5  # refused at once, not after a wait
    # `ingest` names the FIFO as a file it could not read, and stores the others.
    done = CliRunner().invoke(
        app,
        [
            "ingest",
            str(place / "silent.jsonl"),
            str(place / "good.jsonl"),
            "--db",
            _db(place / "w.db"),
        ],
    )
    assert done.exit_code == 2, done.stderr
    assert f"silent.jsonl: {refusal}" in done.stderr
    assert "1 file could not be read" in done.stdout, done.stdout


def test_fifo_wait_takes_seconds_and_inf(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracestore.ingest.files import DEFAULT_FIFO_WAIT, fifo_wait

    monkeypatch.delenv("TRACESTORE_FIFO_WAIT", raising=False)
    assert fifo_wait() == DEFAULT_FIFO_WAIT
    cases = [("", DEFAULT_FIFO_WAIT), (" ", DEFAULT_FIFO_WAIT), ("0", 0.0), ("2.5", 2.5)]
    for text, seconds in [*cases, (" 3 ", 3.0), ("inf", float("inf"))]:
        monkeypatch.setenv("TRACESTORE_FIFO_WAIT", text)
        assert fifo_wait() == seconds


def test_ingest_names_each_bad_file_and_keeps_going(place: Path) -> None:
    db = _db(place / "fresh.db")
    assert not (place / "fresh.db").exists()
    args = [
        "ingest",
        str(place / "truncated.jsonl.gz"),
        str(place / "notgzip.jsonl.gz"),
        str(place / "missing.json"),
        str(place / "empty-dir"),
        str(place / "silent.jsonl"),
        str(place / "good.jsonl"),
        "--db",
        db,
    ]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "Aborted" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 5, done.stderr
    for name, why in [
        ("truncated.jsonl.gz", "the gzip data ends early after"),
        ("notgzip.jsonl.gz", "not gzip data"),
        ("missing.json", "no such file"),
        ("empty-dir", "a directory without rollout files"),
        ("silent.jsonl", "a FIFO nobody wrote to"),
    ]:
        assert any(name in e and why in e for e in errors), (name, errors)
    assert "5 files could not be read" in done.stdout
    # The good file, and the documents before the truncation, were stored.
    stored = int(done.stdout.split(" rollouts:")[0].split()[-1])
    assert stored > 3
    show = CliRunner().invoke(app, ["show", _run_id(0), "--db", db, "--raw"])
    assert show.exit_code == 0, show.stderr


def _run_id(line: int) -> str:
    run_id: str = orjson.loads(LINES[line])["run_id"]
    return run_id


def test_ingest_reads_a_directory_and_a_fifo_someone_writes(place: Path) -> None:
    folder = place / "batch"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(b"".join(LINES[3:5]))
    (folder / "b.json.gz").write_bytes(gzip.compress(LINES[5]))
    (folder / "notes.txt").write_text("not rollouts")
    (folder / ".hidden.json").write_text("{not json")
    fifo = place / "stream.jsonl"
    os.mkfifo(fifo)

    def writer() -> None:
        time.sleep(0.2)  # the reader is already waiting
        with fifo.open("wb") as f:
            f.write(b"".join(LINES[6:8]))

    thread = threading.Thread(target=writer)
    thread.start()
    done = CliRunner().invoke(app, ["ingest", str(folder), str(fifo), "--db", _db(place / "d.db")])
    thread.join()
    assert done.exit_code == 0, done.stdout + done.stderr
    assert "5 rollouts:" in done.stdout
    assert "0 conflict, 0 invalid" in done.stdout


def test_ctrl_c_on_an_ingest_prints_what_was_stored(place: Path) -> None:
    # Ctrl-C said "error: aborted" (exit 1) and nothing of the rollouts already stored.
    fifo = place / "endless.jsonl"
    os.mkfifo(fifo)
    store = place / "interrupted.db"
    proc = subprocess.Popen(
        [TRACESTORE, "ingest", str(fifo), "--db", _db(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C's disposition as at a terminal: a suite started in the background (as CI
        # starts it) passes on an ignored SIGINT, and Python then never raises on it.
        preexec_fn=_default_sigint,
    )
    try:
        with fifo.open("wb") as stream:
            # One batch (64) goes in and is committed; the 65th waits in the next batch.
            for i in range(65):
                stream.write(orjson.dumps(minimal_rollout(f"ctrl-c-{i:02d}")) + b"\n")
            stream.flush()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if store.exists() and _count_runs(store) == 64:
                    break
                time.sleep(0.1)
            assert _count_runs(store) == 64
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert err.strip() == "interrupted", err
    assert "64 rollouts: 64 created, 0 duplicate, 0 conflict, 0 invalid" in out, out
    assert "interrupted: the rollouts after these were not sent" in out, out


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _count_runs(store: Path) -> int:
    with contextlib.closing(sqlite3.connect(store, timeout=30)) as conn:
        try:
            return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
        except sqlite3.OperationalError:  # not migrated yet
            return 0


def test_ingest_into_a_bad_url_or_store(place: Path) -> None:
    good = str(place / "good.jsonl")
    one_line_error(["ingest", good, "--db", "mysql://x/y"], "not 'mysql'")
    one_line_error(["ingest", good, "--db", _db(place / "empty-dir")], "not a SQLite database")
    one_line_error(["ingest", good, "--db", _db(place / "nodir" / "x.db")], "cannot create")
    one_line_error(["ingest", good, "--url", f"http://127.0.0.1:{free_port()}"], "cannot reach")


def test_the_console_script_itself(place: Path) -> None:
    """The same through the installed script: no traceback, no 'Aborted', no hang."""
    env = {**os.environ, "TRACESTORE_FIFO_WAIT": FIFO_WAIT}
    cases = [
        (["show", "[/x]", "--db", _db(place / "store.db")], "'[/x]'"),
        (["show", "x", "--db", "mysql://h/db"], "not 'mysql'"),
        (["ingest", str(place / "truncated.jsonl.gz"), "--db", _db(place / "s.db")], "ends early"),
        (["ingest", str(place / "silent.jsonl"), "--db", _db(place / "s.db")], "nobody wrote"),
        (["convert", "to-trace", str(place / "notgzip.jsonl.gz")], "not gzip data"),
    ]
    for args, expect in cases:
        done = subprocess.run(
            [TRACESTORE, *args], capture_output=True, text=True, env=env, timeout=60, check=False
        )
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        assert "Aborted" not in done.stderr, (args, done.stderr)
        assert expect in done.stderr, (args, done.stderr)


@pytest.mark.parametrize(
    ("value", "expect"),
    [("0", "greater than 0"), ("1000", "less than or equal to 999"), ("many", "valid integer")],
)
@pytest.mark.parametrize(
    "verb", [["serve", "--port", "1"], ["demo"], ["ingest", "-"]], ids=lambda v: v[0]
)
def test_a_bad_setting_is_named_in_one_line_by_every_verb(
    place: Path, monkeypatch: pytest.MonkeyPatch, verb: list[str], value: str, expect: str
) -> None:
    # `serve` and `demo` said "internal error: InvalidRequest: ..." for a bad setting.
    monkeypatch.setenv("TRACESTORE_GROUP_COMMIT_MAX_ROLLOUTS", value)
    one_line_error([*verb, "--db", _db(place / "store.db")], "TRACESTORE_GROUP_COMMIT_MAX_ROLLOUTS")
    done = CliRunner().invoke(app, [*verb, "--db", _db(place / "store.db")])
    assert expect in done.stderr
    assert "internal error" not in done.stderr


def test_show_of_an_empty_run_id_says_so_with_db_or_url(place: Path) -> None:
    # With --url the client's refusal of an empty run_id came out as an internal error.
    one_line_error(["show", "", "--db", _db(place / "store.db")], "no rollout with run_id ''")
    one_line_error(["show", "", "--url", "http://127.0.0.1:9"], "no rollout with run_id ''")


def test_tracestore_database_url_wins_over_tracestore_url(
    place: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The contract: verbs take --db, default TRACESTORE_DATABASE_URL. With TRACESTORE_URL
    # exported beside it (a task-app host's client), ingest posted to that server and
    # never touched the store named, saying "created"; show read the server.
    store = tmp_path / "named.db"
    monkeypatch.setenv("TRACESTORE_DATABASE_URL", _db(store))
    monkeypatch.setenv("TRACESTORE_URL", "http://127.0.0.1:1")  # nothing listens there
    done = CliRunner().invoke(app, ["ingest", str(place / "good.jsonl")])
    assert done.exit_code == 0, done.stdout + done.stderr
    assert "created" in done.stdout
    assert "TRACESTORE_URL is not used" in done.stderr
    assert store.exists()
    run_id = orjson.loads((place / "good.jsonl").read_bytes().splitlines()[0])["run_id"]
    shown = CliRunner().invoke(app, ["show", run_id, "--raw"])
    assert shown.exit_code == 0, shown.stderr
    assert orjson.loads(shown.stdout)["run_id"] == run_id
    # --url still reads the server, whatever the environment says.
    remote = CliRunner().invoke(app, ["show", run_id, "--url", "http://127.0.0.1:1"])
    assert remote.exit_code == 2
    assert "http://127.0.0.1:1" in remote.stderr
