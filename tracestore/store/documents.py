"""The stored documents: the one codec of `run_documents`, and reading documents back.

Each rollout is kept as received, zstd-compressed (`encoding` names the codec, so a later
codec can sit beside this one). Everything that reads a document back goes through here.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from typing import Any

import zstandard
from sqlalchemy import Connection, bindparam, select

from tracestore.errors import NotFound
from tracestore.models import Run, RunDocument

DOCUMENT_ENCODING = "zstd"
_local = threading.local()


def _compressor() -> Any:
    # ZstdCompressor is not safe to share across threads; one per thread is cheap.
    comp = getattr(_local, "compressor", None)
    if comp is None:
        comp = _local.compressor = zstandard.ZstdCompressor(level=3)
    return comp


def compress_document(raw: bytes) -> bytes:
    """Compress a raw document for the run_documents table."""
    return bytes(_compressor().compress(raw))


def decompress_document(body: bytes, encoding: str) -> bytes:
    """Give back the raw document bytes stored by compress_document."""
    if encoding != DOCUMENT_ENCODING:
        raise ValueError(f"unknown document encoding {encoding!r}")
    return bytes(zstandard.ZstdDecompressor().decompress(body))


def content_hash(raw: bytes) -> str:
    """sha256 of the document's bytes as received.

    A retry almost always resends the same bytes, so equal hashes settle `duplicate` at
    once; different bytes may still be the same JSON value (other key order or spacing),
    which the store decides by comparing the values exactly (numbers as decimals, never
    floats). Hashing the bytes, rather than a canonical re-serialization, spares a second
    copy of every document in memory.
    """
    return hashlib.sha256(raw).hexdigest()


_BY_RUN_ID = (
    select(RunDocument.body, RunDocument.encoding, Run.received_at)
    .join(Run, Run.id == RunDocument.run_pk)
    .where(Run.run_id == bindparam("run_id"))
)
_BY_PKS = select(RunDocument.run_pk, RunDocument.body, RunDocument.encoding).where(
    RunDocument.run_pk.in_(bindparam("pks", expanding=True))
)


def load_document(conn: Connection, run_id: str) -> bytes:
    """The rollout `run_id` exactly as received; NotFound when absent."""
    return load_document_received(conn, run_id)[0]


def load_document_received(conn: Connection, run_id: str) -> tuple[bytes, Any]:
    """The rollout `run_id` as received, and when it was received; NotFound when absent."""
    row = conn.execute(_BY_RUN_ID, {"run_id": run_id}).first()
    if row is None:
        raise NotFound(f"no rollout with run_id {run_id!r}", run_id=run_id)
    return decompress_document(row.body, row.encoding), row.received_at


def load_documents(conn: Connection, run_pks: Iterable[int]) -> dict[int, bytes]:
    """The documents of several runs by key (runs without one are absent)."""
    pks = list(run_pks)
    if not pks:
        return {}
    return {
        r.run_pk: decompress_document(r.body, r.encoding)
        for r in conn.execute(_BY_PKS, {"pks": pks})
    }
