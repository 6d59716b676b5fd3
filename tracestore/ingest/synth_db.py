"""synth-ai's own trace database (tracing_v3) read with plain SQL, each session a rollout.

synth-ai 0.2.23 stores every traced session in a SQLite/libsql file
(tracing_v3/turso/native_manager.py): `session_traces`, `session_timesteps`, one `events`
table for every kind (`event_type` cais / environment / runtime), `messages`,
`event_rewards` and `outcome_rewards`. This module reads such a file with Python's sqlite3,
read-only, and rebuilds each session as the v3 trace its SessionTracer held in memory (the
full shape, `SessionTrace.to_dict()`): time steps with their events and messages, each
event with the fields of its kind, 0/1 flags as booleans, message content back in `text`
or `json_payload`. Each becomes a trace-only RolloutResponse (`trajectories: []`) whose
metrics come from the rewards; the ingest path stores it like any posted rollout.

What synth-ai's store could not keep is said in the document's loss report
(`tracestore_import.losses`, the converters' vocabulary): cost in whole cents, which
content slot a message used when the tracer wrote it as it went, session counts that
promise rows the tables do not hold. The document is a pure function of the database's
rows, so importing again gives the same bytes: a duplicate, never a second copy.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from tracestore.convert.report import LossEntry, LossKind
from tracestore.correlation import cid_from_url, clean_cid
from tracestore.errors import InvalidRequest
from tracestore.jsontext import may_hold_inexact_numbers, repeats_keys

IMPORTER = "tracestore.ingest.synth_db"
# Bump when the document built from the same rows changes: it is recorded in each one.
IMPORTER_VERSION = "1"
# The envelope key that holds where a rollout came from and what the import could not keep.
IMPORT_KEY = "tracestore_import"
SOURCE = "synth-ai tracing_v3 trace database"
SQLITE_MAGIC = b"SQLite format 3\x00"
# synth-ai's URL forms for a local file (SYNTH_TRACES_DB, TURSO_LOCAL_DB_URL, ...).
_FILE_PREFIXES = ("sqlite+aiosqlite:///", "sqlite+libsql:///", "sqlite:///", "file://", "file:")
_REMOTE_PREFIXES = ("libsql://", "http://", "https://", "ws://", "wss://")
# A session's rows are read this many sessions at a time, in one read transaction.
DEFAULT_BATCH = 64
# sqlite3's words for a TEXT value that is not UTF-8 (it cannot give it as str).
_UNDECODABLE = "Could not decode to UTF-8"

# Columns read from each table; a column an older or newer schema lacks reads as NULL.
_COLUMNS: dict[str, tuple[str, ...]] = {
    "session_traces": (
        "session_id",
        "created_at",
        "num_timesteps",
        "num_events",
        "num_messages",
        "metadata",
        "experiment_id",
        "embedding",
    ),
    "session_timesteps": (
        "id",
        "session_id",
        "step_id",
        "step_index",
        "turn_number",
        "started_at",
        "completed_at",
        "step_metadata",
    ),
    "events": (
        "id",
        "session_id",
        "timestep_id",
        "event_type",
        "system_instance_id",
        "event_time",
        "message_time",
        "created_at",
        "model_name",
        "provider",
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "cost_usd",
        "latency_ms",
        "span_id",
        "trace_id",
        "call_records",
        "reward",
        "terminated",
        "truncated",
        "system_state_before",
        "system_state_after",
        "metadata",
        "event_metadata",
        "embedding",
    ),
    "messages": (
        "id",
        "session_id",
        "timestep_id",
        "message_type",
        "content",
        "timestamp",
        "event_time",
        "message_time",
        "metadata",
        "embedding",
    ),
    "event_rewards": (
        "id",
        "event_id",
        "session_id",
        "message_id",
        "turn_number",
        "reward_value",
        "reward_type",
        "key",
        "annotation",
        "source",
        "created_at",
    ),
    "outcome_rewards": (
        "id",
        "session_id",
        "total_reward",
        "achievements_count",
        "total_steps",
        "created_at",
        "reward_metadata",
    ),
    "experiments": (
        "experiment_id",
        "name",
        "description",
        "created_at",
        "configuration",
        "metadata",
    ),
}
# Within a session, rows in the order synth-ai wrote them (the tracer's own order).
_ORDER = {
    "session_timesteps": "step_index, id",
    "events": "id",
    "messages": "id",
    "event_rewards": "id",
    "outcome_rewards": "id",
}


class SynthDatabaseError(InvalidRequest):
    """A file that is not a readable synth-ai trace database (the message says why)."""

    code = "invalid_synth_database"


def database_path(location: str) -> Path:
    """The file a synth-ai database location names: a path, or synth-ai's URL for a file."""
    if location.startswith(_REMOTE_PREFIXES):
        raise SynthDatabaseError(
            f"{location}: a remote libsql database; tracestore reads synth-ai's database with "
            "Python's sqlite3, which opens files only: copy it to a file first (for Turso, "
            "`turso db shell NAME .dump | sqlite3 synth.db`) and import that file"
        )
    for prefix in _FILE_PREFIXES:
        if location.startswith(prefix):
            return Path(location.removeprefix(prefix).split("?", 1)[0])
    return Path(location)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}


class UnreadableId(str):
    """A session_id no session can be read by (text not UTF-8, or a BLOB): its text shows
    it, `problem` says why; `iter_rollouts` reports the session in its place."""

    problem: str

    def __new__(cls, shown: str, problem: str) -> UnreadableId:
        """The id as shown, and why the session cannot be read."""
        self = super().__new__(cls, shown)
        self.problem = problem
        return self


def _escaped(value: bytes) -> str:
    """`value` as the inside of a quoted Python literal: its text as UTF-8, each byte that
    is not as `\\xNN`, a quote, backslash or control character escaped as repr does."""
    shown = []
    for char in value.decode("utf-8", "surrogateescape"):
        if "\udc80" <= char <= "\udcff":  # a byte that is not UTF-8
            shown.append(f"\\x{ord(char) - 0xDC00:02x}")
        elif char in "'\\":
            shown.append("\\" + char)
        elif char.isprintable():
            shown.append(char)
        else:
            shown.append(repr(char)[1:-1])
    return "".join(shown)


def _session_id(value: object, kind: bytes) -> Any:
    """One session_id of the session list, read as bytes: text that is UTF-8 as its str,
    a number as itself (its children are keyed by the same number)."""
    if not isinstance(value, bytes):
        return value
    shown = _escaped(value)
    # The SQL literal finds the row in the sqlite3 shell, whatever its bytes.
    literal = f"X'{value.hex().upper()}'"
    if kind == b"blob":
        # Its rows could be read, but a rollout's ids are text: it failed to rebuild with
        # "Object of type bytes is not JSON serializable".
        return UnreadableId(
            shown,
            f"a session_traces row whose session_id is a BLOB ({literal}), not text: not read",
        )
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return UnreadableId(
            shown,
            "a session_traces row whose session_id is not UTF-8 text "
            f"(CAST({literal} AS TEXT)): not read",
        )


class SynthDatabase:
    """A synth-ai trace database opened read-only; sessions are read in batches."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with path.open("rb") as f:
                head = f.read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise SynthDatabaseError(f"{path}: {exc.strerror or exc}") from None
        if head != SQLITE_MAGIC:
            raise SynthDatabaseError(f"{path}: not a SQLite database (no SQLite header)")
        # mode=ro: never written, not even a journal; the producer may still be writing it.
        # isolation_level=None: the read transactions below are explicit (one per batch).
        uri = f"file:{quote(str(path.resolve()))}?mode=ro"
        self.conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30)
        try:
            self.columns = {t: _columns(self.conn, t) for t in _COLUMNS}
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise SynthDatabaseError(f"{path}: cannot read it: {exc}") from None
        if not {"session_id", "created_at"} <= self.columns["session_traces"]:
            self.conn.close()
            raise SynthDatabaseError(
                f"{path}: not a synth-ai trace database (no session_traces table; synth-ai's "
                "tracing_v3 writes one)"
            )

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> SynthDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def session_ids(self) -> list[str]:
        """Every session id, oldest first (ties by id): the import's order; an id that
        cannot name a session is an `UnreadableId`, reported in its place."""
        # The ids as bytes: one that is not UTF-8 made the driver's decoding fail, and with
        # it the whole list, before any session was imported.
        text_factory = self.conn.text_factory
        self.conn.text_factory = bytes
        try:
            rows = self.conn.execute(
                "SELECT session_id, typeof(session_id) FROM session_traces "
                "WHERE session_id IS NOT NULL ORDER BY created_at, session_id"
            ).fetchall()
        except sqlite3.Error as exc:
            raise SynthDatabaseError(f"{self.path}: cannot read it: {exc}") from None
        finally:
            self.conn.text_factory = text_factory
        return [_session_id(value, kind) for value, kind in rows]

    def sessions_without_id(self) -> int:
        """Rows of session_traces whose session_id is NULL (SQLite lets a TEXT primary key
        hold NULL): nothing of theirs can be joined, so they cannot be imported."""
        try:
            found = self.conn.execute(
                "SELECT count(*) FROM session_traces WHERE session_id IS NULL"
            ).fetchone()
        except sqlite3.Error as exc:
            raise SynthDatabaseError(f"{self.path}: cannot read it: {exc}") from None
        return int(found[0])

    def _select(self, table: str, where: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        present = self.columns[table]
        if not present:
            return []  # an older schema without the table: nothing of this kind
        names = _COLUMNS[table]
        cols = ", ".join(f'"{c}"' if c in present else f'NULL AS "{c}"' for c in names)
        order = _ORDER.get(table)
        sql = f'SELECT {cols} FROM "{table}" WHERE {where}' + (
            f" ORDER BY {order}" if order else ""
        )
        return [dict(zip(names, row, strict=True)) for row in self.conn.execute(sql, params)]

    def read(self, session_ids: Sequence[str]) -> list[SessionRows]:
        """The rows of these sessions, read in one transaction (a consistent snapshot)."""
        try:
            return self._read(session_ids)
        except sqlite3.Error as exc:
            # A hot journal left by a producer that crashed mid-write, a damaged page, a
            # lock held past the wait: named with the file, the import stops there.
            raise SynthDatabaseError(f"{self.path}: cannot read it: {exc}") from None

    def _experiments(self, ids: Sequence[Any]) -> tuple[list[dict[str, Any]], dict[Any, str]]:
        """These experiments' rows, and why each one the driver cannot read is left out."""
        if not ids:
            return [], {}
        try:
            return self._select(
                "experiments", f"experiment_id IN ({', '.join('?' * len(ids))})", ids
            ), {}
        except sqlite3.Error as exc:
            if _UNDECODABLE not in str(exc):
                raise
        # Shared by sessions: one experiment's text that is not UTF-8 made every session of
        # the experiment unreadable (of all of them, for an import of one experiment). Each
        # alone: the readable ones kept, the others left out of their sessions' documents.
        rows: list[dict[str, Any]] = []
        problems: dict[Any, str] = {}
        for one in ids:
            try:
                rows += self._select("experiments", "experiment_id = ?", [one])
            except sqlite3.Error as exc:
                if _UNDECODABLE not in str(exc):
                    raise
                problems[one] = str(exc)
        return rows, problems

    def _read(self, session_ids: Sequence[str]) -> list[SessionRows]:
        marks = ", ".join("?" * len(session_ids))
        where = f"session_id IN ({marks})"
        # One read transaction per batch: a consistent view of the batch's sessions, and
        # the shared lock (synth-ai's store uses a rollback journal) held for milliseconds.
        self.conn.execute("BEGIN")
        try:
            sessions = self._select("session_traces", where, session_ids)
            children = {t: self._select(t, where, session_ids) for t in _FIELD}
            # In first-seen order, not sorted: ids of mixed types (an integer beside text)
            # do not compare, and failed the whole import.
            experiment_ids = list(
                dict.fromkeys(
                    s["experiment_id"] for s in sessions if s["experiment_id"] is not None
                )
            )
            experiments, unreadable = self._experiments(experiment_ids)
        finally:
            self.conn.execute("COMMIT")
        by_session: dict[str, SessionRows] = {s["session_id"]: SessionRows(s) for s in sessions}
        for table, rows in children.items():
            for row in rows:
                found = by_session.get(row["session_id"])
                if found is not None:
                    getattr(found, _FIELD[table]).append(row)
        by_experiment = {e["experiment_id"]: e for e in experiments}
        for rows_of in by_session.values():
            rows_of.experiment = by_experiment.get(rows_of.session["experiment_id"])
            rows_of.experiment_problem = unreadable.get(rows_of.session["experiment_id"])
        # In the order asked for; a session deleted meanwhile is simply not there.
        return [by_session[sid] for sid in session_ids if sid in by_session]


@dataclass(slots=True)
class SessionRows:
    """One session's rows, as the database holds them."""

    session: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    event_rewards: list[dict[str, Any]] = field(default_factory=list)
    outcome_rewards: list[dict[str, Any]] = field(default_factory=list)
    experiment: dict[str, Any] | None = None
    # Why the session's experiments row is not there, when the driver could not read it.
    experiment_problem: str | None = None


_FIELD = {
    "session_timesteps": "steps",
    "events": "events",
    "messages": "messages",
    "event_rewards": "event_rewards",
    "outcome_rewards": "outcome_rewards",
}


class _Losses:
    """Loss entries of one session, grouped by (path, kind, detail) with a count."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, LossKind, str], int] = {}

    def add(self, path: str, kind: LossKind, detail: str) -> None:
        key = (path, kind, detail)
        self.counts[key] = self.counts.get(key, 0) + 1

    def entries(self) -> list[LossEntry]:
        return [LossEntry(p, k, d, count=n) for (p, k, d), n in self.counts.items()]


def _json(value: object, where: str, losses: _Losses) -> Any:
    """A JSON text column's value, parsed (synth-ai writes them with Python's json)."""
    if not isinstance(value, str | bytes):
        return value  # NULL, or a number a TEXT column holds as one
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    # orjson reads an integer past 64 bits as a float and 1e-400 as 0.0: such text goes to
    # the standard library, which keeps integers whole (the document is then written by
    # it too: _dumps), and a number no double holds is reported, not changed silently.
    exact = may_hold_inexact_numbers(raw)
    if not exact:
        try:
            return _unique_keys(orjson.loads(value), raw, where, losses)
        except orjson.JSONDecodeError:
            pass
    constants: list[str] = []
    rounded: list[str] = []

    def constant(name: str) -> None:
        constants.append(name)

    def number(text: str) -> float | None:
        found = float(text)
        if not math.isfinite(found):
            constants.append(text)  # past a double's range (1e400): as Infinity, null
            return None
        # Written back as its shortest repr: is that still the number synth-ai wrote?
        if Decimal(repr(found)) != Decimal(text):
            rounded.append(text)
        return found

    try:
        # Python's json writes NaN and Infinity, which JSON (and tracestore) has not.
        parsed = json.loads(value, parse_constant=constant, parse_float=number)
    except ValueError:
        losses.add(where, "default", "not JSON in synth-ai's store: kept as its text")
        return value if isinstance(value, str) else value.decode("utf-8", "replace")
    if constants:
        losses.add(
            where, "default", "NaN, Infinity or a number past a double's range written as null"
        )
    if rounded:
        losses.add(
            where, "replaced", "a number past a double's precision or range, written rounded"
        )
    return _unique_keys(parsed, raw, where, losses)


def _unique_keys(parsed: Any, raw: bytes, where: str, losses: _Losses) -> Any:
    """`parsed`, with a loss entry when its text repeats a key in an object: both parsers
    keep the last value, and tracestore refuses such a document when it is posted."""
    if repeats_keys(raw, parsed):
        losses.add(where, "lost", "a key repeated in an object: the last value kept")
    return parsed


def _finite(value: object, where: str, losses: _Losses) -> Any:
    """A REAL column's value; a non-finite float (SQLite keeps Infinity) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        losses.add(where, "default", "Infinity (not JSON) written as null")
        return None
    return value


def _flag(value: object, where: str, losses: _Losses) -> bool | None:
    """A BOOLEAN column: SQLite gives back 0/1; the trace says false/true."""
    if value is None or isinstance(value, bool):
        return value
    if value in (0, 1) and isinstance(value, int):
        return value == 1
    losses.add(where, "default", "neither 0 nor 1 in a boolean column: read as its truth")
    return bool(value)


def _is_json_container(text: str) -> bool:
    start = text.lstrip()[:1]
    if start not in ("{", "["):
        return False
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def _content(text: object, meta: object, losses: _Losses) -> dict[str, Any]:
    """A message's content as SessionMessageContent, from the one `content` column."""
    if isinstance(text, bytes):
        # A BLOB in the column (another writer of the schema): its text when it is UTF-8;
        # str() gave Python's repr, "b'...'", as if it were the content.
        blob = text
        try:
            text = blob.decode("utf-8")
        except UnicodeDecodeError:
            text = blob.decode("utf-8", "replace")
            losses.add(
                "trace.markov_blanket_message_history[*].content",
                "replaced",
                "bytes that are not UTF-8 text: undecodable bytes written as U+FFFD",
            )
    elif not isinstance(text, str):
        text = "" if text is None else str(text)
    if isinstance(meta, dict):
        # synth-ai's store (insert_session_trace, insert_message_row) writes the payload or
        # the text beside the content in the metadata: it says which slot, and is not the
        # producer's own metadata.
        if meta.get("json_payload") == text:
            del meta["json_payload"]
            return {"text": None, "json_payload": text}
        if meta.get("text") == text:
            del meta["text"]
            return {"text": text, "json_payload": None}
    if _is_json_container(text):
        # The tracer writing as it goes (SessionTracer.record_message) stores the text or
        # the JSON payload alone; it writes non-text content as JSON, so a JSON object or
        # array is read as the payload.
        losses.add(
            "trace.markov_blanket_message_history[*].content",
            "default",
            "synth-ai's store keeps text and JSON payload in one column: JSON objects and "
            "arrays are read as json_payload, other content as text",
        )
        return {"text": None, "json_payload": text}
    return {"text": text, "json_payload": None}


def _event(row: Mapping[str, Any], losses: _Losses) -> dict[str, Any]:
    """One event with the fields of its kind, as the tracer's dataclass writes them."""
    path = "trace.event_history[*]"
    meta = _json(row["metadata"], f"{path}.metadata", losses)
    event: dict[str, Any] = {
        "system_instance_id": row["system_instance_id"],
        "time_record": {
            "event_time": _finite(row["event_time"], f"{path}.time_record.event_time", losses),
            "message_time": row["message_time"],
        },
        "metadata": {} if meta is None else meta,
        "event_metadata": _json(row["event_metadata"], f"{path}.event_metadata", losses),
    }
    kind = row["event_type"]
    states = {
        "system_state_before": _json(
            row["system_state_before"], f"{path}.system_state_before", losses
        ),
        "system_state_after": _json(
            row["system_state_after"], f"{path}.system_state_after", losses
        ),
    }
    if kind == "cais":  # LMCAISEvent
        cents = row["cost_usd"]
        if cents is not None:
            losses.add(
                f"{path}.cost_usd",
                "default",
                "synth-ai's store keeps cost_usd as whole cents (int(usd * 100)): read back "
                "as cents / 100, fractions of a cent are lost",
            )
        calls = _json(row["call_records"], f"{path}.call_records", losses)
        event.update(
            model_name=row["model_name"],
            provider=row["provider"],
            input_tokens=row["input_tokens"],
            output_tokens=row["output_tokens"],
            total_tokens=row["total_tokens"],
            cost_usd=None if cents is None else _finite(cents / 100, f"{path}.cost_usd", losses),
            latency_ms=_finite(row["latency_ms"], f"{path}.latency_ms", losses),
            span_id=row["span_id"],
            trace_id=row["trace_id"],
            **states,
            call_records=[] if calls is None else calls,
        )
    elif kind == "environment":  # EnvironmentEvent
        event.update(
            reward=_finite(row["reward"], f"{path}.reward", losses),
            terminated=_flag(row["terminated"], f"{path}.terminated", losses),
            truncated=_flag(row["truncated"], f"{path}.truncated", losses),
            **states,
        )
    elif kind == "runtime":  # RuntimeEvent: the store keeps its actions in the metadata
        actions = meta.pop("actions", []) if isinstance(meta, dict) else []
        event["actions"] = actions
    else:
        # A kind this version of synth-ai does not write: its type and every stored value.
        event["event_type"] = kind
        for name in ("model_name", "provider", "input_tokens", "output_tokens", "total_tokens"):
            if row[name] is not None:
                event[name] = row[name]
        for name in ("reward", "terminated", "truncated"):
            if row[name] is not None:
                event[name] = row[name]
        event.update({k: v for k, v in states.items() if v is not None})
    if row["created_at"] is not None:
        event["created_at"] = row["created_at"]
    if row["embedding"] is not None:
        losses.add(f"{path}.embedding", "lost", "embedding vectors are not imported")
    return event


def _message(row: Mapping[str, Any], losses: _Losses) -> dict[str, Any]:
    """One message as SessionEventMarkovBlanketMessage writes it."""
    path = "trace.markov_blanket_message_history[*]"
    meta = _json(row["metadata"], f"{path}.metadata", losses)
    if meta is None:
        meta = {}
    message: dict[str, Any] = {
        "content": _content(row["content"], meta, losses),
        "message_type": row["message_type"],
        "time_record": {
            "event_time": _finite(row["event_time"], f"{path}.time_record.event_time", losses),
            "message_time": row["message_time"],
        },
        "metadata": meta,
    }
    if row["timestamp"] is not None:
        message["timestamp"] = row["timestamp"]
    if row["embedding"] is not None:
        losses.add(f"{path}.embedding", "lost", "embedding vectors are not imported")
    return message


def _step_of(
    row: Mapping[str, Any],
    item: Mapping[str, Any],
    by_pk: Mapping[object, dict[str, Any]],
    by_step_id: Mapping[object, dict[str, Any]],
) -> dict[str, Any] | None:
    """The time step an event or message belongs to: its timestep_id, else metadata.step_id."""
    step = by_pk.get(row["timestep_id"])
    if step is not None:
        return step
    meta = item.get("metadata")
    step_id = meta.get("step_id") if isinstance(meta, Mapping) else None
    return by_step_id.get(step_id) if isinstance(step_id, str) else None


def _count_check(session: Mapping[str, Any], name: str, held: int, losses: _Losses) -> None:
    promised = session[f"num_{name}"]
    if isinstance(promised, int) and promised > held:
        where = {
            "timesteps": "trace.session_time_steps",
            "events": "trace.event_history",
            "messages": "trace.markov_blanket_message_history",
        }[name]
        losses.add(
            where,
            "lost",
            f"synth-ai's session row counts {promised} {name}, its {name} table holds {held}: "
            "the others were never stored (synth-ai's store refuses, and its tracer skips, "
            "a row it cannot write, e.g. a message_type outside its CHECK list)",
        )


def _cid(meta: object, events: Sequence[Mapping[str, Any]]) -> tuple[str, str | None, str] | None:
    """(cid, inference URL, where) where the producer put one: session metadata, then the
    LM calls' records (their metadata's `trace_correlation_id`, or the inference URL's)."""
    if isinstance(meta, Mapping):
        url = meta.get("inference_url") if isinstance(meta.get("inference_url"), str) else None
        cid = clean_cid(meta.get("trace_correlation_id"))
        if cid is not None:
            return cid, url, "session metadata: trace_correlation_id"
        cid = cid_from_url(url)
        if cid is not None:
            return cid, url, "session metadata: inference_url"
    for event in events:
        records = event.get("call_records")
        for record in records if isinstance(records, list) else []:
            rec_meta = record.get("metadata") if isinstance(record, Mapping) else None
            if not isinstance(rec_meta, Mapping):
                continue
            url = rec_meta.get("inference_url")
            url = url if isinstance(url, str) else None
            cid = clean_cid(rec_meta.get("trace_correlation_id"))
            if cid is not None:
                return cid, url, "call record metadata: trace_correlation_id"
            cid = cid_from_url(url)
            if cid is not None:
                return cid, url, "call record metadata: inference_url"
    return None


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _metrics(
    events: Sequence[Mapping[str, Any]],
    event_kinds: Sequence[object],
    event_rewards: Sequence[Mapping[str, Any]],
    outcome_rewards: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """RolloutMetrics from the rewards: the return is the environment events' rewards."""
    env = [e for e, kind in zip(events, event_kinds, strict=True) if kind == "environment"]
    total = sum(_number(e.get("reward")) or 0.0 for e in env)
    outcomes = [_number(o.get("total_reward")) for o in outcome_rewards]
    totals: dict[str, float] = {}
    for reward in event_rewards:
        name = reward.get("reward_type")
        key = name if isinstance(name, str) else "unspecified"
        totals[key] = totals.get(key, 0.0) + (_number(reward.get("reward_value")) or 0.0)
    details: dict[str, Any] = {"source": SOURCE}
    if totals:
        details["event_reward_totals"] = totals
    return {
        "episode_returns": [total],
        "mean_return": total,
        "num_steps": len(env),
        "num_episodes": 1,
        "outcome_score": (
            sum(o for o in outcomes if o is not None)
            if any(o is not None for o in outcomes)
            else None
        ),
        "events_score": None,
        "details": details,
    }


@dataclass(frozen=True, slots=True)
class Imported:
    """One session rebuilt as a rollout: the document, its bytes and what it holds."""

    session_id: str
    run_id: str
    doc: dict[str, Any]
    raw: bytes
    n_events: int
    n_messages: int
    losses: tuple[LossEntry, ...]


def build_rollout(rows: SessionRows, run_id: str) -> Imported:
    """The trace-only RolloutResponse of one session (pure: the same rows, the same bytes)."""
    losses = _Losses()
    session = rows.session
    steps: list[dict[str, Any]] = []
    by_pk: dict[object, dict[str, Any]] = {}
    by_step_id: dict[object, dict[str, Any]] = {}
    for r in rows.steps:
        step_meta = _json(r["step_metadata"], "trace.session_time_steps[*].step_metadata", losses)
        step = {
            "step_id": r["step_id"],
            "step_index": r["step_index"],
            "timestamp": r["started_at"],
            "turn_number": r["turn_number"],
            "events": [],
            "markov_blanket_messages": [],
            "step_metadata": {} if step_meta is None else step_meta,
            "completed_at": r["completed_at"],
        }
        if r["completed_at"] is None:
            losses.add(
                "trace.session_time_steps[*].completed_at",
                "missing",
                "not in synth-ai's store: its tracer, writing as it goes, stores a time "
                "step before it completes and never updates it",
            )
        steps.append(step)
        by_pk[r["id"]] = step
        by_step_id.setdefault(r["step_id"], step)
    events: list[dict[str, Any]] = []
    event_index: dict[object, int] = {}
    for r in rows.events:
        event = _event(r, losses)
        event_index[r["id"]] = len(events)
        events.append(event)
        # The same object in its time step and in the history: the trace lists it twice.
        home = _step_of(r, event, by_pk, by_step_id)
        if home is not None:
            home["events"].append(event)
    messages: list[dict[str, Any]] = []
    message_index: dict[object, int] = {}
    for r in rows.messages:
        message = _message(r, losses)
        message_index[r["id"]] = len(messages)
        messages.append(message)
        home = _step_of(r, message, by_pk, by_step_id)
        if home is not None:
            home["markov_blanket_messages"].append(message)
    for name, held in (("timesteps", steps), ("events", events), ("messages", messages)):
        _count_check(session, name, len(held), losses)
    if session["embedding"] is not None:
        losses.add("trace.embedding", "lost", "embedding vectors are not imported")
    meta = _json(session["metadata"], "trace.metadata", losses)
    trace: dict[str, Any] = {
        "session_id": session["session_id"],
        "created_at": session["created_at"],
        "session_time_steps": steps,
        "event_history": events,
        "markov_blanket_message_history": messages,
        "metadata": {} if meta is None else meta,
        "session_metadata": None,
    }
    # Rewards synth-ai keeps beside the trace, under the names its own read-back gives them
    # (trace_utils.load_session_trace), each pointing at its event by place in the history.
    if rows.event_rewards:
        trace["event_rewards"] = [
            {
                "event_id": r["event_id"],
                "event_history_index": event_index.get(r["event_id"]),
                "message_id": r["message_id"],
                "message_history_index": message_index.get(r["message_id"]),
                "turn_number": r["turn_number"],
                "reward_value": _finite(r["reward_value"], "trace.event_rewards[*]", losses),
                "reward_type": r["reward_type"],
                "key": r["key"],
                "annotation": _json(r["annotation"], "trace.event_rewards[*].annotation", losses),
                "source": r["source"],
                "created_at": r["created_at"],
            }
            for r in rows.event_rewards
        ]
    if rows.outcome_rewards:
        trace["outcome_rewards"] = [
            {
                "total_reward": _finite(r["total_reward"], "trace.outcome_rewards[*]", losses),
                "achievements_count": r["achievements_count"],
                "total_steps": r["total_steps"],
                "reward_metadata": _json(
                    r["reward_metadata"], "trace.outcome_rewards[*].reward_metadata", losses
                ),
                "created_at": r["created_at"],
            }
            for r in rows.outcome_rewards
        ]
    if session["experiment_id"] is not None:
        trace["experiment_id"] = session["experiment_id"]
        if rows.experiment is not None:
            trace["experiment"] = {
                k: _json(v, f"trace.experiment.{k}", losses)
                if k in ("configuration", "metadata")
                else v
                for k, v in rows.experiment.items()
            }
        elif rows.experiment_problem is not None:
            losses.add(
                "trace.experiment",
                "lost",
                f"its experiments row cannot be read: {rows.experiment_problem}",
            )
    doc: dict[str, Any] = {
        "run_id": run_id,
        "trajectories": [],
        "metrics": _metrics(
            events,
            [r["event_type"] for r in rows.events],
            trace.get("event_rewards", []),
            trace.get("outcome_rewards", []),
        ),
        "trace": trace,
    }
    found = _cid(trace["metadata"], events)
    provenance: dict[str, Any] = {
        "source": SOURCE,
        "importer": IMPORTER,
        "importer_version": IMPORTER_VERSION,
        "session_id": session["session_id"],
    }
    if found is not None:
        cid, url, where = found
        doc["trace_correlation_id"] = cid
        doc["pipeline_metadata"] = {"trace_correlation_id": cid}
        if url is not None:
            doc["pipeline_metadata"]["inference_url"] = url
        provenance["correlation_id_from"] = where
    entries = tuple(losses.entries())
    provenance["lossless"] = all(e.kind in ("stand_in", "carried", "missing") for e in entries)
    provenance["losses"] = [e.as_dict() for e in entries]
    doc[IMPORT_KEY] = provenance
    return Imported(
        # Text as run_id is: a column without TEXT affinity may hold the id as a number.
        session_id=str(session["session_id"]),
        run_id=run_id,
        doc=doc,
        raw=_dumps(doc),
        n_events=len(events),
        n_messages=len(messages),
        losses=entries,
    )


def _dumps(doc: Mapping[str, Any]) -> bytes:
    try:
        return orjson.dumps(doc)
    except TypeError:
        # orjson refuses integers beyond 64 bits; the stdlib writes them (ingest then says
        # whether the document fits the store).
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def read_run_id_map(path: Path) -> dict[str, str]:
    """session_id -> run_id from a JSON object file, or a CSV with those two columns."""
    import csv

    try:
        # utf-8-sig: a spreadsheet's "CSV UTF-8" starts with a byte-order mark.
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SynthDatabaseError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    if path.suffix.lower() == ".json":
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise SynthDatabaseError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(value, dict) or not all(v and isinstance(v, str) for v in value.values()):
            raise SynthDatabaseError(
                f"{path}: expected a JSON object of session_id -> run_id (non-empty strings)"
            )
        if "" in value:
            raise SynthDatabaseError(f"{path}: an empty session_id")
        return {str(k): v for k, v in value.items()}
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is not None and not {"session_id", "run_id"} <= set(reader.fieldnames):
        raise SynthDatabaseError(f"{path}: expected CSV columns session_id,run_id")
    found: dict[str, str] = {}
    for row in reader:
        if not row["session_id"] or not row["run_id"]:
            # line_num: the reader's own count of lines (blank ones included).
            where = f"{path}:{reader.line_num}"
            raise SynthDatabaseError(f"{where}: a row without its session_id or run_id")
        found[row["session_id"]] = row["run_id"]
    return found


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A session that could not be rebuilt: its id and why."""

    session_id: str
    run_id: str
    message: str


def _one_session_at_fault(exc: SynthDatabaseError) -> bool:
    # A value the driver cannot give as text; anything else (a damaged page, a lock held
    # past the wait) is the file's, not one session's, and stops the import.
    return _UNDECODABLE in exc.message


def _read_each(
    db: SynthDatabase, ids: Sequence[str], mapping: Mapping[str, str]
) -> Iterator[SessionRows | Unreadable]:
    """The rows of these sessions; when a row of one of them cannot be read, each session
    read alone, the unreadable ones in their place."""
    try:
        read = db.read(ids)
    except SynthDatabaseError as exc:
        if not _one_session_at_fault(exc):
            raise
        # A row of one session the driver cannot read (text that is not UTF-8) failed the
        # whole batch, and every later run of the import: each session alone, the
        # unreadable ones reported, the others imported.
        if len(ids) == 1:
            sid = str(ids[0])
            yield Unreadable(sid, mapping.get(sid, sid), exc.message)
        else:
            for one in ids:
                yield from _read_each(db, [one], mapping)
        return
    yield from read


def iter_rollouts(
    db: SynthDatabase,
    session_ids: Sequence[str],
    run_ids: Mapping[str, str] | None = None,
    batch: int = DEFAULT_BATCH,
) -> Iterator[Imported | Unreadable]:
    """Each session rebuilt as a rollout, `batch` sessions read per transaction.

    A session's run_id is its id unless `run_ids` maps it to another. A session whose rows
    cannot be read or rebuilt (an id that is not text, values of types synth-ai never
    writes) is an `Unreadable` in its place: one odd session does not stop an import of
    thousands.
    """
    mapping = run_ids or {}
    for start in range(0, len(session_ids), batch):
        ids = session_ids[start : start + batch]
        readable: list[str] = []
        for sid in ids:
            if isinstance(sid, UnreadableId):
                # Not looked up: its text is only how it is shown, and may be another
                # session's id; its children, keyed by the same bytes, are not read either.
                yield Unreadable(sid, str(sid), sid.problem)  # the id keeps its kind
            else:
                readable.append(sid)
        if not readable:
            continue
        for rows in _read_each(db, readable, mapping):
            if isinstance(rows, Unreadable):
                yield rows
                continue
            sid = str(rows.session["session_id"])
            run_id = mapping.get(sid, sid)
            try:
                yield build_rollout(rows, run_id)
            except (TypeError, ValueError, AttributeError, KeyError, RecursionError) as exc:
                # RecursionError: a JSON column nested deeper than Python's parser goes.
                yield Unreadable(sid, run_id, f"cannot rebuild the session: {exc}")
