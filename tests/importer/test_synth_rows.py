"""Rebuilding a session from synth-ai's rows (pure): the values its tracer never writes.

synth-ai's own tracer writes the ordinary cases; tests/compat/test_import_synth_db.py
imports a database it wrote. Here are the rows it cannot be made to write but a
database may hold (older or hand-edited stores, other writers of the same schema): each
is rebuilt, and what could not be kept is in the loss report, never silently changed.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tracestore.ingest.service import prepare
from tracestore.ingest.synth_db import (
    _COLUMNS,
    IMPORT_KEY,
    Imported,
    SessionRows,
    SynthDatabase,
    SynthDatabaseError,
    Unreadable,
    build_rollout,
    iter_rollouts,
    read_run_id_map,
)

TRACESTORE = str(Path(sys.executable).parent / "tracestore")


def _row(table: str, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(_COLUMNS[table])
    unknown = set(values) - set(row)
    assert not unknown, unknown
    row.update(values)
    return row


def _session(**values: Any) -> dict[str, Any]:
    base = {
        "session_id": "s-1",
        "created_at": "2025-11-20T12:00:00+00:00",
        "num_timesteps": 1,
        "num_events": 0,
        "num_messages": 0,
        "metadata": "{}",
    }
    return _row("session_traces", **{**base, **values})


def _step(pk: int = 1, step_id: str = "decision_0") -> dict[str, Any]:
    return _row(
        "session_timesteps",
        id=pk,
        session_id="s-1",
        step_id=step_id,
        step_index=pk - 1,
        started_at="2025-11-20T12:00:01+00:00",
        completed_at="2025-11-20T12:00:02+00:00",
        step_metadata="{}",
    )


def _env_event(pk: int, **values: Any) -> dict[str, Any]:
    base = {
        "id": pk,
        "session_id": "s-1",
        "timestep_id": 1,
        "event_type": "environment",
        "system_instance_id": "env",
        "event_time": 1763640000.0 + pk,
        "reward": 1.0,
        "terminated": 0,
        "truncated": 0,
        "metadata": '{"step_id": "decision_0"}',
    }
    return _row("events", **{**base, **values})


def _losses(doc: dict[str, Any]) -> dict[str, tuple[str, int]]:
    return {e["path"]: (e["kind"], e["count"]) for e in doc[IMPORT_KEY]["losses"]}


def test_flags_become_booleans_and_odd_values_are_reported() -> None:
    rows = SessionRows(
        _session(num_events=3),
        steps=[_step()],
        events=[
            _env_event(1, terminated=0, truncated=None),
            _env_event(2, terminated=1, truncated=1),
            _env_event(3, terminated=2, truncated=0),
        ],
    )
    built = build_rollout(rows, "s-1")
    events = built.doc["trace"]["event_history"]
    assert [(e["terminated"], e["truncated"]) for e in events] == [
        (False, None),
        (True, True),
        (True, False),
    ]
    assert _losses(built.doc)["trace.event_history[*].terminated"] == ("default", 1)
    assert built.doc[IMPORT_KEY]["lossless"] is False


def test_values_json_has_not_become_null_with_a_loss_entry() -> None:
    rows = SessionRows(
        _session(num_events=1, metadata='{"score": NaN, "env_name": "grid"}'),
        steps=[_step()],
        events=[_env_event(1, reward=float("inf"), system_state_before='{"x": Infinity}')],
    )
    built = build_rollout(rows, "s-1")
    trace = built.doc["trace"]
    assert trace["metadata"] == {"score": None, "env_name": "grid"}
    assert trace["event_history"][0]["reward"] is None
    assert trace["event_history"][0]["system_state_before"] == {"x": None}
    losses = _losses(built.doc)
    assert losses["trace.metadata"][0] == "default"
    assert losses["trace.event_history[*].reward"][0] == "default"
    assert losses["trace.event_history[*].system_state_before"][0] == "default"
    # What is built is a document the store accepts: its strict parser refuses NaN tokens.
    assert prepare(built.raw).doc == built.doc


def test_numbers_past_a_double_stay_exact_or_are_reported() -> None:
    # orjson read the JSON columns: 2**64 became 1.8446744073709552e+19 and 1e-400 0.0,
    # and the document still said lossless (found by exploratory QA).
    seed, wide = 2**64, 10**29 + 7
    exact = SessionRows(
        _session(metadata=f'{{"seed": {seed}, "wide": -{wide}, "ratio": 0.1, "n": 3}}'),
        steps=[_step()],
    )
    built = build_rollout(exact, "s-1")
    assert built.doc["trace"]["metadata"] == {"seed": seed, "wide": -wide, "ratio": 0.1, "n": 3}
    assert f'"seed":{seed}'.encode() in built.raw
    assert f'"wide":-{wide}'.encode() in built.raw
    assert built.doc[IMPORT_KEY]["lossless"] is True
    # A fraction no double holds is written rounded, and the loss report says so.
    rounded = SessionRows(
        _session(metadata='{"tiny": 1e-400, "long": 0.10000000000000000000001, "ok": 2.5}'),
        steps=[_step()],
    )
    built = build_rollout(rounded, "s-1")
    assert built.doc["trace"]["metadata"] == {"tiny": 0.0, "long": 0.1, "ok": 2.5}
    assert _losses(built.doc)["trace.metadata"] == ("replaced", 1)
    assert built.doc[IMPORT_KEY]["lossless"] is False
    # Past a double's range, beside an integer past 64 bits: null, as Infinity is (it was
    # inf in the document, and the session failed to rebuild).
    huge = SessionRows(_session(metadata=f'{{"big": 1e400, "seed": {seed}}}'), steps=[_step()])
    built = build_rollout(huge, "s-1")
    assert built.doc["trace"]["metadata"] == {"big": None, "seed": seed}
    assert _losses(built.doc)["trace.metadata"][0] == "default"
    assert prepare(built.raw).doc["trace"]["metadata"]["big"] is None


def test_items_join_their_step_by_timestep_id_else_by_step_id() -> None:
    rows = SessionRows(
        _session(num_timesteps=2, num_events=3, num_messages=2),
        steps=[_step(1, "decision_0"), _step(2, "decision_1")],
        events=[
            _env_event(1, timestep_id=2, metadata='{"step_id": "decision_0"}'),
            _env_event(2, timestep_id=None, metadata='{"step_id": "decision_0"}'),
            _env_event(3, timestep_id=None, metadata='{"step_id": "elsewhere"}'),
        ],
        messages=[
            _row(
                "messages",
                id=1,
                session_id="s-1",
                message_type="user",
                content="hi",
                metadata='{"step_id": "decision_1"}',
            ),
            _row(
                "messages",
                id=2,
                session_id="s-1",
                message_type="user",
                content="[1, 2]",
                metadata='{"json_payload": "other"}',
            ),
        ],
    )
    trace = build_rollout(rows, "s-1").doc["trace"]
    first, second = trace["session_time_steps"]
    assert [e["time_record"]["event_time"] for e in first["events"]] == [1763640002.0]
    assert [e["time_record"]["event_time"] for e in second["events"]] == [1763640001.0]
    assert len(trace["event_history"]) == 3  # the third in no step: in the history only
    assert [m["content"]["text"] for m in second["markov_blanket_messages"]] == ["hi"]
    # Metadata naming another payload is the producer's own: kept; the content is JSON.
    last = trace["markov_blanket_message_history"][1]
    assert last["content"] == {"text": None, "json_payload": "[1, 2]"}
    assert last["metadata"] == {"json_payload": "other"}


def test_rows_the_session_promises_but_the_tables_lack_are_reported_lost() -> None:
    # What synth-ai's grpo-crafter app leaves: its messages were refused by the CHECK.
    rows = SessionRows(
        _session(num_timesteps=1, num_events=1, num_messages=9),
        steps=[_step()],
        events=[_env_event(1)],
    )
    losses = _losses(build_rollout(rows, "s-1").doc)
    kind, _ = losses["trace.markov_blanket_message_history"]
    assert kind == "lost"


def test_unknown_event_kinds_keep_their_type_and_values() -> None:
    rows = SessionRows(
        _session(num_events=1),
        steps=[_step()],
        events=[
            _env_event(
                1,
                event_type="judge",
                reward=0.5,
                terminated=None,
                truncated=None,
                model_name="judge-1",
            )
        ],
    )
    built = build_rollout(rows, "s-1")
    event = built.doc["trace"]["event_history"][0]
    assert event["event_type"] == "judge"
    assert event["reward"] == 0.5
    assert event["model_name"] == "judge-1"
    typed = prepare(built.raw, built.doc).rows.traces[0].events[0]
    assert typed["event_type"] == "judge"


def test_the_correlation_id_comes_from_metadata_before_call_records() -> None:
    lm = _row(
        "events",
        id=2,
        session_id="s-1",
        timestep_id=1,
        event_type="cais",
        system_instance_id="policy",
        model_name="m",
        call_records=orjson.dumps(
            [{"metadata": {"inference_url": "https://h/v1/chat/completions?cid=trace_rec"}}]
        ).decode(),
        metadata="{}",
    )
    from_record = build_rollout(
        SessionRows(_session(num_events=2), steps=[_step()], events=[_env_event(1), lm]), "s-1"
    ).doc
    assert from_record["trace_correlation_id"] == "trace_rec"
    assert from_record["pipeline_metadata"]["inference_url"].endswith("cid=trace_rec")
    assert from_record[IMPORT_KEY]["correlation_id_from"] == "call record metadata: inference_url"
    meta = '{"trace_correlation_id": "trace_meta"}'
    from_meta = build_rollout(
        SessionRows(
            _session(num_events=2, metadata=meta), steps=[_step()], events=[_env_event(1), lm]
        ),
        "s-1",
    ).doc
    assert from_meta["trace_correlation_id"] == "trace_meta"
    none = build_rollout(
        SessionRows(_session(num_events=1), steps=[_step()], events=[_env_event(1)]), "s-1"
    ).doc
    assert "trace_correlation_id" not in none
    assert IMPORT_KEY in none


def test_the_same_rows_give_the_same_bytes() -> None:
    def rows() -> SessionRows:
        return SessionRows(
            _session(num_events=2, metadata='{"env_name": "grid"}'),
            steps=[_step()],
            events=[_env_event(1), _env_event(2, terminated=1)],
            outcome_rewards=[
                _row(
                    "outcome_rewards",
                    id=1,
                    session_id="s-1",
                    total_reward=3,
                    achievements_count=1,
                    total_steps=2,
                    created_at="x",
                )
            ],
        )

    first, second = build_rollout(rows(), "run-9"), build_rollout(rows(), "run-9")
    assert first.raw == second.raw
    doc = first.doc
    assert doc["run_id"] == "run-9"
    assert doc["trace"]["session_id"] == "s-1"
    assert doc["metrics"]["episode_returns"] == [2.0]
    assert doc["metrics"]["outcome_score"] == 3.0


def test_a_bad_map_file_is_named_and_a_spreadsheets_csv_is_read(tmp_path: Path) -> None:
    # A malformed --map said "internal error: JSONDecodeError" without the file, and a
    # spreadsheet's "CSV UTF-8" (a byte-order mark first) was refused (exploratory QA).
    bom = tmp_path / "map.csv"
    bom.write_bytes(b"\xef\xbb\xbfsession_id,run_id\ns-1,run-a\n")
    assert read_run_id_map(bom) == {"s-1": "run-a"}
    cases = {
        "bad.json": (b'{"s-1": "run-a",', "bad.json: not valid JSON"),
        "latin.json": (b'{"s-1": "caf\xe9"}', "latin.json: not UTF-8 text"),
        # A blank line before the bad row: its line in the file is 4.
        "holes.csv": (b"session_id,run_id\ns-1,run-a\n\ns-2,\n", "holes.csv:4: a row without"),
        "empty.json": (b'{"s-1": ""}', "non-empty strings"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(SynthDatabaseError, match=message):
            read_run_id_map(path)


def _synth_db(path: Path, sessions: dict[str | None, str]) -> Path:
    """A database of synth-ai's tables (as the importer reads them): a session per key
    (None: a NULL session_id), each with one message whose content is the SQL given."""
    conn = sqlite3.connect(path)
    for table, columns in _COLUMNS.items():
        conn.execute(f'CREATE TABLE "{table}" ({", ".join(columns)})')
    for sid, content in sessions.items():
        conn.execute(
            "INSERT INTO session_traces (session_id, created_at, num_timesteps, num_events, "
            "num_messages, metadata) VALUES (?, '2025-11-20T12:00:00+00:00', 0, 0, 1, '{}')",
            (sid,),
        )
        conn.execute(
            "INSERT INTO messages (id, session_id, message_type, content) "
            f"VALUES (NULL, ?, 'user', {content})",
            (sid,),
        )
    conn.commit()
    conn.close()
    return path


def test_a_session_the_driver_cannot_read_is_reported_and_the_others_imported(
    tmp_path: Path,
) -> None:
    # One message not UTF-8 failed the batch's read: the whole import stopped, the good
    # sessions of that batch unstored, and running it again failed the same way (QA).
    # Text that is not UTF-8 in a TEXT column: what the driver cannot give as str.
    path = _synth_db(
        tmp_path / "synth.db",
        {"ok-1": "'hi'", "bad-1": "CAST(X'68ff69' AS TEXT)", "ok-2": "'hi'"},
    )
    with SynthDatabase(path) as db:
        for batch in (64, 1):
            out = list(iter_rollouts(db, db.session_ids(), batch=batch))
            kinds = {o.session_id: o for o in out}
            assert set(kinds) == {"ok-1", "bad-1", "ok-2"}
            bad = kinds["bad-1"]
            assert isinstance(bad, Unreadable)
            assert "Could not decode to UTF-8" in bad.message
            assert all(isinstance(kinds[s], Imported) for s in ("ok-1", "ok-2"))


def test_blob_content_is_its_text_not_pythons_repr() -> None:
    # A BLOB in `messages.content` came out as the text "b'hello bytes'" (QA).
    def message(pk: int, content: bytes) -> dict[str, Any]:
        return _row("messages", id=pk, session_id="s-1", message_type="user", content=content)

    rows = SessionRows(
        _session(num_messages=2),
        steps=[_step()],
        messages=[message(1, b"hello bytes"), message(2, b"h\xffi")],
    )
    built = build_rollout(rows, "s-1")
    texts = [m["content"]["text"] for m in built.doc["trace"]["markov_blanket_message_history"]]
    assert texts == ["hello bytes", "h\ufffdi"]
    path = "trace.markov_blanket_message_history[*].content"
    assert _losses(built.doc)[path] == ("replaced", 1)  # only the bytes that were not text
    assert built.doc[IMPORT_KEY]["lossless"] is False


def test_a_session_without_an_id_is_counted_invalid(tmp_path: Path) -> None:
    # SQLite lets the TEXT primary key hold NULL: such a row was left out without a word
    # ("1 sessions" for two rows, exit 0; QA).
    path = _synth_db(tmp_path / "synth.db", {"ok-1": "'hi'", None: "'lost'"})
    done = subprocess.run(
        [TRACESTORE, "import", "synth-db", str(path), "--db", f"sqlite:///{tmp_path / 's.db'}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "1 created" in done.stdout
    assert "1 invalid" in done.stdout
    assert "a session_traces row without a session_id" in done.stdout


def test_a_repeated_key_in_a_json_column_is_reported() -> None:
    # {"a": 1, "a": 2} became {"a": 2} and the document said lossless (QA); a document
    # posted with a repeated key is refused.
    rows = SessionRows(_session(metadata='{"a": 1, "a": 2, "b": {"c": 1}}'), steps=[_step()])
    built = build_rollout(rows, "s-1")
    assert built.doc["trace"]["metadata"] == {"a": 2, "b": {"c": 1}}
    assert _losses(built.doc)["trace.metadata"] == ("lost", 1)
    assert built.doc[IMPORT_KEY]["lossless"] is False
    clean = build_rollout(SessionRows(_session(metadata='{"a": 1}'), steps=[_step()]), "s-1")
    assert clean.doc[IMPORT_KEY]["lossless"] is True
