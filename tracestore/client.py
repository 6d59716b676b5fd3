"""HTTP clients for tracestore (sync and async), used by `tracestore ingest --url` and producers.

Both post single rollouts and batches (gzip above a size), retry connection errors, 429,
503 and other 5xx with capped exponential backoff and full jitter (never sooner than a
`Retry-After`), treat `duplicate` as success and surface `conflict` and other 4xx at once.
Retries are bounded by a count and a total time.

With a spool (a local append-only file), a rollout the server could not take (down, or
still overloaded when the retries ran out) is written to the file, fsynced, and reported as
`"status": "spooled"`; the spool is replayed on the next successful contact with the
server, or by `replay()`. A replayed `duplicate` counts as delivered; a replayed rollout the
server refuses for good (conflict, invalid) moves to `<spool>.rejected` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import gzip
import logging
import math
import os
import random
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson

try:  # POSIX: a lock the task app's other processes (workers) respect too
    import fcntl
except ImportError:  # pragma: no cover - Windows: threads of one process only
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("tracestore.client")

GZIP_ABOVE = 64 * 1024
# 429 and every 5xx are retried; these are the ones a tracestore server sends.
RETRY_STATUSES = frozenset((429, 500, 502, 503, 504))
# Replay posts the spool in batches of at most this many rollouts or bytes.
REPLAY_BATCH_DOCS = 100
REPLAY_BATCH_BYTES = 8 * 1024 * 1024

Rollout = bytes | dict[str, Any]


class TracestoreHTTPError(Exception):
    """The server refused a request (4xx other than retryable ones), or retries ran out."""

    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.status = status
        self.code = error.get("code", f"http_{status}")
        self.body = body
        super().__init__(f"{status} {self.code}: {error.get('message', body)}")


def is_retryable(status: int) -> bool:
    """True for statuses worth retrying: 429 (too many requests) and any 5xx."""
    return status in RETRY_STATUSES or 500 <= status <= 599


def retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asked us to wait (`Retry-After`, in seconds or as an HTTP date)."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        # "inf" or "nan" would wait forever (or never): not a usable instruction.
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry: capped exponential backoff with full jitter."""

    max_retries: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0
    # Wall-clock budget for one call, all attempts and waits included (None: no budget).
    max_time: float | None = 300.0

    def delay(self, attempt: int, asked: float | None) -> float:
        """Seconds to wait before retry number `attempt` + 1."""
        # Full jitter spreads the retries of many clients after an outage; on top of a
        # Retry-After it keeps them from all coming back in the same instant.
        jitter = random.uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt))
        return jitter if asked is None else asked + jitter


class _Attempts:
    """One call's retry budget."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.attempt = 0
        self.deadline = None if policy.max_time is None else time.monotonic() + policy.max_time

    def next_delay(self, response: httpx.Response | None) -> float | None:
        """Seconds to wait before trying again, or None when the budget is spent."""
        if self.attempt >= self.policy.max_retries:
            return None
        delay = self.policy.delay(self.attempt, None if response is None else retry_after(response))
        if self.deadline is not None and time.monotonic() + delay > self.deadline:
            return None
        self.attempt += 1
        return delay


def _encode(body: bytes, gzip_above: int) -> tuple[bytes, dict[str, str]]:
    if len(body) > gzip_above:
        return gzip.compress(body, compresslevel=5), {"Content-Encoding": "gzip"}
    return body, {}


def _raw(rollout: Rollout) -> bytes:
    return rollout if isinstance(rollout, bytes) else orjson.dumps(rollout)


def _run_id(raw: bytes) -> str | None:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    run_id = doc.get("run_id") if isinstance(doc, dict) else None
    return run_id if isinstance(run_id, str) else None


def _json(response: httpx.Response) -> Any:
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return {"error": {"code": f"http_{response.status_code}", "message": response.text[:200]}}


def path_segment(value: str) -> str:
    """`value` quoted as one URL path segment ('/' escaped; '.' and '..' kept literal)."""
    quoted = urllib.parse.quote(value, safe="")
    # URL normalisation (httpx's too) resolves a bare '.' or '..' segment; escaped dots
    # are not dot segments, and the server decodes them back.
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def _rollout_path(run_id: str) -> str:
    return "/v1/rollouts/" + path_segment(run_id)


def _spooled(raw: bytes, spool: Spool) -> dict[str, Any]:
    return {"run_id": _run_id(raw), "status": "spooled", "spool": str(spool.path)}


def _spooled_batch(raws: list[bytes], spool: Spool) -> dict[str, Any]:
    results = [{"index": i, **_spooled(raw, spool)} for i, raw in enumerate(raws)]
    return {"results": results, "summary": {"total": len(raws), "spooled": len(raws)}}


def _batches(records: list[bytes]) -> Iterator[list[bytes]]:
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


# --- the spool ------------------------------------------------------------------------

_MAGIC = b"TSR1"


def _record(raw: bytes) -> bytes:
    # Length-prefixed, checksummed: a record is read back byte for byte (the store keeps
    # what was sent), and a write torn by a crash is recognised and dropped.
    return b"%s %d %08x\n%s\n" % (_MAGIC, len(raw), zlib.crc32(raw), raw)


def _parse_records(data: bytes) -> tuple[list[bytes], int]:
    """Records of a spool file, and how many damaged ones were skipped."""
    records: list[bytes] = []
    damaged = 0
    pos = 0
    while pos < len(data):
        header_end = data.find(b"\n", pos)
        parts = data[pos:header_end].split(b" ") if header_end >= 0 else []
        ok = len(parts) == 3 and parts[0] == _MAGIC and parts[1].isdigit()
        if ok:
            start = header_end + 1
            end = start + int(parts[1])
            raw = data[start:end]
            ok = (
                end < len(data)
                and data[end : end + 1] == b"\n"
                and f"{zlib.crc32(raw):08x}".encode() == parts[2]
            )
        if ok:
            records.append(raw)
            pos = end + 1
            continue
        # A torn tail (crash mid-append: that rollout was never reported spooled) or
        # damage: skip to the next record header.
        damaged += 1
        following = data.find(b"\n" + _MAGIC + b" ", pos)
        if following < 0:
            break
        pos = following + 1
    return records, damaged


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


@dataclass(slots=True)
class ReplayResult:
    """What a replay of the spool did."""

    delivered: int = 0
    rejected: int = 0
    remaining: int = 0
    damaged: int = 0
    busy: bool = False  # another replay (thread or process) was already running
    errors: list[str] = field(default_factory=list)


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
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, raws: Sequence[bytes]) -> None:
        """Add rollouts to the spool, durably (fsynced) before returning."""
        if not raws:
            return
        data = b"".join(_record(raw) for raw in raws)
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

    @contextlib.contextmanager
    def replay_session(self) -> Iterator[_ReplaySession | None]:
        """Hold the replay lock (None when another replay holds it) for one replay."""
        with _file_lock(self._replay_lock, blocking=False) as acquired:
            yield _ReplaySession(self) if acquired else None

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
                orjson.dumps({"reason": reason}) + b"\n" + _record(raw) for raw, reason in rejected
            )
            with open(self.rejected_path, "ab") as handle:
                handle.write(lines)
                handle.flush()
                os.fsync(handle.fileno())
        # Undelivered records go back before the renamed file goes: a crash in between
        # leaves them twice, which replays as a duplicate, never as a loss.
        self.append(undelivered)
        self.replaying.unlink(missing_ok=True)
        _fsync_dir(self.path.parent)


Outcome = Literal["delivered", "rejected", "failed"]


class _ReplaySession:
    """One replay, under the replay lock: take, deliver, finish; repeated a bounded time."""

    ROUNDS = 8  # appends may race a replay; a few rounds drain them, a bounded number

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.result = ReplayResult()

    def take(self) -> list[bytes]:
        """The next records to deliver ([] when the spool is empty)."""
        records, damaged = self.spool._take()
        self.result.damaged += damaged
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
        self.result.remaining += len(undelivered)
        self.spool._finish(undelivered, rejected)
        return not undelivered


def _batch_outcomes(body: dict[str, Any], n: int) -> list[tuple[Outcome, str]]:
    out: list[tuple[Outcome, str]] = []
    for result in body.get("results", [])[:n]:
        if result.get("status") in ("created", "duplicate"):
            out.append(("delivered", ""))
        else:
            error = result.get("error") or {}
            reason = f"{result.get('run_id')}: {error.get('code')}: {error.get('message')}"
            out.append(("rejected", reason))
    out.extend([("failed", "no result")] * (n - len(out)))
    return out


def _replay_outcomes(response: httpx.Response, n: int) -> list[tuple[Outcome, str]] | None:
    """Outcomes of `n` spooled rollouts posted as one batch; None: post them one by one."""
    if response.status_code == 207:
        return _batch_outcomes(_json(response), n)
    if response.status_code == 413:
        if n > 1:
            return None  # too big together
        body = _json(response)
        error = body.get("error", {}) if isinstance(body, dict) else {}
        return [("rejected", f"413 {error.get('code')}: {error.get('message')}")]
    # Refused whole for a reason that is not the rollouts' own (a wrong key, a wrong URL):
    # they stay spooled, and the caller hears about it.
    raise TracestoreHTTPError(response.status_code, _json(response))


# --- the clients ----------------------------------------------------------------------


class _Base:
    def __init__(
        self,
        *,
        max_retries: int,
        backoff: float,
        max_backoff: float,
        max_retry_time: float | None,
        gzip_above: int,
        spool: str | os.PathLike[str] | Spool | None,
        replay_on_contact: bool,
    ) -> None:
        self.retry = RetryPolicy(max_retries, backoff, max_backoff, max_retry_time)
        self.gzip_above = gzip_above
        self.spool = spool if isinstance(spool, Spool) or spool is None else Spool(spool)
        self.replay_on_contact = replay_on_contact

    def _spool_for(self, exc: Exception) -> Spool | None:
        """The spool a failed post goes to: only when the server could not take it."""
        if isinstance(exc, TracestoreHTTPError) and not is_retryable(exc.status):
            return None  # refused for good (conflict, invalid, ...): the caller must know
        return self.spool

    # Kept as attributes for callers of the first version of this client.
    @property
    def max_retries(self) -> int:
        """Most retries of one request."""
        return self.retry.max_retries

    @property
    def backoff(self) -> float:
        """First backoff window, in seconds (doubles per retry)."""
        return self.retry.backoff

    @property
    def max_backoff(self) -> float:
        """Largest backoff window, in seconds."""
        return self.retry.max_backoff


def _headers(api_key: str | None) -> dict[str, str]:
    return {"X-API-Key": api_key} if api_key else {}


class TracestoreClient(_Base):
    """Synchronous client; one keep-alive connection pool per instance (thread-safe)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_retry_time: float | None = 300.0,
        gzip_above: int = GZIP_ABOVE,
        spool: str | os.PathLike[str] | Spool | None = None,
        replay_on_contact: bool = True,
        event_hooks: dict[str, list[Callable[..., Any]]] | None = None,
    ) -> None:
        super().__init__(
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            max_retry_time=max_retry_time,
            gzip_above=gzip_above,
            spool=spool,
            replay_on_contact=replay_on_contact,
        )
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=_headers(api_key),
            timeout=timeout,
            event_hooks=event_hooks,
        )
        self._replaying = threading.Lock()

    def __enter__(self) -> TracestoreClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _send(self, path: str, body: bytes, content_type: str) -> httpx.Response:
        """POST with retries; returns the first non-retryable response or raises."""
        content, headers = _encode(body, self.gzip_above)
        headers["Content-Type"] = content_type
        attempts = _Attempts(self.retry)
        while True:
            try:
                response = self._http.post(path, content=content, headers=headers)
            except httpx.TransportError:
                delay = attempts.next_delay(None)
                if delay is None:
                    raise
            else:
                if not is_retryable(response.status_code):
                    return response
                delay = attempts.next_delay(response)
                if delay is None:
                    raise TracestoreHTTPError(response.status_code, _json(response))
            time.sleep(delay)

    def _contact(self) -> None:
        # The server answered: a good moment to deliver what waits in the spool.
        if self.spool is None or not self.replay_on_contact or not self.spool.has_pending():
            return
        try:
            self.replay()
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            log.warning("tracestore spool replay stopped: %s", exc)

    def post_rollout(self, rollout: Rollout) -> dict[str, Any]:
        """Post one rollout; returns the body for created/duplicate (or spooled), else raises."""
        raw = _raw(rollout)
        try:
            response = self._send("/v1/rollouts", raw, "application/json")
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            spool = self._spool_for(exc)
            if spool is None:
                raise
            spool.append([raw])
            return _spooled(raw, spool)
        body = _json(response)
        if response.status_code in (200, 201):
            self._contact()
            return dict(body)
        raise TracestoreHTTPError(response.status_code, body)

    def post_batch(self, rollouts: Sequence[Rollout]) -> dict[str, Any]:
        """Post rollouts as one NDJSON batch; returns the 207 body (results and summary)."""
        raws = [_raw(r) for r in rollouts]
        try:
            response = self._send("/v1/rollouts/batch", b"\n".join(raws), "application/x-ndjson")
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            spool = self._spool_for(exc)
            if spool is None:
                raise
            spool.append(raws)
            return _spooled_batch(raws, spool)
        body = _json(response)
        if response.status_code == 207:
            self._contact()
            return dict(body)
        raise TracestoreHTTPError(response.status_code, body)

    def get_rollout(self, run_id: str) -> Any:
        """The stored rollout, as received."""
        response = self._http.get(_rollout_path(run_id))
        if response.status_code != 200:
            raise TracestoreHTTPError(response.status_code, _json(response))
        return orjson.loads(response.content)

    def _deliver(self, records: list[bytes]) -> list[tuple[Outcome, str]]:
        try:
            response = self._send("/v1/rollouts/batch", b"\n".join(records), "application/x-ndjson")
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            return [("failed", str(exc))] * len(records)
        outcomes = _replay_outcomes(response, len(records))
        if outcomes is None:
            return [o for raw in records for o in self._deliver([raw])]
        return outcomes

    def replay(self) -> ReplayResult:
        """Deliver the spooled rollouts now; what is not delivered stays spooled."""
        if self.spool is None:
            return ReplayResult()
        if not self._replaying.acquire(blocking=False):
            return ReplayResult(busy=True)
        try:
            with self.spool.replay_session() as session:
                if session is None:
                    return ReplayResult(busy=True)
                for _round in range(session.ROUNDS):
                    records = session.take()
                    if not records:
                        break
                    outcomes: list[tuple[Outcome, str]] = []
                    try:
                        for batch in _batches(records):
                            outcomes.extend(self._deliver(batch))
                            if outcomes[-1][0] == "failed":
                                break  # the server went away again: keep the rest
                    finally:
                        outcomes.extend([("failed", "not tried")] * (len(records) - len(outcomes)))
                        complete = session.finish(records, outcomes)
                    if not complete:
                        break
                return session.result
        finally:
            self._replaying.release()


class AsyncTracestoreClient(_Base):
    """Asynchronous client (httpx.AsyncClient); the same behaviour as TracestoreClient."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_retry_time: float | None = 300.0,
        gzip_above: int = GZIP_ABOVE,
        spool: str | os.PathLike[str] | Spool | None = None,
        replay_on_contact: bool = True,
        event_hooks: dict[str, list[Callable[..., Any]]] | None = None,
    ) -> None:
        super().__init__(
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            max_retry_time=max_retry_time,
            gzip_above=gzip_above,
            spool=spool,
            replay_on_contact=replay_on_contact,
        )
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=_headers(api_key),
            timeout=timeout,
            event_hooks=event_hooks,
        )
        self._replaying = False

    async def __aenter__(self) -> AsyncTracestoreClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _send(self, path: str, body: bytes, content_type: str) -> httpx.Response:
        """POST with retries; returns the first non-retryable response or raises."""
        # Compressing a large body is CPU work: keep it off the event loop.
        content, headers = await asyncio.to_thread(_encode, body, self.gzip_above)
        headers["Content-Type"] = content_type
        attempts = _Attempts(self.retry)
        while True:
            try:
                response = await self._http.post(path, content=content, headers=headers)
            except httpx.TransportError:
                delay = attempts.next_delay(None)
                if delay is None:
                    raise
            else:
                if not is_retryable(response.status_code):
                    return response
                delay = attempts.next_delay(response)
                if delay is None:
                    raise TracestoreHTTPError(response.status_code, _json(response))
            await asyncio.sleep(delay)

    async def _contact(self) -> None:
        if self.spool is None or not self.replay_on_contact or not self.spool.has_pending():
            return
        try:
            await self.replay()
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            log.warning("tracestore spool replay stopped: %s", exc)

    async def post_rollout(self, rollout: Rollout) -> dict[str, Any]:
        """Post one rollout; returns the body for created/duplicate (or spooled), else raises."""
        raw = _raw(rollout)
        try:
            response = await self._send("/v1/rollouts", raw, "application/json")
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            spool = self._spool_for(exc)
            if spool is None:
                raise
            await asyncio.to_thread(spool.append, [raw])
            return _spooled(raw, spool)
        body = _json(response)
        if response.status_code in (200, 201):
            await self._contact()
            return dict(body)
        raise TracestoreHTTPError(response.status_code, body)

    async def post_batch(self, rollouts: Sequence[Rollout]) -> dict[str, Any]:
        """Post rollouts as one NDJSON batch; returns the 207 body (results and summary)."""
        raws = [_raw(r) for r in rollouts]
        try:
            response = await self._send(
                "/v1/rollouts/batch", b"\n".join(raws), "application/x-ndjson"
            )
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            spool = self._spool_for(exc)
            if spool is None:
                raise
            await asyncio.to_thread(spool.append, raws)
            return _spooled_batch(raws, spool)
        body = _json(response)
        if response.status_code == 207:
            await self._contact()
            return dict(body)
        raise TracestoreHTTPError(response.status_code, body)

    async def get_rollout(self, run_id: str) -> Any:
        """The stored rollout, as received."""
        response = await self._http.get(_rollout_path(run_id))
        if response.status_code != 200:
            raise TracestoreHTTPError(response.status_code, _json(response))
        return orjson.loads(response.content)

    async def _deliver(self, records: list[bytes]) -> list[tuple[Outcome, str]]:
        try:
            response = await self._send(
                "/v1/rollouts/batch", b"\n".join(records), "application/x-ndjson"
            )
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            return [("failed", str(exc))] * len(records)
        outcomes = _replay_outcomes(response, len(records))
        if outcomes is None:
            return [o for raw in records for o in await self._deliver([raw])]
        return outcomes

    async def replay(self) -> ReplayResult:
        """Deliver the spooled rollouts now; what is not delivered stays spooled."""
        if self.spool is None:
            return ReplayResult()
        if self._replaying:
            return ReplayResult(busy=True)
        self._replaying = True
        try:
            # Taking the replay lock never blocks (LOCK_NB); file reads and fsyncs run in a
            # worker thread, off the event loop.
            with self.spool.replay_session() as session:
                if session is None:
                    return ReplayResult(busy=True)
                for _round in range(session.ROUNDS):
                    records = await asyncio.to_thread(session.take)
                    if not records:
                        break
                    outcomes: list[tuple[Outcome, str]] = []
                    try:
                        for batch in _batches(records):
                            outcomes.extend(await self._deliver(batch))
                            if outcomes[-1][0] == "failed":
                                break  # the server went away again: keep the rest
                    finally:
                        outcomes.extend([("failed", "not tried")] * (len(records) - len(outcomes)))
                        complete = await asyncio.to_thread(session.finish, records, outcomes)
                    if not complete:
                        break
                return session.result
        finally:
            self._replaying = False
