"""The spool: a local append-only file of rollouts the server has not acknowledged yet.

A record is `TSR1 <length> <crc32>\\n<bytes>\\n`: length-prefixed and checksummed, so a
record is read back byte for byte (the store keeps what was sent), and a write torn by a
crash is recognised and dropped without losing anything after it. Rollouts the server
refused for good at replay go to `<spool>.rejected`, each after a JSON line with the
reason. `<spool>.lock` serialises appends (threads and processes); `<spool>.replay-lock`
lets one replay run at a time.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from tracestore_client.encoding import run_id_of

try:  # POSIX: a lock the task app's other processes (workers) respect too
    import fcntl
except ImportError:  # pragma: no cover - Windows: threads of one process only
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("tracestore.client")

SPOOL_MAGIC = b"TSR1"  # what every record starts with

# Replay posts the spool in batches of at most this many rollouts or bytes.
REPLAY_BATCH_DOCS = 100
REPLAY_BATCH_BYTES = 8 * 1024 * 1024


def looks_like_a_spool(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is absent, empty, or starts as a spool record does (a file of rollouts
    given as a spool by mistake does not)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(SPOOL_MAGIC) + 1)
    except FileNotFoundError:
        return True
    return (SPOOL_MAGIC + b" ").startswith(head)


def _record(raw: bytes) -> bytes:
    return b"%s %d %08x\n%s\n" % (SPOOL_MAGIC, len(raw), zlib.crc32(raw), raw)


def _read_record(data: bytes, pos: int) -> tuple[bytes, int] | None:
    """The record starting at `pos` and the position after it, or None when it is damaged."""
    header_end = data.find(b"\n", pos)
    parts = data[pos:header_end].split(b" ") if header_end >= 0 else []
    if len(parts) != 3 or parts[0] != SPOOL_MAGIC or not parts[1].isdigit():
        return None
    start = header_end + 1
    end = start + int(parts[1])
    raw = data[start:end]
    if end >= len(data) or data[end : end + 1] != b"\n":
        return None
    if f"{zlib.crc32(raw):08x}".encode() != parts[2]:
        return None
    return raw, end + 1


def _parse_records(data: bytes) -> tuple[list[bytes], int]:
    """Records of a spool file, and how many damaged ones were skipped."""
    records: list[bytes] = []
    damaged = 0
    pos = 0
    while pos < len(data):
        found = _read_record(data, pos)
        if found is not None:
            records.append(found[0])
            pos = found[1]
            continue
        # A torn tail (crash mid-append: that rollout was never reported spooled) or
        # damage: skip to the next record header.
        damaged += 1
        following = data.find(b"\n" + SPOOL_MAGIC + b" ", pos)
        if following < 0:
            break
        pos = following + 1
    return records, damaged


def _parse_rejected(data: bytes) -> list[tuple[str, bytes]]:
    """(reason, rollout) of each whole entry of a `.rejected` file."""
    entries: list[tuple[str, bytes]] = []
    pos = 0
    while pos < len(data):
        line_end = data.find(b"\n", pos)
        if line_end < 0:
            break
        try:
            reason = str(json.loads(data[pos:line_end]).get("reason", ""))
        except (ValueError, AttributeError):
            break  # damaged (a crash mid-write): what follows cannot be trusted
        found = _read_record(data, line_end + 1)
        if found is None:
            break
        entries.append((reason, found[0]))
        pos = found[1]
    return entries


def _fsync_dir(path: Path) -> None:
    # A new or renamed file is durable only once its directory entry is.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _file_lock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """An exclusive lock on `path` (shared by threads and processes); yields acquired."""
    with open(path, "a+b") as handle:
        if fcntl is None:  # pragma: no cover
            yield True
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def batches(records: list[bytes]) -> Iterator[list[bytes]]:
    """`records` in batches a replay posts at once (bounded in count and bytes)."""
    batch: list[bytes] = []
    size = 0
    for raw in records:
        if batch and (len(batch) >= REPLAY_BATCH_DOCS or size + len(raw) > REPLAY_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(raw)
        size += len(raw)
    if batch:
        yield batch


@dataclass(slots=True)
class ReplayResult:
    """What a replay of the spool did."""

    delivered: int = 0
    rejected: int = 0
    remaining: int = 0
    damaged: int = 0
    busy: bool = False  # another replay (thread or process) was already running
    errors: list[str] = field(default_factory=list)  # why each rejected rollout was refused
    stopped: str | None = None  # why delivery stopped early (the server went away)


@dataclass(frozen=True, slots=True)
class SpoolStatus:
    """What a spool holds, read without changing anything (see Spool.status)."""

    path: str
    exists: bool  # any file of the spool exists (an emptied spool keeps its lock file)
    pending: int  # rollouts waiting, a leftover replay's included
    pending_bytes: int  # size on disk of the files holding them
    damaged: int  # records skipped as torn or damaged (or being written right now)
    first_run_id: str | None  # the first and the last rollout a replay would deliver
    last_run_id: str | None
    last_written: datetime.datetime | None  # when a waiting rollout was last written (UTC)
    replaying: bool  # a `.replaying` file exists: a replay runs, or one was interrupted
    rejected: int  # rollouts in `<spool>.rejected`
    rejected_path: str
    last_rejection: str | None  # the reason of the last one

    def as_dict(self) -> dict[str, Any]:
        """The status as plain JSON-ready data."""
        out = asdict(self)
        out["last_written"] = None if self.last_written is None else self.last_written.isoformat()
        return out


class Spool:
    """A local append-only file of rollouts the server has not acknowledged yet.

    `append` returns only once the records are fsynced. A replay first renames the file
    to `<path>.replaying` (new appends start a new file), delivers its records, appends
    what was not delivered back to the spool and then removes the renamed file. A crash
    at any point loses nothing: the next replay starts with a leftover `.replaying` file,
    and a rollout delivered twice is a `duplicate`, which counts as delivered.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.replaying = self.path.with_name(self.path.name + ".replaying")
        self.rejected_path = self.path.with_name(self.path.name + ".rejected")
        self._lock = self.path.with_name(self.path.name + ".lock")
        self._replay_lock = self.path.with_name(self.path.name + ".replay-lock")

    def _ensure_dir(self) -> None:
        # Made when first needed, not by the constructor: looking at a spool (status)
        # must not create directories for a mistyped path.
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, raws: Sequence[bytes]) -> None:
        """Add rollouts to the spool, durably (fsynced) before returning."""
        if not raws:
            return
        data = b"".join(_record(raw) for raw in raws)
        self._ensure_dir()
        with _file_lock(self._lock):
            created = not self.path.exists()
            with open(self.path, "a+b") as handle:
                handle.seek(0, os.SEEK_END)
                if handle.tell() > 0:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        # The file ends in a write torn by a crash: start on a new line,
                        # where a reader resynchronising after the damage will look.
                        data = b"\n" + data
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            if created:
                _fsync_dir(self.path.parent)

    def pending(self) -> int:
        """How many rollouts wait in the spool (a leftover replay included)."""
        total = 0
        for path in (self.replaying, self.path):
            with contextlib.suppress(FileNotFoundError):
                total += len(_parse_records(path.read_bytes())[0])
        return total

    def has_pending(self) -> bool:
        """True when the spool may hold rollouts (a cheap check: file sizes only)."""
        for path in (self.replaying, self.path):
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_size > 0:
                    return True
        return False

    def exists(self) -> bool:
        """True when any file of this spool exists (it was written to at least once)."""
        files = (self.path, self.replaying, self.rejected_path, self._lock)
        return any(p.exists() for p in files)

    def rejected(self) -> list[tuple[str, bytes]]:
        """(reason, rollout) of each rollout the server refused for good at a replay."""
        try:
            return _parse_rejected(self.rejected_path.read_bytes())
        except FileNotFoundError:
            return []

    def status(self) -> SpoolStatus:
        """What the spool holds, read without taking a lock or changing a file."""
        records: list[bytes] = []
        damaged = size = 0
        mtimes: list[float] = []
        # The renamed file of a replay holds the older records: it is delivered first.
        for path in (self.replaying, self.path):
            try:
                data = path.read_bytes()
                mtimes.append(path.stat().st_mtime)
            except FileNotFoundError:
                continue
            found, bad = _parse_records(data)
            records += found
            damaged += bad
            size += len(data)
        rejected = self.rejected()
        last_written = (
            datetime.datetime.fromtimestamp(max(mtimes), datetime.UTC)
            if records and mtimes
            else None
        )
        return SpoolStatus(
            path=str(self.path),
            exists=self.exists(),
            pending=len(records),
            pending_bytes=size,
            damaged=damaged,
            first_run_id=run_id_of(records[0]) if records else None,
            last_run_id=run_id_of(records[-1]) if records else None,
            last_written=last_written,
            replaying=self.replaying.exists(),
            rejected=len(rejected),
            rejected_path=str(self.rejected_path),
            last_rejection=rejected[-1][0] if rejected else None,
        )

    @contextlib.contextmanager
    def replay_session(self) -> Iterator[ReplaySession | None]:
        """Hold the replay lock (None when another replay holds it) for one replay."""
        self._ensure_dir()
        with _file_lock(self._replay_lock, blocking=False) as acquired:
            yield ReplaySession(self) if acquired else None

    def _take(self) -> tuple[list[bytes], int]:
        """The records to replay now: a leftover `.replaying` file, else the spool's."""
        if not self.replaying.exists():
            with _file_lock(self._lock):
                if not self.path.exists() or self.path.stat().st_size == 0:
                    return [], 0
                os.replace(self.path, self.replaying)
                _fsync_dir(self.path.parent)
        return _parse_records(self.replaying.read_bytes())

    def _finish(self, undelivered: list[bytes], rejected: list[tuple[bytes, str]]) -> None:
        if rejected:
            lines = b"".join(
                json.dumps({"reason": reason}).encode() + b"\n" + _record(raw)
                for raw, reason in rejected
            )
            with open(self.rejected_path, "ab") as handle:
                handle.write(lines)
                handle.flush()
                os.fsync(handle.fileno())
            for _raw, reason in rejected:
                log.warning(
                    "tracestore spool %s: the server refused a spooled rollout for good; "
                    "kept in %s: %s",
                    self.path,
                    self.rejected_path,
                    reason,
                    extra={"spool": str(self.path), "reason": reason},
                )
        # Undelivered records go back before the renamed file goes: a crash in between
        # leaves them twice, which replays as a duplicate, never as a loss.
        self.append(undelivered)
        self.replaying.unlink(missing_ok=True)
        _fsync_dir(self.path.parent)


Outcome = Literal["delivered", "rejected", "failed"]


class ReplaySession:
    """One replay, under the replay lock: take, deliver, finish; repeated a bounded time."""

    ROUNDS = 8  # appends may race a replay; a few rounds drain them, a bounded number

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.result = ReplayResult()

    def take(self) -> list[bytes]:
        """The next records to deliver ([] when the spool is empty)."""
        records, damaged = self.spool._take()
        self.result.damaged += damaged
        if damaged:
            log.warning(
                "tracestore spool %s: skipped %d damaged record%s (a write torn by a crash)",
                self.spool.path,
                damaged,
                "" if damaged == 1 else "s",
                extra={"spool": str(self.spool.path)},
            )
        return records

    def finish(self, records: list[bytes], outcomes: list[tuple[Outcome, str]]) -> bool:
        """Record the outcome of delivering `records`; True when all got an answer."""
        undelivered: list[bytes] = []
        rejected: list[tuple[bytes, str]] = []
        for raw, (outcome, reason) in zip(records, outcomes, strict=True):
            if outcome == "delivered":
                self.result.delivered += 1
            elif outcome == "rejected":
                rejected.append((raw, reason))
                self.result.rejected += 1
                self.result.errors.append(reason)
            else:
                undelivered.append(raw)
                if self.result.stopped is None and reason != NOT_TRIED:
                    self.result.stopped = reason
        self.result.remaining += len(undelivered)
        self.spool._finish(undelivered, rejected)
        return not undelivered


NOT_TRIED = "not tried"  # the reason given to records after the one delivery stopped at
