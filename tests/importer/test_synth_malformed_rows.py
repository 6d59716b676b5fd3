"""One malformed row of synth-ai's database, read where the import reads the session list
or a batch: the session is reported (invalid), every other one imported.

The rows are written with SQL, as no tracer writes them: text that is not UTF-8 in a TEXT
column (`CAST(X'..' AS TEXT)`), BLOBs and numbers where synth-ai writes text, JSON nested
deeper than Python's parser goes.
"""

from __future__ import annotations

import ast
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import Database
from tracestore.ingest.synth_db import (
    _COLUMNS,
    IMPORT_KEY,
    Imported,
    SynthDatabase,
    Unreadable,
    UnreadableId,
    iter_rollouts,
)

TRACESTORE = str(Path(sys.executable).parent / "tracestore")
CREATED = "'2025-11-20T12:00:00+00:00'"
# Text that is not UTF-8 ("h", 0xFF, "i"): what Python's sqlite3 cannot give as str.
NOT_UTF8 = "CAST(X'68FF69' AS TEXT)"


def _synth_db(path: Path, sessions: list[dict[str, str]]) -> Path:
    """A database of synth-ai's tables (as the importer reads them, columns untyped so a
    value keeps the type it is written with): per session, the SQL of its session_traces
    values (session_id, and created_at, metadata, experiment_id when given), and one
    message and one time step keyed by the same session_id expression."""
    conn = sqlite3.connect(path)
    for table, columns in _COLUMNS.items():
        conn.execute(f'CREATE TABLE "{table}" ({", ".join(columns)})')
    for values in sessions:
        row = {"created_at": CREATED, "metadata": "'{}'", "num_messages": "1", **values}
        conn.execute(
            f"INSERT INTO session_traces ({', '.join(row)}) VALUES ({', '.join(row.values())})"
        )
        sid = row["session_id"]
        conn.execute(
            "INSERT INTO messages (id, session_id, message_type, content) "
            f"VALUES (NULL, {sid}, 'user', 'hi')"
        )
        conn.execute(
            "INSERT INTO session_timesteps (id, session_id, step_id, step_index) "
            f"VALUES (NULL, {sid}, 'decision_0', 0)"
        )
    conn.commit()
    conn.close()
    return path


def _import(path: Path, store: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRACESTORE, "import", "synth-db", str(path), "--db", store],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _outcomes(path: Path, batch: int) -> dict[str, Imported | Unreadable]:
    with SynthDatabase(path) as db:
        return {o.session_id: o for o in iter_rollouts(db, db.session_ids(), batch=batch)}


def test_a_session_id_not_utf8_is_reported_and_the_others_imported(
    tmp_path: Path, fresh_db: Database
) -> None:
    # The session list could not be read (the driver decodes every id): the import
    # stopped before its first session, on every run again.
    path = _synth_db(
        tmp_path / "synth.db",
        [{"session_id": "'ok-1'"}, {"session_id": NOT_UTF8}, {"session_id": "'ok-2'"}],
    )
    for batch in (64, 1):
        found = _outcomes(path, batch)
        assert set(found) == {"ok-1", "h\\xffi", "ok-2"}
        bad = found["h\\xffi"]
        assert isinstance(bad, Unreadable)
        assert "session_id is not UTF-8 text" in bad.message
        assert "X'68FF69'" in bad.message  # the row, found with this in the sqlite3 shell
        # The good sessions keep their own rows; none of the bad session's is joined.
        for sid in ("ok-1", "ok-2"):
            good = found[sid]
            assert isinstance(good, Imported)
            assert good.n_messages == 1
            assert len(good.doc["trace"]["session_time_steps"]) == 1
    for run in (1, 2):
        done = _import(path, fresh_db.url)
        assert done.returncode == 2, done.stderr
        assert "error:" not in done.stderr, done.stderr
        created = "2 created" if run == 1 else "2 duplicate"
        assert created in done.stdout
        assert "1 invalid" in done.stdout
        assert "session_id is not UTF-8 text" in done.stdout
        # Named as its text shows it, the escape not doubled (repr made it 'h\\\\xffi').
        assert "session 'h\\xffi'" in done.stdout, done.stdout
    engine = create_engine(fresh_db.url)
    try:
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT run_id FROM runs ORDER BY run_id")).scalars()
            assert list(stored) == ["ok-1", "ok-2"]
    finally:
        engine.dispose()


def test_a_blob_session_id_is_reported_as_not_text(tmp_path: Path) -> None:
    # Its rows were read (the BLOB binds), then the rebuild failed with "Object of type
    # bytes is not JSON serializable", which named neither the column nor the problem.
    path = _synth_db(
        tmp_path / "synth.db",
        [{"session_id": "'ok-1'"}, {"session_id": "X'6869'"}, {"session_id": "X'68FF69'"}],
    )
    with SynthDatabase(path) as db:
        ids = db.session_ids()
        assert ids[0] == "ok-1"
        assert all(isinstance(sid, UnreadableId) for sid in ids[1:])
    found = _outcomes(path, 64)
    assert isinstance(found["ok-1"], Imported)
    for shown, literal in (("hi", "X'6869'"), ("h\\xffi", "X'68FF69'")):
        bad = found[shown]
        assert isinstance(bad, Unreadable)
        assert f"session_id is a BLOB ({literal}), not text" in bad.message


def test_a_numeric_session_id_imports_and_is_given_as_text(tmp_path: Path) -> None:
    # A column without TEXT affinity keeps a number as one; its children are keyed by the
    # same number, so it is bound as a number. Imported.session_id was that number (typed
    # str), beside its run_id "123".
    path = _synth_db(tmp_path / "synth.db", [{"session_id": "123"}, {"session_id": "'ok-1'"}])
    found = _outcomes(path, 64)
    built = found["123"]
    assert isinstance(built, Imported)
    assert (built.session_id, built.run_id) == ("123", "123")
    assert built.n_messages == 1
    assert built.doc["trace"]["session_id"] == 123  # the document keeps the stored value


def test_experiment_ids_of_mixed_types_are_read(tmp_path: Path) -> None:
    # The batch's experiment ids were sorted: an integer beside text raised TypeError and
    # stopped the whole import (not one session's fault, so not reported as one).
    path = _synth_db(
        tmp_path / "synth.db",
        [
            {"session_id": "'ok-1'", "experiment_id": "'exp-a'"},
            {"session_id": "'ok-2'", "experiment_id": "7"},
        ],
    )
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO experiments (experiment_id, name) VALUES ('exp-a', 'a'), (7, 'b')")
    conn.commit()
    conn.close()
    found = _outcomes(path, 64)
    names = {}
    for sid, built in found.items():
        assert isinstance(built, Imported), built
        names[sid] = built.doc["trace"]["experiment"]["name"]
    assert names == {"ok-1": "a", "ok-2": "b"}


def test_json_nested_past_pythons_parser_is_reported(tmp_path: Path) -> None:
    # orjson stops at 1,024 levels and the stdlib then raised RecursionError, which
    # stopped the whole import with "internal error".
    deep = "[" * 20_000 + "]" * 20_000
    path = _synth_db(
        tmp_path / "synth.db",
        [{"session_id": "'ok-1'"}, {"session_id": "'deep'", "metadata": f"'{deep}'"}],
    )
    found = _outcomes(path, 64)
    assert isinstance(found["ok-1"], Imported)
    bad = found["deep"]
    assert isinstance(bad, Unreadable)
    assert "maximum recursion depth" in bad.message


@pytest.mark.parametrize(
    ("created_at", "imported"),
    [
        # The session list orders by created_at without reading it; the batch's read
        # fails on it and the session is read alone, reported unreadable.
        (NOT_UTF8, False),
        ("X'00FF'", False),  # a BLOB: not JSON, the session cannot be rebuilt
        ("17", True),  # a number is a JSON value: kept as it is
        ("NULL", True),
    ],
)
def test_an_odd_created_at_fails_its_session_alone(
    tmp_path: Path, created_at: str, imported: bool
) -> None:
    path = _synth_db(
        tmp_path / "synth.db",
        [
            {"session_id": "'ok-1'"},
            {"session_id": "'odd'", "created_at": created_at},
            {"session_id": "'ok-2'"},
        ],
    )
    for batch in (64, 1):
        found = _outcomes(path, batch)
        assert isinstance(found["ok-1"], Imported)
        assert isinstance(found["ok-2"], Imported)
        assert isinstance(found["odd"], Imported) is imported


def test_an_experiment_row_not_utf8_leaves_its_sessions_without_it(tmp_path: Path) -> None:
    # The experiments row is read with every session of its experiment: text in it that
    # is not UTF-8 made all of them unreadable (an import of one experiment: all of it).
    path = _synth_db(
        tmp_path / "synth.db",
        [
            {"session_id": "'bad-exp-1'", "experiment_id": "'exp-bad'"},
            {"session_id": "'ok-1'", "experiment_id": "'exp-ok'"},
            {"session_id": "'bad-exp-2'", "experiment_id": "'exp-bad'"},
        ],
    )
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO experiments (experiment_id, name, description) "
        f"VALUES ('exp-bad', 'b', {NOT_UTF8}), ('exp-ok', 'a', 'fine')"
    )
    conn.commit()
    conn.close()
    for batch in (64, 1):
        found = _outcomes(path, batch)
        good = found["ok-1"]
        assert isinstance(good, Imported)
        assert good.doc["trace"]["experiment"]["description"] == "fine"
        assert good.doc[IMPORT_KEY]["lossless"] is True
        for sid in ("bad-exp-1", "bad-exp-2"):
            built = found[sid]
            assert isinstance(built, Imported), built
            trace = built.doc["trace"]
            assert trace["experiment_id"] == "exp-bad"
            assert "experiment" not in trace
            (lost,) = [
                e for e in built.doc[IMPORT_KEY]["losses"] if e["path"] == "trace.experiment"
            ]
            assert lost["kind"] == "lost"
            assert "column 'description'" in lost["detail"]
            assert built.doc[IMPORT_KEY]["lossless"] is False


def test_an_unreadable_id_is_shown_escaped_as_a_literal(tmp_path: Path) -> None:
    # Its text was shown with only the bad bytes escaped: a quote ended the summary's
    # quoting early, a newline broke its line, and a backslash read as an escape.
    # "a'b" LF 0xFF "\x41": as the literal 'a\'b\n\xff\\x41'.
    path = _synth_db(
        tmp_path / "synth.db",
        [{"session_id": "CAST(X'6127620AFF5C783431' AS TEXT)"}, {"session_id": "'ok-1'"}],
    )
    found = _outcomes(path, 64)
    shown = "a\\'b\\n\\xff\\\\x41"
    assert set(found) == {shown, "ok-1"}
    assert isinstance(found[shown], Unreadable)
    # A Python literal again: it reads back to the id (its bad byte as the character U+00FF).
    assert ast.literal_eval(f"'{shown}'") == "a'b\n\xff\\x41"
    done = _import(path, f"sqlite:///{tmp_path / 'store.db'}")
    assert done.returncode == 2, done.stderr
    assert f"session '{shown}'" in done.stdout, done.stdout
