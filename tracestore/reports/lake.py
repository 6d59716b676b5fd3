"""The lake: an export target several stores and many export runs can share (issue 15).

Two forms, both Hive-partitioned by the UTC `day` a run was received:

* Delta Lake (`--format delta`): DIR/<table>/ is a Delta table (the `deltalake`
  package: delta-rs, no JVM), DIR/_tracestore/lake.json says what the tables are, and
  DIR/_tracestore/stores/<store_id>.json records, per store, the watermark its
  incremental exports have reached and the table versions each export left. An export
  replaces the rows of the runs it carries in one commit per table (a Delta overwrite
  restricted to a predicate: the store, and the batch's ingest-sequence or day range),
  children before `runs`, so rerunning an export never duplicates a run, and a reader
  never sees a run whose children are not there yet.
* Parquet (`--format parquet`): one store's snapshot, DIR/manifest.json listing every
  file (reports/snapshot.py); `--incremental` adds a batch of files and rewrites the
  manifest, which is the commit point.

Every row carries `store_id` and `run_id` (runs: its own), and its run's `ingest_seq`,
so stores share one lake and consumers can take "what is new" themselves.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from tracestore.errors import InvalidRequest

# Float epoch seconds in the store; timestamps in an export, the float kept beside as
# <name>_epoch (what reports read back, to the bit).
EPOCH_COLUMNS = {
    "trace_events": ("event_time",),
    "trace_messages": ("event_time", "message_time"),
}
EPOCH_SUFFIX = "_epoch"
LAKE_DIR = "_tracestore"
LAKE_FILE = "lake.json"
LAKE_FORMAT = "tracestore-lake"
LAKE_FORMAT_VERSION = 1
# How many past exports a store's state keeps (what, when, which table versions).
KEPT_EXPORTS = 50
# Names tracestore gives Parquet files: store, batch range, table, then DuckDB's counter. A
# file in a snapshot's tree with such a name that its manifest does not list was left by
# an export that died before its manifest was written.
_OUR_FILE = re.compile(r"^s[0-9a-f]{12}_q\d+-\d+_[a-z_]+_\d+\.parquet$")


def file_stem(store_id: str, after: int | None, upto: int, table: str) -> str:
    """The stem of a batch's Parquet file names: unique per store, batch and table."""
    return f"s{store_id[:12]}_q{after or 0}-{upto}_{table}"


def is_our_file(name: str) -> bool:
    """Whether a file name is one tracestore's Parquet export gives."""
    return _OUR_FILE.match(name) is not None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write a JSON document atomically (a reader sees the old one or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"{path} is not a tracestore lake file")
    return data


# --- what a directory is ------------------------------------------------------------------


def detect(root: Path) -> str:
    """'parquet' (a snapshot with manifest.json) or 'delta' (a lake); else InvalidRequest."""
    from tracestore.reports.snapshot import MANIFEST

    if (root / MANIFEST).is_file():
        return "parquet"
    # _tracestore/ alone: a first export that died before its first commit (its lock
    # file is there); the next export carries on.
    if (root / LAKE_DIR).is_dir() or (root / "runs" / "_delta_log").is_dir():
        return "delta"
    raise InvalidRequest(
        f"{root} is not a tracestore snapshot: it has no {MANIFEST} and no Delta tables"
    )


def detect_or_none(root: Path) -> str | None:
    """Like `detect`, None for a directory that holds neither."""
    try:
        return detect(root)
    except InvalidRequest:
        return None


def is_delta_table(path: Path) -> bool:
    """Whether `path` holds a Delta table (its _delta_log)."""
    return (path / "_delta_log").is_dir()


# --- per-store state of a Delta lake --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreState:
    """What a Delta lake records about one store's exports."""

    store_id: str
    kind: str | None
    # Every run of the store with ingest_seq below this is in the lake (None: no complete
    # export yet; day-range exports never set it).
    upto: int | None
    data: dict[str, Any]


def state_path(root: Path, store_id: str) -> Path:
    """Where a Delta lake keeps one store's state."""
    return root / LAKE_DIR / "stores" / f"{store_id}.json"


def read_state(root: Path, store_id: str) -> StoreState:
    """The store's state in the lake at `root` (empty when it never exported there)."""
    path = state_path(root, store_id)
    if not path.is_file():
        return StoreState(store_id, None, None, {"store_id": store_id, "exports": []})
    data = _read_json(path)
    upto = data.get("upto")
    return StoreState(store_id, data.get("kind"), upto if isinstance(upto, int) else None, data)


def stores_in(root: Path) -> list[str]:
    """The ids of the stores a Delta lake holds (from their state files)."""
    folder = root / LAKE_DIR / "stores"
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.json"))


def record_export(
    root: Path, state: StoreState, kind: str, upto: int | None, entry: dict[str, Any]
) -> dict[str, Any]:
    """Write the store's new state: its watermark (when this export completes one) and
    this export's entry, last in a list of the recent ones."""
    data = dict(state.data)
    data.update({"store_id": state.store_id, "kind": kind})
    if upto is not None:
        data["upto"] = upto
    data["updated_at"] = datetime.now(UTC).isoformat()
    data["exports"] = [*data.get("exports", []), entry][-KEPT_EXPORTS:]
    write_json(state_path(root, state.store_id), data)
    return data


def write_lake_file(root: Path, tables: dict[str, list[dict[str, str]]]) -> None:
    """Describe the lake's tables in DIR/_tracestore/lake.json (columns as last written)."""
    path = root / LAKE_DIR / LAKE_FILE
    data: dict[str, Any] = (
        _read_json(path) if path.is_file() else {"created_at": datetime.now(UTC).isoformat()}
    )
    known: dict[str, Any] = dict(data.get("tables") or {})
    known.update(tables)
    data.update(
        {
            "format": LAKE_FORMAT,
            "format_version": LAKE_FORMAT_VERSION,
            "partitioning": {
                "column": "day",
                "type": "DATE",
                "meaning": "UTC date the run was received; rows of a run share its day",
            },
            "keys": "store_id, run_id (every table but legacy_reads); ingest_seq orders runs",
            "tables": known,
        }
    )
    write_json(path, data)


# --- Delta writes ---------------------------------------------------------------------------


def sql_string(value: str) -> str:
    """A string literal for a delta-rs predicate."""
    return "'" + value.replace("'", "''") + "'"


def write_delta(
    table_path: Path,
    files: list[Path],
    partitioned: bool,
    predicate: str,
    metadata: dict[str, str],
) -> int:
    """Replace the rows matching `predicate` in the Delta table at `table_path` with the
    rows of the staged Parquet `files`, in one commit; returns the table's new version.

    `partitioned`: the files sit in `day=...` folders under their table's staging folder
    (else one file holding `day` as a column: an empty table). The first write creates
    the table. New columns (a newer tracestore) are added to the table's schema; rows
    written before read NULL there.
    """
    import pyarrow as pa  # type: ignore[import-untyped]  # no type stubs
    import pyarrow.dataset as ds  # type: ignore[import-untyped]
    from deltalake import CommitProperties, DeltaTable, WriterProperties, write_deltalake

    if partitioned:
        day = ds.partitioning(pa.schema([("day", pa.date32())]), flavor="hive")
        base = str(files[0].parent.parent)
        data = ds.dataset(
            [str(f) for f in files], format="parquet", partitioning=day, partition_base_dir=base
        )
    else:
        data = ds.dataset([str(f) for f in files], format="parquet")
    reader = data.scanner().to_reader()
    commit = CommitProperties(custom_metadata=metadata)
    # zstd like the Parquet snapshots (delta-rs writes snappy by default: twice the bytes).
    zstd = WriterProperties(compression="ZSTD")
    if not is_delta_table(table_path):
        write_deltalake(
            str(table_path),
            reader,
            partition_by=["day"],
            mode="append",
            commit_properties=commit,
            writer_properties=zstd,
        )
    else:
        write_deltalake(
            str(table_path),
            reader,
            partition_by=["day"],
            mode="overwrite",
            predicate=predicate,
            schema_mode="merge",
            commit_properties=commit,
            writer_properties=zstd,
        )
    return int(DeltaTable(str(table_path)).version())
