"""Rollout files: JSON (one document or an array), JSONL/NDJSON, each optionally gzipped."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tracestore.errors import InvalidJSON
from tracestore.ingest.parse import parse_json
from tracestore.jsontext import dumps

LINE_SUFFIXES = (".jsonl", ".ndjson")


@dataclass(slots=True)
class FileItem:
    """One document read from a file: its raw bytes, parsed value (or error), and origin."""

    raw: bytes
    value: Any  # the parsed JSON, or the InvalidJSON error of this item
    where: str


def _stem_suffix(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return Path(name).suffix


def _open(path: Path) -> tuple[IO[bytes], IO[bytes]]:
    raw: IO[bytes] = path.open("rb")
    if path.name.lower().endswith(".gz"):
        stream: IO[bytes] = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]  # typeshed: GzipFile is a BufferedIOBase, usable as IO[bytes]
        return stream, raw
    return raw, raw


def iter_file(path: Path, on_progress: Callable[[int], None] | None = None) -> Iterator[FileItem]:
    """Yield the documents of one file, streaming JSONL line by line.

    `on_progress` receives the number of bytes of the file (as stored) read so far.
    """
    stream, raw = _open(path)
    with raw, stream:
        if _stem_suffix(path) in LINE_SUFFIXES:
            for number, line in enumerate(stream, start=1):
                if on_progress is not None:
                    on_progress(raw.tell())
                if not line.strip():
                    continue
                line = line.rstrip(b"\r\n")
                where = f"{path}:{number}"
                try:
                    yield FileItem(line, parse_json(line), where)
                except InvalidJSON as exc:
                    yield FileItem(line, exc, where)
            return
        data = stream.read()
        if on_progress is not None:
            on_progress(raw.tell())
    try:
        value = parse_json(data)
    except InvalidJSON as exc:
        yield FileItem(data, exc, str(path))
        return
    if isinstance(value, list):
        # An array of rollouts: each element is its own document.
        for i, item in enumerate(value):
            yield FileItem(dumps(item), item, f"{path}[{i}]")
    else:
        yield FileItem(data, value, str(path))
