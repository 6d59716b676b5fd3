"""The snapshot manifest: what `tracestore export` wrote, read back by `--from DIR`.

A snapshot directory holds one folder per table, Hive-partitioned by the UTC day its run
was received (`runs/day=2025-11-20/s<store>_q<after>-<upto>_runs_0.parquet`), and
`manifest.json` listing every file with its row count and sha256, each table's columns,
the schema revision, the time range, the store's id, the watermark an incremental export
continues from, and the tracestore version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tracestore.errors import InvalidRequest

MANIFEST = "manifest.json"
FORMAT = "tracestore-snapshot"
# 2 (issue 15): rows carry store_id, run_id and ingest_seq; float epoch times become
# timestamps (the float kept as <name>_epoch); unique file names; a watermark and
# batches for --incremental. Version 1 snapshots still read.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)


@dataclass(frozen=True, slots=True)
class SnapshotTable:
    """One table of a snapshot: its files (relative paths), rows and columns."""

    name: str
    rows: int
    files: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]  # (name, DuckDB type), partition column included
    partitioned: bool


@dataclass(frozen=True, slots=True)
class Manifest:
    """A snapshot's manifest, as read from disk."""

    root: Path
    data: dict[str, Any]
    tables: dict[str, SnapshotTable]

    @property
    def schema_revision(self) -> str | None:
        """The store's schema revision at export time."""
        value = self.data.get("schema_revision")
        return value if isinstance(value, str) else None


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(root: Path) -> Manifest:
    """Read and check `root/manifest.json` (InvalidRequest when it is not a snapshot)."""
    path = root / MANIFEST
    if not path.is_file():
        raise InvalidRequest(f"{root} is not a tracestore snapshot: it has no {MANIFEST}")
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidRequest(f"{path} is not a tracestore snapshot manifest")
    if data.get("format_version") not in READABLE_VERSIONS:
        raise InvalidRequest(
            f"{path} has format version {data.get('format_version')!r}; this tracestore reads "
            f"versions {', '.join(map(str, READABLE_VERSIONS))}"
        )
    tables: dict[str, SnapshotTable] = {}
    for name, entry in (data.get("tables") or {}).items():
        files = tuple(f["path"] for f in entry.get("files", []))
        for rel in files:
            if not (root / rel).is_file():
                raise InvalidRequest(f"snapshot {root} lacks {rel}, listed in its manifest")
        tables[name] = SnapshotTable(
            name=name,
            rows=int(entry.get("rows", 0)),
            files=files,
            columns=tuple((c["name"], c["type"]) for c in entry.get("columns", [])),
            partitioned=bool(entry.get("partitioned", False)),
        )
    return Manifest(root=root, data=data, tables=tables)


def verify_snapshot(root: Path) -> list[str]:
    """Problems with a snapshot's files (checksums, row counts); empty when it is intact."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # no type stubs

    manifest = read_manifest(root)
    problems: list[str] = []
    for entry in manifest.data["tables"].values():
        for f in entry["files"]:
            path = root / f["path"]
            if sha256_file(path) != f["sha256"]:
                problems.append(f"{f['path']}: sha256 differs from the manifest")
            try:
                rows = pq.read_metadata(path).num_rows
            except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
                problems.append(f"{f['path']}: not a readable Parquet file ({exc})")
                continue
            if rows != f["rows"]:
                problems.append(f"{f['path']}: {rows} rows, the manifest says {f['rows']}")
    return problems
