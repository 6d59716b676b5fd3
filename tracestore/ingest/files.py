"""Rollout files: JSON (one document or an array), JSONL/NDJSON, each optionally gzipped.

Files may also be FIFOs (`mkfifo`, or a shell's `<(zcat ...)`): they are read as streams
once someone writes to them. A FIFO nobody opens for writing is given up after
`fifo_wait()` seconds instead of blocking forever. Everything that goes wrong with a file
as a whole (missing, unreadable, a directory, corrupt or truncated gzip, a silent FIFO)
is an `UnreadableFile` naming it; the documents read before it stay good.

Importing this module stays light (the JSON parser loads on first use): the command
line's `--help` imports it.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tracestore.envvars import env_seconds
from tracestore.errors import InvalidJSON, InvalidRequest, TracestoreError

LINE_SUFFIXES = (".jsonl", ".ndjson")
DOCUMENT_SUFFIXES = (".json", *LINE_SUFFIXES)
# What a directory given to `ingest` contributes: these names, gzipped or not.
DIRECTORY_PATTERNS = tuple(f"*{s}{gz}" for s in DOCUMENT_SUFFIXES for gz in ("", ".gz"))
FIFO_WAIT_ENV = "TRACESTORE_FIFO_WAIT"
DEFAULT_FIFO_WAIT = 10.0
_POLL_SECONDS = 0.05
_SQLITE_MAGIC = b"SQLite format 3\x00"


class UnreadableFile(InvalidRequest):
    """A file (or FIFO) that cannot be read as a whole; the message names it."""

    code = "unreadable_file"


@dataclass(slots=True)
class FileItem:
    """One document read from a file: its raw bytes, parsed value (or error), and origin."""

    raw: bytes
    value: Any  # the parsed JSON, or the InvalidJSON error of this item
    where: str


def fifo_wait() -> float:
    """Seconds to wait for the other end of a FIFO (TRACESTORE_FIFO_WAIT, default 10;
    `inf` waits without limit)."""
    return env_seconds(FIFO_WAIT_ENV, DEFAULT_FIFO_WAIT)


def _fifo_wait_for(path: Path) -> float:
    """`fifo_wait()`, its refusal naming the FIFO it was needed for (so `ingest` reports
    that file and goes on with the next, as for any file it cannot read)."""
    try:
        return fifo_wait()
    except InvalidRequest as exc:
        raise UnreadableFile(f"{path}: {exc.message}") from None


def is_fifo(path: Path) -> bool:
    """True when `path` is a FIFO or a pipe (`<(...)` gives /dev/fd/N)."""
    try:
        return stat.S_ISFIFO(path.stat().st_mode)
    except OSError:
        return False


def expand_paths(paths: Iterable[Path]) -> Iterator[Path | UnreadableFile]:
    """Each path, a directory replaced by its files matching DIRECTORY_PATTERNS (sorted,
    not recursive, hidden files skipped); an UnreadableFile for a path that is neither."""
    for path in paths:
        if path.is_dir():
            found = sorted(
                {
                    p
                    for pattern in DIRECTORY_PATTERNS
                    for p in path.glob(pattern)
                    if not p.name.startswith(".") and (p.is_file() or is_fifo(p))
                }
            )
            if not found:
                patterns = ", ".join(DIRECTORY_PATTERNS)
                yield UnreadableFile(f"{path}: a directory without rollout files ({patterns})")
            yield from found
        elif path.exists() or is_fifo(path):
            yield path
        else:
            yield UnreadableFile(f"{path}: no such file")


def stored_size(path: Path) -> int | None:
    """The size of a regular file, None for a FIFO or a file that cannot be read."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


# --- opening --------------------------------------------------------------------------------


class _Counted(io.RawIOBase):
    """A readable stream that counts the bytes read, after replaying a first chunk."""

    def __init__(self, raw: IO[bytes], first: bytes = b"") -> None:
        self._raw = raw
        self._first = first
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._first:
            n = min(len(view), len(self._first))
            view[:n] = self._first[:n]
            self._first = self._first[n:]
        else:
            data = self._raw.read(len(view))
            n = len(data)
            view[:n] = data
        self.count += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def open_fifo_for_reading(path: Path, wait: float | None = None) -> io.BufferedReader:
    """Open a FIFO once a writer has connected (UnreadableFile after `wait` seconds)."""
    return io.BufferedReader(_fifo_raw(path, wait))


def _fifo_raw(path: Path, wait: float | None) -> _Counted:
    wait = _fifo_wait_for(path) if wait is None else wait
    # O_NONBLOCK: opening never blocks. With no writer a read says end-of-file; with a
    # writer that has not written yet it says EAGAIN: that tells the two apart.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    deadline = time.monotonic() + wait
    first = b""
    try:
        while True:
            try:
                first = os.read(fd, 1 << 16)
            except BlockingIOError:
                break  # a writer is there: wait for its data in blocking mode
            if first or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_SECONDS)
        if not first and time.monotonic() >= deadline:
            raise UnreadableFile(
                f"{path}: a FIFO nobody wrote to within {wait:g}s "
                f"(start its writer first, or set {FIFO_WAIT_ENV})"
            )
        os.set_blocking(fd, True)
        raw = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    return _Counted(raw, first)


def open_fifo_for_writing(path: Path, wait: float | None = None) -> IO[bytes]:
    """Open a FIFO for writing once a reader has it open (UnreadableFile after `wait`)."""
    wait = _fifo_wait_for(path) if wait is None else wait
    deadline = time.monotonic() + wait
    while True:
        try:
            # O_NONBLOCK: fails with ENXIO instead of blocking while nobody reads.
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            if time.monotonic() >= deadline:
                raise UnreadableFile(
                    f"{path}: a FIFO nobody read from within {wait:g}s "
                    f"(start its reader first, or set {FIFO_WAIT_ENV})"
                ) from None
            time.sleep(_POLL_SECONDS)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb")


def _open(path: Path) -> tuple[IO[bytes], IO[bytes], _Counted]:
    """The file's decoded stream, the stream as stored, and the counter of stored bytes."""
    if is_fifo(path):
        counted = _fifo_raw(path, None)
    elif path.is_dir():
        raise UnreadableFile(f"{path}: is a directory")
    elif path.exists() and not path.is_file():
        raise UnreadableFile(f"{path}: not a regular file or FIFO (a device or socket)")
    else:
        counted = _Counted(path.open("rb"))
    stored: IO[bytes] = io.BufferedReader(counted)
    if path.name.lower().endswith(".gz"):
        stream: IO[bytes] = gzip.GzipFile(fileobj=stored)  # type: ignore[assignment]  # typeshed: GzipFile is a BufferedIOBase, usable as IO[bytes]
        return stream, stored, counted
    return stored, stored, counted


def _stem_suffix(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return Path(name).suffix


def _problem(path: Path, exc: BaseException, documents: int) -> UnreadableFile:
    after = f" after {documents} document{'s' if documents > 1 else ''}" if documents else ""
    if isinstance(exc, EOFError):
        text = f"the gzip data ends early{after} (a truncated file?)"
    elif isinstance(exc, gzip.BadGzipFile):
        text = f"not gzip data ({exc})"
    elif isinstance(exc, zlib.error):
        text = f"corrupt gzip data{after} ({exc})"
    elif isinstance(exc, OSError):
        text = f"cannot read{after}: {exc.strerror or exc}"
    else:
        text = f"cannot read{after}: {exc}"
    return UnreadableFile(f"{path}: {text}")


def iter_file(path: Path, on_progress: Callable[[int], None] | None = None) -> Iterator[FileItem]:
    """Yield the documents of one file, streaming JSONL line by line.

    `on_progress` receives the number of bytes of the file (as stored) read so far.
    Raises UnreadableFile (after yielding what came before) when the file as a whole
    cannot be read.
    """
    documents = 0
    try:
        for item in _iter_file(path, on_progress):
            documents += 1
            yield item
    except UnreadableFile:
        raise
    except (OSError, EOFError, zlib.error) as exc:
        raise _problem(path, exc, documents) from None


def _iter_file(path: Path, on_progress: Callable[[int], None] | None) -> Iterator[FileItem]:
    from tracestore.jsontext import split_array

    stream, stored, counted = _open(path)
    # A GzipFile does not close the file object it was given: close both.
    with stored, stream:
        if _stem_suffix(path) in LINE_SUFFIXES:
            for number, line in enumerate(stream, start=1):
                if on_progress is not None:
                    on_progress(counted.count)
                if not line.strip():
                    continue
                line = line.rstrip(b"\r\n")
                where = f"{path}:{number}"
                yield _item(line, where)
            return
        data = stream.read()
        if on_progress is not None:
            on_progress(counted.count)
    if data.startswith(_SQLITE_MAGIC):
        # Not rollout JSON at all: most likely synth-ai's own trace database, which has its
        # own importer. Said once for the file, not as one "invalid JSON" document.
        raise UnreadableFile(
            f"{path}: a SQLite database, not rollout JSON; synth-ai's trace database goes in "
            f"with `tracestore import synth-db {path}`"
        )
    try:
        items = split_array(data)
    except ValueError as exc:
        yield FileItem(data, InvalidJSON(f"not a valid JSON array: {exc}"), str(path))
        return
    if items is None:
        yield _item(data, str(path))
        return
    # An array of rollouts: each element is its own document, kept as the file spells it.
    for i, raw in enumerate(items):
        yield _item(raw, f"{path}[{i}]")


def _item(raw: bytes, where: str) -> FileItem:
    """One document, parsed; a refusal (not JSON, a repeated key) becomes its value."""
    from tracestore.ingest.parse import parse_json

    try:
        return FileItem(raw, parse_json(raw), where)
    except TracestoreError as exc:
        return FileItem(raw, exc, where)
