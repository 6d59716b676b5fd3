"""When to retry, how long to wait, and the log line of every retry: one policy, both clients.

Connection errors, 429 and every 5xx are retried with capped exponential backoff and full
jitter, never sooner than a `Retry-After`; a call stops after `max_retries` retries or
`max_time` seconds, whichever comes first.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import time
from dataclasses import dataclass

import httpx

from tracestore_client.errors import response_body

log = logging.getLogger("tracestore.client")

# 429 and every 5xx are retried; these are the ones a tracestore server sends.
RETRY_STATUSES = frozenset((429, 500, 502, 503, 504))


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
    # Wall-clock budget for one call's attempts and waits (None: no budget), checked
    # between attempts: an attempt in progress is bounded by the client's timeout for each
    # network wait only (docs/RELIABILITY.md).
    max_time: float | None = 300.0

    def delay(self, attempt: int, asked: float | None) -> float:
        """Seconds to wait before retry number `attempt` + 1."""
        # Full jitter spreads the retries of many clients after an outage; on top of a
        # Retry-After it keeps them from all coming back in the same instant.
        jitter = random.uniform(0.0, min(self.max_backoff, self.backoff * 2**attempt))
        return jitter if asked is None else asked + jitter


def describe_error(exc: BaseException) -> str:
    """`ConnectError: [Errno 111] Connection refused`: an exception in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def describe_response(response: httpx.Response) -> str:
    """`503 database_busy`: a refusal in a few words."""
    body = response_body(response)
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return f"{response.status_code} {code or response.reason_phrase}".rstrip()


class Attempts:
    """One call's retry budget under a policy; logs each retry and the giving up.

    The caller tries, then asks `after_error` or `after_response` what to do: a delay to
    sleep before trying again, or None when the budget is spent (the caller raises).
    """

    def __init__(self, policy: RetryPolicy, what: str) -> None:
        self.policy = policy
        self.what = what  # "POST /v1/rollouts": what the log lines name
        self.retries = 0
        self.started = time.monotonic()
        self.deadline = None if policy.max_time is None else self.started + policy.max_time

    def after_error(self, exc: httpx.TransportError) -> float | None:
        """The wait before retrying after a connection error, or None: give up."""
        return self._next(describe_error(exc), None)

    def after_response(self, response: httpx.Response) -> float | None:
        """The wait before retrying after a retryable status, or None: give up."""
        asked = retry_after(response)
        reason = describe_response(response)
        if asked is not None:
            reason += f", Retry-After {asked:g} s"
        return self._next(reason, asked)

    def _next(self, reason: str, asked: float | None) -> float | None:
        attempt = self.retries + 1  # the attempt that just failed
        delay: float | None = None
        if self.retries < self.policy.max_retries:
            delay = self.policy.delay(self.retries, asked)
            if self.deadline is not None and time.monotonic() + delay > self.deadline:
                delay = None
        extra = {"attempt": attempt, "reason": reason, "wait_s": delay}
        if delay is None:
            log.warning(
                "tracestore %s: giving up after %d attempt%s in %.1f s: %s",
                self.what,
                attempt,
                "" if attempt == 1 else "s",
                time.monotonic() - self.started,
                reason,
                extra=extra,
            )
            return None
        self.retries += 1
        log.warning(
            "tracestore %s: attempt %d failed (%s); retrying in %.2f s",
            self.what,
            attempt,
            reason,
            delay,
            extra=extra,
        )
        return delay
