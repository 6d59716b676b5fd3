"""The sync and async clients: one behaviour, written once, run by two drivers.

Both post single rollouts and batches (gzip above a size), retry connection errors, 429,
503 and other 5xx (see retry.py), treat `duplicate` as success and surface `conflict`
and other 4xx at once. They read too (a rollout, its trace or trajectories, the runs of a
cid, the run list with its filters, drift): reads are retried like posts (they change
nothing), and a 404 or other refusal raises TracestoreHTTPError. A rollout holding NaN or
Infinity raises NonFiniteNumberError before anything is sent.

With a spool, a rollout the server could not take (down, or still overloaded when the
retries ran out) is written to the spool, fsynced, and reported as `"status": "spooled"`;
the spool is replayed on the next successful contact with the server, or by `replay()`.

How one behaviour serves both: every operation is a generator (a "flow") that yields
what it needs done (an HTTP request, a sleep, blocking file or CPU work) and receives
the result. `TracestoreClient` runs a flow with plain calls, `AsyncTracestoreClient`
with awaits (blocking work in a worker thread, off the event loop). The decisions
(retries, spooling, replay) therefore exist once, and the two clients cannot drift apart.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, TypeAlias, TypeVar

import httpx

from tracestore_client.encoding import Rollout, encode_rollout, loads, run_id_of
from tracestore_client.errors import TracestoreHTTPError, UnexpectedAnswer, response_body
from tracestore_client.retry import Attempts, RetryPolicy, describe_error, is_retryable
from tracestore_client.spool import NOT_TRIED, Outcome, ReplayResult, Spool, batches

log = logging.getLogger("tracestore.client")

GZIP_ABOVE = 64 * 1024
_JSON = "application/json"
_NDJSON = "application/x-ndjson"


def path_segment(value: str) -> str:
    """`value` quoted as one URL path segment ('/' escaped; '.' and '..' kept literal)."""
    quoted = urllib.parse.quote(value, safe="")
    # URL normalisation (httpx's too) resolves a bare '.' or '..' segment; escaped dots
    # are not dot segments, and the server decodes them back.
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def _rollout_path(run_id: str) -> str:
    if not run_id:
        # "/v1/rollouts/" is the list's address (a 307 to it, with no message).
        raise ValueError("run_id is empty: a run has a non-empty run_id")
    return "/v1/rollouts/" + path_segment(run_id)


@dataclass(frozen=True, slots=True)
class RunFilters:
    """The filters of GET /v1/rollouts (each optional; see the server's README)."""

    correlation_id: str | None = None
    env_id: str | None = None
    policy_id: str | None = None
    # An ISO date or time, a duration back from now (`7d`), or an aware datetime.
    since: str | datetime | None = None
    until: str | datetime | None = None
    trace_kind: str | None = None
    has_trajectories: bool | None = None
    has_drift: bool | None = None

    def params(self) -> dict[str, str]:
        """The filters that are set, as query parameters."""
        out: dict[str, str] = {}
        for name, value in asdict(self).items():
            if value is None:
                continue
            if isinstance(value, bool):
                out[name] = "true" if value else "false"
            elif isinstance(value, datetime):
                out[name] = value.isoformat()
            else:
                out[name] = str(value)
        return out


def _filters(filters: RunFilters | Mapping[str, Any] | None) -> RunFilters:
    if filters is None:
        return RunFilters()
    if isinstance(filters, RunFilters):
        return filters
    return RunFilters(**filters)  # an unknown name is a TypeError here, before any request


def _encode(body: bytes, gzip_above: int) -> tuple[bytes, dict[str, str]]:
    if len(body) > gzip_above:
        return gzip.compress(body, compresslevel=5), {"Content-Encoding": "gzip"}
    return body, {}


def _stored(body: Any) -> bool:
    """Whether a success's body is tracestore's answer to a stored rollout."""
    return isinstance(body, dict) and body.get("status") in ("created", "duplicate")


def _spooled(raw: bytes, spool: Spool) -> dict[str, Any]:
    return {"run_id": run_id_of(raw), "status": "spooled", "spool": str(spool.path)}


def _spooled_batch(raws: list[bytes], spool: Spool) -> dict[str, Any]:
    results = [{"index": i, **_spooled(raw, spool)} for i, raw in enumerate(raws)]
    return {"results": results, "summary": {"total": len(raws), "spooled": len(raws)}}


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
        return _batch_outcomes(response_body(response), n)
    if response.status_code == 413:
        if n > 1:
            return None  # too big together
        body = response_body(response)
        error = body.get("error", {}) if isinstance(body, dict) else {}
        return [("rejected", f"413 {error.get('code')}: {error.get('message')}")]
    # Refused whole for a reason that is not the rollouts' own (a wrong key, a wrong URL):
    # they stay spooled, and the caller hears about it.
    raise TracestoreHTTPError(response.status_code, response_body(response))


# --- what a flow asks its driver to do --------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str
    content: bytes | None = None
    headers: dict[str, str] | None = None
    params: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class _Blocking:
    """File or CPU work: run in place by the sync driver, in a thread by the async one."""

    call: Callable[[], Any]


_T = TypeVar("_T")
_Op: TypeAlias = _Request | _Sleep | _Blocking
# Yields operations, is sent each one's result (or has its exception thrown in), returns T.
_Flow: TypeAlias = Generator[_Op, Any, _T]


class _Core:
    """Settings and the flows shared by both clients (see the module docstring)."""

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
        # One replay at a time per client; a non-blocking try, so never held across an
        # await by one task while another waits on it.
        self._replaying = threading.Lock()

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

    def _send(self, path: str, body: bytes, content_type: str) -> _Flow[httpx.Response]:
        """POST with retries; returns the first non-retryable response or raises."""
        if len(body) > self.gzip_above:
            # Compressing a large body is CPU work: off the event loop in the async client.
            content, headers = yield _Blocking(functools.partial(_encode, body, self.gzip_above))
        else:
            content, headers = body, {}
        headers["Content-Type"] = content_type
        attempts = Attempts(self.retry, f"POST {path}")
        while True:
            try:
                response: httpx.Response = yield _Request("POST", path, content, headers)
            except httpx.TransportError as exc:
                delay = attempts.after_error(exc)
                if delay is None:
                    raise
            else:
                if not is_retryable(response.status_code):
                    return response
                delay = attempts.after_response(response)
                if delay is None:
                    raise TracestoreHTTPError(response.status_code, response_body(response))
            yield _Sleep(delay)

    def _spool_for(self, exc: Exception) -> Spool | None:
        """The spool a failed post goes to: only when the server could not take it."""
        if isinstance(exc, UnexpectedAnswer):
            return self.spool  # not stored: kept until a tracestore server takes it
        if isinstance(exc, TracestoreHTTPError) and not is_retryable(exc.status):
            return None  # refused for good (conflict, invalid, ...): the caller must know
        return self.spool

    def _spool_write(self, spool: Spool, raws: list[bytes], exc: Exception) -> _Flow[None]:
        yield _Blocking(functools.partial(spool.append, raws))
        what = f"rollout {run_id_of(raws[0])!r}" if len(raws) == 1 else f"{len(raws)} rollouts"
        log.warning(
            "tracestore: the server could not take %s (%s); spooled to %s",
            what,
            describe_error(exc),
            spool.path,
            extra={"spool": str(spool.path), "rollouts": len(raws), "reason": describe_error(exc)},
        )

    def _contact(self) -> _Flow[None]:
        # The server answered: a good moment to deliver what waits in the spool.
        if self.spool is None or not self.replay_on_contact or not self.spool.has_pending():
            return
        try:
            yield from self._replay()
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            log.warning("tracestore spool %s: replay stopped: %s", self.spool.path, exc)

    def _post_rollout(self, rollout: Rollout) -> _Flow[dict[str, Any]]:
        raw = encode_rollout(rollout)
        try:
            response = yield from self._send("/v1/rollouts", raw, _JSON)
            body = response_body(response)
            if response.status_code in (200, 201) and not _stored(body):
                raise UnexpectedAnswer(response, "answer to a rollout")
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            spool = self._spool_for(exc)
            if spool is None:
                raise
            yield from self._spool_write(spool, [raw], exc)
            return _spooled(raw, spool)
        if response.status_code in (200, 201):
            yield from self._contact()
            return dict(body)
        raise TracestoreHTTPError(response.status_code, body)

    def _post_batch(self, rollouts: Sequence[Rollout]) -> _Flow[dict[str, Any]]:
        # Every rollout is checked before the first byte goes out.
        raws = [encode_rollout(r, index=i) for i, r in enumerate(rollouts)]
        try:
            response = yield from self._send("/v1/rollouts/batch", b"\n".join(raws), _NDJSON)
            body = response_body(response)
            if 200 <= response.status_code < 300 and not (
                isinstance(body, dict) and isinstance(body.get("results"), list)
            ):
                raise UnexpectedAnswer(response, "answer to a batch")
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            spool = self._spool_for(exc)
            if spool is None:
                raise
            yield from self._spool_write(spool, raws, exc)
            return _spooled_batch(raws, spool)
        if response.status_code == 207:
            yield from self._contact()
            return dict(body)
        raise TracestoreHTTPError(response.status_code, body)

    def _get(self, path: str, params: dict[str, str] | None = None) -> _Flow[httpx.Response]:
        """GET with the posts' retries (a read changes nothing); a 200 or raises."""
        attempts = Attempts(self.retry, f"GET {path}")
        while True:
            try:
                response: httpx.Response = yield _Request("GET", path, params=params)
            except httpx.TransportError as exc:
                delay = attempts.after_error(exc)
                if delay is None:
                    raise
            else:
                if response.status_code == 200:
                    return response
                if not is_retryable(response.status_code):
                    raise TracestoreHTTPError(response.status_code, response_body(response))
                delay = attempts.after_response(response)
                if delay is None:
                    raise TracestoreHTTPError(response.status_code, response_body(response))
            yield _Sleep(delay)

    def _get_json(self, path: str, params: dict[str, str] | None = None) -> _Flow[Any]:
        response = yield from self._get(path, params)
        try:
            # Large documents parse off the event loop in the async client.
            return (yield _Blocking(functools.partial(loads, response.content)))
        except json.JSONDecodeError:  # a 200 that is not JSON: not tracestore answering
            raise UnexpectedAnswer(response, "JSON") from None

    def _get_rollout(self, run_id: str) -> _Flow[Any]:
        return (yield from self._get_json(_rollout_path(run_id)))

    def _get_rollout_bytes(self, run_id: str) -> _Flow[bytes]:
        response = yield from self._get(_rollout_path(run_id))
        # tracestore serves a rollout as JSON: a sign-in page is not the rollout's bytes.
        if "json" not in response.headers.get("content-type", ""):
            raise UnexpectedAnswer(response, "rollout (JSON)")
        return response.content

    def _get_part(self, run_id: str, part: str) -> _Flow[Any]:
        return (yield from self._get_json(_rollout_path(run_id) + "/" + part))

    def _find_by_cid(self, cid: str) -> _Flow[dict[str, Any]]:
        body = yield from self._get_json("/v1/correlations/" + path_segment(cid))
        return dict(body)

    def _list_runs(
        self, filters: RunFilters, limit: int, cursor: str | None
    ) -> _Flow[dict[str, Any]]:
        params = {**filters.params(), "limit": str(limit)}
        if cursor is not None:
            params["cursor"] = cursor
        body = yield from self._get_json("/v1/rollouts", params)
        return dict(body)

    def _drift_report(self, params: dict[str, str]) -> _Flow[dict[str, Any]]:
        body = yield from self._get_json("/v1/drift/report", params)
        return dict(body)

    def _info(self) -> _Flow[dict[str, Any]]:
        body = yield from self._get_json("/info")
        return dict(body)

    def _deliver(self, records: list[bytes]) -> _Flow[list[tuple[Outcome, str]]]:
        try:
            response = yield from self._send("/v1/rollouts/batch", b"\n".join(records), _NDJSON)
        except (httpx.TransportError, TracestoreHTTPError) as exc:
            return [("failed", describe_error(exc))] * len(records)
        outcomes = _replay_outcomes(response, len(records))
        if outcomes is None:
            outcomes = []
            for raw in records:
                outcomes += yield from self._deliver([raw])
        return outcomes

    def _replay(self) -> _Flow[ReplayResult]:
        if self.spool is None:
            return ReplayResult()
        if not self._replaying.acquire(blocking=False):
            return ReplayResult(busy=True)
        try:
            # Taking the replay lock never blocks (LOCK_NB).
            with self.spool.replay_session() as session:
                if session is None:
                    return ReplayResult(busy=True)
                started = time.monotonic()
                for _round in range(session.ROUNDS):
                    records: list[bytes] = yield _Blocking(session.take)
                    if not records:
                        break
                    log.info(
                        "tracestore spool %s: replaying %d rollouts",
                        self.spool.path,
                        len(records),
                        extra={"spool": str(self.spool.path), "rollouts": len(records)},
                    )
                    outcomes: list[tuple[Outcome, str]] = []
                    try:
                        for batch in batches(records):
                            outcomes += yield from self._deliver(batch)
                            if outcomes[-1][0] == "failed":
                                break  # the server went away again: keep the rest
                    finally:
                        outcomes += [("failed", NOT_TRIED)] * (len(records) - len(outcomes))
                        finish = functools.partial(session.finish, records, outcomes)
                        complete: bool = yield _Blocking(finish)
                    if not complete:
                        break
                _log_replay(self.spool, session.result, time.monotonic() - started)
                return session.result
        finally:
            self._replaying.release()


def _log_replay(spool: Spool, result: ReplayResult, seconds: float) -> None:
    if not (result.delivered or result.rejected or result.remaining):
        return
    extra = {
        "spool": str(spool.path),
        "delivered": result.delivered,
        "rejected": result.rejected,
        "remaining": result.remaining,
    }
    if result.remaining:
        log.warning(
            "tracestore spool %s: replay delivered %d, rejected %d in %.1f s; "
            "%d rollouts stay spooled (%s)",
            spool.path,
            result.delivered,
            result.rejected,
            seconds,
            result.remaining,
            result.stopped,
            extra=extra,
        )
    else:
        log.info(
            "tracestore spool %s: replay delivered %d, rejected %d in %.1f s; spool empty",
            spool.path,
            result.delivered,
            result.rejected,
            seconds,
            extra=extra,
        )


def _headers(api_key: str | None) -> dict[str, str]:
    return {"X-API-Key": api_key} if api_key else {}


class TracestoreClient(_Core):
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

    def __enter__(self) -> TracestoreClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _do(self, op: _Op) -> Any:
        if isinstance(op, _Request):
            return self._http.request(
                op.method, op.path, content=op.content, headers=op.headers, params=op.params
            )
        if isinstance(op, _Sleep):
            time.sleep(op.seconds)
            return None
        return op.call()

    def _run(self, flow: _Flow[_T]) -> _T:
        """Run a flow to its end with plain calls."""
        sent: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = flow.send(sent) if error is None else flow.throw(error)
            except StopIteration as stop:
                result: _T = stop.value
                return result
            sent, error = None, None
            try:
                sent = self._do(op)
            except BaseException as exc:  # the flow decides (retry, spool or re-raise)
                error = exc

    def post_rollout(self, rollout: Rollout) -> dict[str, Any]:
        """Post one rollout; returns the body for created/duplicate (or spooled), else raises."""
        return self._run(self._post_rollout(rollout))

    def post_batch(self, rollouts: Sequence[Rollout]) -> dict[str, Any]:
        """Post rollouts as one NDJSON batch; returns the 207 body (results and summary)."""
        return self._run(self._post_batch(rollouts))

    def get_rollout(self, run_id: str) -> Any:
        """The stored rollout, as received (parsed)."""
        return self._run(self._get_rollout(run_id))

    def get_rollout_bytes(self, run_id: str) -> bytes:
        """The stored rollout's bytes, exactly as received."""
        return self._run(self._get_rollout_bytes(run_id))

    def get_trace(self, run_id: str) -> Any:
        """The run's v3 trace (full shape): stored, or converted from its trajectories."""
        return self._run(self._get_part(run_id, "trace"))

    def get_trajectories(self, run_id: str) -> Any:
        """The run's legacy trajectories: stored, or converted from its trace."""
        return self._run(self._get_part(run_id, "trajectories"))

    def get_drift(self, run_id: str) -> dict[str, Any]:
        """The run's drift check and findings."""
        return dict(self._run(self._get_part(run_id, "drift")))

    def find_by_cid(self, cid: str) -> dict[str, Any]:
        """Every run of a correlation id: `{correlation_id, matched_correlation_id, runs}`."""
        return self._run(self._find_by_cid(cid))

    def list_runs(
        self,
        filters: RunFilters | Mapping[str, Any] | None = None,
        *,
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of run summaries, newest first: `{items, next_cursor}`."""
        return self._run(self._list_runs(_filters(filters), limit, cursor))

    def iter_runs(
        self, filters: RunFilters | Mapping[str, Any] | None = None, *, page_size: int = 100
    ) -> Iterator[dict[str, Any]]:
        """Every run summary matching `filters`, newest first, following the cursor."""
        f, cursor = _filters(filters), None
        while True:
            page = self._run(self._list_runs(f, page_size, cursor))
            yield from page["items"]
            cursor = page.get("next_cursor")
            if cursor is None:
                return

    def drift_report(self, **params: str) -> dict[str, Any]:
        """The drift report's data (GET /v1/drift/report; its query parameters)."""
        return self._run(self._drift_report(params))

    def info(self) -> dict[str, Any]:
        """The server's version, backend and limits (GET /info; open without a key)."""
        return self._run(self._info())

    def replay(self) -> ReplayResult:
        """Deliver the spooled rollouts now; what is not delivered stays spooled."""
        return self._run(self._replay())


class AsyncTracestoreClient(_Core):
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

    async def __aenter__(self) -> AsyncTracestoreClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _do(self, op: _Op) -> Any:
        if isinstance(op, _Request):
            return await self._http.request(
                op.method, op.path, content=op.content, headers=op.headers, params=op.params
            )
        if isinstance(op, _Sleep):
            await asyncio.sleep(op.seconds)
            return None
        # File reads, fsyncs and compression run in a worker thread, off the event loop.
        return await asyncio.to_thread(op.call)

    async def _run(self, flow: _Flow[_T]) -> _T:
        """Run a flow to its end with awaits."""
        sent: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = flow.send(sent) if error is None else flow.throw(error)
            except StopIteration as stop:
                result: _T = stop.value
                return result
            sent, error = None, None
            try:
                sent = await self._do(op)
            except BaseException as exc:  # cancellation too: the flow's cleanup runs
                error = exc

    async def post_rollout(self, rollout: Rollout) -> dict[str, Any]:
        """Post one rollout; returns the body for created/duplicate (or spooled), else raises."""
        return await self._run(self._post_rollout(rollout))

    async def post_batch(self, rollouts: Sequence[Rollout]) -> dict[str, Any]:
        """Post rollouts as one NDJSON batch; returns the 207 body (results and summary)."""
        return await self._run(self._post_batch(rollouts))

    async def get_rollout(self, run_id: str) -> Any:
        """The stored rollout, as received (parsed)."""
        return await self._run(self._get_rollout(run_id))

    async def get_rollout_bytes(self, run_id: str) -> bytes:
        """The stored rollout's bytes, exactly as received."""
        return await self._run(self._get_rollout_bytes(run_id))

    async def get_trace(self, run_id: str) -> Any:
        """The run's v3 trace (full shape): stored, or converted from its trajectories."""
        return await self._run(self._get_part(run_id, "trace"))

    async def get_trajectories(self, run_id: str) -> Any:
        """The run's legacy trajectories: stored, or converted from its trace."""
        return await self._run(self._get_part(run_id, "trajectories"))

    async def get_drift(self, run_id: str) -> dict[str, Any]:
        """The run's drift check and findings."""
        return dict(await self._run(self._get_part(run_id, "drift")))

    async def find_by_cid(self, cid: str) -> dict[str, Any]:
        """Every run of a correlation id: `{correlation_id, matched_correlation_id, runs}`."""
        return await self._run(self._find_by_cid(cid))

    async def list_runs(
        self,
        filters: RunFilters | Mapping[str, Any] | None = None,
        *,
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of run summaries, newest first: `{items, next_cursor}`."""
        return await self._run(self._list_runs(_filters(filters), limit, cursor))

    async def iter_runs(
        self, filters: RunFilters | Mapping[str, Any] | None = None, *, page_size: int = 100
    ) -> AsyncIterator[dict[str, Any]]:
        """Every run summary matching `filters`, newest first, following the cursor."""
        f, cursor = _filters(filters), None
        while True:
            page = await self._run(self._list_runs(f, page_size, cursor))
            for item in page["items"]:
                yield item
            cursor = page.get("next_cursor")
            if cursor is None:
                return

    async def drift_report(self, **params: str) -> dict[str, Any]:
        """The drift report's data (GET /v1/drift/report; its query parameters)."""
        return await self._run(self._drift_report(params))

    async def info(self) -> dict[str, Any]:
        """The server's version, backend and limits (GET /info; open without a key)."""
        return await self._run(self._info())

    async def replay(self) -> ReplayResult:
        """Deliver the spooled rollouts now; what is not delivered stays spooled."""
        return await self._run(self._replay())
