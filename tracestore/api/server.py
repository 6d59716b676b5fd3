"""How `tracestore serve` runs uvicorn: request heads bounded in size and time, and refused
uploads answered rather than reset.

uvicorn's httptools protocol (its default) takes a request line and headers of any size:
an 8 MB header line was accepted, and eight unfinished 64 MiB header lines took a worker
from 140 to 644 MiB. Its keep-alive timeout stops at a request's first byte, so a head sent
slowly (or a connection that never sends one) is held forever. And when the app closes a
connection whose request body has not all arrived (a 503 `overloaded`, a 408, ...), the
socket is closed with unread bytes in it: the kernel answers the client's next bytes with a
reset, and a client that sends its whole body before reading (most do) sees the reset, not
the answer. `GuardedHttpToolsProtocol` adds, per connection:

- a limit on the request line plus headers (`TRACESTORE_MAX_HEADER_BYTES`): past it, 431
  and the connection closes; the head is never held past the limit plus one read;
- a deadline for them (`TRACESTORE_HEADER_TIMEOUT`), from the connection's opening or its
  previous answer: past it, 408 (or, before any byte, a silent close);
- a lingering close: when the connection is closed before its request body has all
  arrived, the server first finishes its answer and a FIN, then reads and drops what the
  client still sends, for up to LINGER_IDLE_S between reads and LINGER_TOTAL_S in all,
  before it closes. Nothing dropped is kept.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import os
import shutil
import signal
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import orjson
import uvicorn
from fastapi import FastAPI
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState
from uvicorn.supervisors import Multiprocess

from tracestore.metrics import MULTIPROC_ENV
from tracestore.orphans import when_orphaned
from tracestore.settings import Settings

# How long a closing connection keeps reading (and dropping) the rest of a refused body:
# at most this long between two reads, and this long in all (nginx's lingering_timeout
# and lingering_time).
LINGER_IDLE_S = 5.0
LINGER_TOTAL_S = 30.0
# Seconds before uvicorn's supervisor takes a silent worker for hung (see uvicorn_options).
WORKER_HEALTHCHECK_S = 60
# The supervisor's pid, for its workers (set by run_server; internal, not a setting).
SUPERVISOR_ENV = "TRACESTORE_SERVE_SUPERVISOR_PID"
# How long an orphaned worker's graceful shutdown may take (requests in flight) before it
# ends at once: nobody else would end it.
ORPHAN_GRACE_S = 30.0


@functools.cache
def _limits() -> tuple[int, float]:
    # Workers are separate processes started from the same environment (`tracestore
    # serve` exports the database URL): read the settings once per process.
    settings = Settings()
    return settings.max_header_bytes, settings.header_timeout


def _error_response(status: int, reason: bytes, code: str, message: str) -> bytes:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, reason),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class _ClosingTransport:
    """The transport as one request's cycle sees it: its close lingers (see above), and
    its answer's head goes out with the first piece of its body."""

    def __init__(self, protocol: GuardedHttpToolsProtocol, cycle: RequestResponseCycle) -> None:
        self._protocol = protocol
        self._cycle = cycle
        self._transport = protocol.transport
        self._head: bytes | None = None  # the answer's status line and headers, held
        self._wrote = False

    def write(self, data: bytes) -> None:
        """Write to the connection; the answer's head waits for its body's first piece.

        uvicorn writes the head and the body apart: two sends, two packets, for an
        answer of a few hundred bytes (bench/README.md item 14). Only the head is held
        (the first write once the answer started: never a `100 Continue`). uvicorn
        writes the body of every answer but a HEAD's, even an empty one: a HEAD's head
        goes at once.
        """
        if not self._wrote:
            self._wrote = True
            cycle = self._cycle
            if cycle.response_started and cycle.scope["method"] != "HEAD":
                self._head = data
                return
        if self._head is not None:
            data, self._head = self._head + data, None
        self._transport.write(data)

    def flush(self) -> None:
        """Send a head still held (the connection closes before the body went)."""
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def is_closing(self) -> bool:
        """True once the connection is closing."""
        return self._transport.is_closing()

    def close(self) -> None:
        """Close, lingering when the request's body has not all arrived."""
        self.flush()
        self._protocol.close_after_answer(unread_body=self._cycle.more_body)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded request heads and a lingering close."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_head, self.head_timeout = _limits()
        self._in_head = True  # the next bytes belong to a request's line and headers
        self._head_bytes = 0  # how many of them came so far
        self._heads = 0  # heads completed on this connection
        self._head_size = 0  # the current head's target and header lines, as parsed
        self._head_too_large = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._lingering = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._linger_deadline = 0.0

    # --- the head -------------------------------------------------------------------------

    # uvicorn's own override takes asyncio.Transport where asyncio says BaseTransport.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the deadline for the first request's head."""
        super().connection_made(transport)
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self._lingering:
            return
        if self._in_head and self._head_bytes:
            message = f"the request line and headers took more than {self.head_timeout:g} s"
            self._refuse(408, b"Request Timeout", "request_timeout", message)
        else:
            # Idle before any byte of a request, or still sending a body nobody reads.
            self.close_after_answer(unread_body=not self._in_head)

    def data_received(self, data: bytes) -> None:
        """Feed the parser; count the bytes of an unfinished head; drop data while lingering."""
        if self._lingering:
            self._dropped()
            return
        in_head, heads = self._in_head, self._heads
        super().data_received(data)
        if (
            in_head
            and self._in_head
            and self._heads == heads
            and not self.transport.is_closing()
            and not self._lingering  # refused while parsing (send_400_response)
        ):
            # All of `data` went into one request head that is still open.
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head:
                self._refuse_head_too_large()

    def on_message_begin(self) -> None:
        """A new request: its head's size counts from nothing."""
        super().on_message_begin()
        self._head_size = 0
        self._head_too_large = False

    def on_url(self, url: bytes) -> None:
        """Count the target against the head's bound."""
        super().on_url(url)
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count the header line against the head's bound."""
        super().on_header(name, value)
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF

    def _count_head(self, size: int) -> None:
        # data_received counts only a head still open after a read: one that arrives whole
        # in a read or two (a 100 KB header) was never counted, and the app took it. The
        # parser calls these as it reads: past the bound, stop it; send_400_response (which
        # uvicorn calls for any parser error) answers 431.
        self._head_size += size
        if self._head_size > self.max_head:
            self._head_too_large = True
            raise ValueError("request head too large")

    def send_400_response(self, msg: str) -> None:
        """Answer a request the parser refused as every error is answered (JSON): 431 for
        a head past its bound, else 400 (uvicorn's is text/plain)."""
        if self._head_too_large:
            self._refuse_head_too_large()
        else:
            message = "the request is not valid HTTP/1.1"
            self._refuse(400, b"Bad Request", "bad_request", message)

    def on_headers_complete(self) -> None:
        """The head is whole: stop its clock and count; the app takes it from here."""
        self._heads += 1
        self._in_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = cast(asyncio.Transport, _ClosingTransport(self, self.cycle))

    def on_message_complete(self) -> None:
        """The request is whole: the next bytes start a new head."""
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        """After an answer, the next request's head has its own deadline."""
        super().on_response_complete()
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing() and not self._lingering:
            self._arm_head_timer()

    def _refuse_head_too_large(self) -> None:
        message = f"the request line and headers exceed {self.max_head} bytes"
        self._refuse(431, b"Request Header Fields Too Large", "headers_too_large", message)

    def _refuse(self, status: int, reason: bytes, code: str, message: str) -> None:
        self.logger.warning("refused a request head: %s", message)
        self.transport.write(_error_response(status, reason, code, message))
        self.close_after_answer(unread_body=True)

    # --- closing --------------------------------------------------------------------------

    def close_after_answer(self, *, unread_body: bool) -> None:
        """Close the connection; first linger when the client may still be sending."""
        if self.transport.is_closing() or self._lingering:
            return
        if not unread_body or not self.transport.can_write_eof():
            self.transport.close()
            return
        # The answer, then a FIN; what the client still sends is read and dropped, so its
        # kernel never turns our close into a reset that destroys the answer.
        self._lingering = True
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        self.transport.write_eof()
        self.flow.resume_reading()
        self._linger_deadline = self.loop.time() + LINGER_TOTAL_S
        self._dropped()

    def _dropped(self) -> None:
        # Data came (or lingering began): wait LINGER_IDLE_S more, within the total.
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        left = self._linger_deadline - self.loop.time()
        self._linger_timer = self.loop.call_later(
            max(0.0, min(LINGER_IDLE_S, left)), self.transport.close
        )

    def eof_received(self) -> None:
        """The client finished sending: a lingering connection closes now."""
        if self._lingering:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the connection's clocks."""
        self._cancel_head_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)


# --- one listening socket per worker -------------------------------------------------------
#
# uvicorn's workers share the one socket the supervisor binds, and each accepts as many
# connections as are waiting whenever it wakes: 32 clients connecting at once went 31 to
# one worker and 1 to the other, and kept-alive connections stay where they landed, so
# `--workers 2` served a task app's posts on one core (bench/README.md item 14). Here the
# supervisor only reserves the address (bound, never listening) and each worker listens on
# a socket of its own bound to it with SO_REUSEPORT: the kernel spreads new connections
# over the workers' sockets by their address hash.


class _WorkerListeners(socket.socket):
    """The supervisor's socket: it holds the address; a worker that receives it (pickled
    into the worker process) gets a new socket of its own on that address instead."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_worker_socket, (self.family, self.getsockname()))


def _reuse_port(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)


def _worker_socket(family: int, address: Any) -> socket.socket:
    """A worker's own socket on `address` (its event loop listens on it)."""
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    _reuse_port(sock)
    sock.bind(address)
    return sock


def check_address(host: str, port: int) -> int:
    """The address family of `host:port` once a bind there has worked, as the server will
    bind it (asyncio's create_server: every address the name resolves to, IPv6 ones
    IPv6-only); OSError when one is taken (EADDRINUSE), not this machine's, or the name
    does not resolve."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    for family, kind, proto, _name, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            probe.bind(address)
    return int(infos[0][0])


def reserve_address(host: str, port: int) -> socket.socket:
    """The supervisor's socket for `host:port` (OSError when the address is taken).

    A plain bind first: SO_REUSEPORT alone would let a second tracestore server start on
    the port of a running one and share its connections.
    """
    family = check_address(host, port)
    sock = _WorkerListeners(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    _reuse_port(sock)
    sock.bind((host, port))
    return sock


def run_server(
    *, host: str, port: int, workers: int, log_level: str, access_log: bool, app: str | None = None
) -> None:
    """Serve the API with uvicorn (its supervisor for several workers), as `serve` does;
    `app` names another ASGI app factory to serve the same way (bench/request_floor.py)."""
    options: dict[str, Any] = {
        "factory": True,
        "host": host,
        "port": port,
        "workers": workers,
        "log_level": log_level,
        "access_log": access_log,
        **uvicorn_options(),
    }
    if workers == 1:
        # No supervisor: the app runs in this process (an inherited value would name
        # another process's supervisor). A PROMETHEUS_MULTIPROC_DIR of the user's is left
        # alone: prometheus_client read it at import and reads it again for each metric.
        os.environ.pop(SUPERVISOR_ENV, None)
        uvicorn.run(app or APP, **options)
        return
    config = Config(app or APP, **options)
    # Workers are spawned from this environment: each learns which process to end with.
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    try:
        sock = reserve_address(host, port)
    except OSError as exc:
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    # /metrics sums every worker's counters from files here (tracestore/metrics.py); a new
    # directory each time, so a restarted server does not count its last run's requests.
    # Locked by this process while it serves: a SIGKILL leaves it behind, and the next
    # start of a server removes it.
    previous = os.environ.get(MULTIPROC_ENV)
    remove_stale_metrics_dirs(Path(tempfile.gettempdir()))
    metrics_dir, held = make_metrics_dir(Path(tempfile.gettempdir()))
    os.environ[MULTIPROC_ENV] = str(metrics_dir)
    try:
        Multiprocess(config, sockets=[sock]).run()
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if held >= 0:
            os.close(held)
        if previous is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = previous
        shutil.rmtree(metrics_dir, ignore_errors=True)


APP = "tracestore.api.server:served_app"
METRICS_DIR_PREFIX = "tracestore-metrics-"


METRICS_DIR_LOCK = ".held"


def make_metrics_dir(parent: Path) -> tuple[Path, int]:
    """A new metrics directory in `parent` for this server, and the descriptor of the
    lock on it this process holds while it serves (close it to let the directory go; -1
    where the file system has no locks)."""
    # Made under a name the sweep does not match, locked, then renamed: a directory the
    # sweep finds always holds its lock (or was made before locks, by an older server).
    hidden = Path(tempfile.mkdtemp(prefix=f".{METRICS_DIR_PREFIX}{os.getpid()}-", dir=parent))
    held = os.open(hidden / METRICS_DIR_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            # A file system without locks (some NFS): judged by the pid in its name.
            os.close(held)
            held = -1
            (hidden / METRICS_DIR_LOCK).unlink()
        path = hidden.rename(parent / hidden.name[1:])
    except BaseException:
        if held >= 0:
            os.close(held)
        shutil.rmtree(hidden, ignore_errors=True)
        raise
    return path, held


def remove_stale_metrics_dirs(parent: Path) -> list[Path]:
    """Remove the metrics directories in `parent` of servers of this user that are gone
    (killed before they could remove their own); the ones removed."""
    removed = []
    for path in [
        *parent.glob(f"{METRICS_DIR_PREFIX}*-*"),
        *parent.glob(f".{METRICS_DIR_PREFIX}*-*"),
    ]:
        try:
            info = path.lstat()  # a link of that name is not one of ours: not followed
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if path.name.startswith("."):
            # Being made (`make_metrics_dir`: a moment between mkdtemp and the rename), or
            # left by a server killed in that moment: only an old one, whose lock (if it
            # was taken) nobody holds, is left behind.
            if time.time() - info.st_mtime < HIDDEN_METRICS_DIR_AGE_S or _locked(path):
                continue
        elif _serving(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed


# A metrics directory under its hidden name is renamed microseconds after it is made.
HIDDEN_METRICS_DIR_AGE_S = 60.0


def _serving(path: Path) -> bool:
    """Whether the server of a metrics directory may still run (when unsure: yes).

    The supervisor holds the lock in it while it serves (exact, across containers sharing
    this directory too, where a pid means nothing); a directory without one (made by a
    server before locks, or on a file system without them) is judged by the pid in its
    name.
    """
    locked = _locked(path)
    if locked is None:
        return _pid_alive(path.name.removeprefix(METRICS_DIR_PREFIX).split("-", 1)[0])
    return locked


def _locked(path: Path) -> bool | None:
    """Whether a process holds the lock of a metrics directory (None: it has no lock
    file; True when it cannot be told)."""
    try:
        # Non-blocking: a FIFO of that name (this user's) would hold the start forever.
        lock = os.open(path / METRICS_DIR_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        return True
    try:
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # held: its server runs
        return True
    finally:
        os.close(lock)
    return False


def _pid_alive(pid: str) -> bool:
    """Whether `pid` (text) may name a live process (when unsure, or not a pid: yes)."""
    if not (pid.isascii() and pid.isdigit()):
        return True  # not named by a pid: not one of ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # a live process of another user, or past any pid
        return True
    return True


def served_app() -> FastAPI:
    """The app as `tracestore serve` runs it in each worker: settings from the environment,
    its heap frozen once started (`create_app`'s `freeze_heap`), the process its own."""
    from tracestore.api.app import create_app  # in the worker, not in the supervisor

    follow_supervisor()
    return create_app(freeze_heap=True, owns_process=True)


def follow_supervisor() -> None:
    """In a worker of `tracestore serve --workers N`: stop gracefully (SIGTERM to itself)
    once the supervisor is gone.

    uvicorn's workers outlived a supervisor killed outright (SIGKILL, the OOM killer): they
    went on answering on the port, with their analytics children and their memory, and a
    server started again could not bind the port while they lived. A shutdown that does
    not end within ORPHAN_GRACE_S (a request that never ends) is cut short."""
    expected = os.environ.get(SUPERVISOR_ENV, "")
    if not expected.isdigit():
        return  # one worker: uvicorn runs it in the supervisor's own process

    def stop() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown
        time.sleep(ORPHAN_GRACE_S)
        os._exit(1)  # still here: its analytics children follow within a second

    # A worker is the supervisor's child: reparented (to init or a subreaper) when it is
    # gone, whether before the watch started or after.
    when_orphaned(int(expected), stop, name="supervisor-watch")


def uvicorn_options() -> dict[str, Any]:
    """The options `tracestore serve` gives uvicorn.run (besides host, port, workers)."""
    return {
        "http": GuardedHttpToolsProtocol,
        # uvicorn's supervisor kills a worker whose ping thread has not answered within
        # this many seconds (default 5) and starts another: every request in flight on
        # it is lost. On a busy machine (more workers than cores, a long batch parsing)
        # the ping thread can wait that long for the GIL, and a worker was killed in the
        # middle of a race test. A real hang is rarer than a busy CPU: wait longer.
        "timeout_worker_healthcheck": WORKER_HEALTHCHECK_S,
    }


__all__ = [
    "GuardedHttpToolsProtocol",
    "follow_supervisor",
    "reserve_address",
    "run_server",
    "served_app",
    "uvicorn_options",
]
