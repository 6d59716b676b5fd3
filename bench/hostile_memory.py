"""Peak memory of a `tracestore serve` worker under hostile requests, next to the in-flight
bound (issue 18 item 3: no hostile body may take RSS past twice that bound).

Each attack runs against a fresh server with the default limits (64 MiB body, 256 MiB in
flight, 32 KiB heads, 10,000 batch items), warmed by one small batch. The figures are the
server process's peak RSS (/proc VmHWM, reset just before the attack) and its growth over
the RSS before the attack; the answer the attack got is recorded too.

    .venv/bin/python -m bench.hostile_memory [--db sqlite|postgresql] [--only NAME ...]

Writes bench/results/hostile_memory.json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import TRACESTORE, free_port, fresh_database, pg_available
from tracestore.settings import Settings

RESULTS = Path(__file__).resolve().parent / "results"
MIB = 1024 * 1024
LOOPBACK = "127.0.0.1"
ITEMS = 22_400_000  # the bomb: 22.4 million `{}` lines in 64 KiB of gzip


@dataclass
class Server:
    """A `tracestore serve` subprocess (one worker: uvicorn runs in it) and its log."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"http://{LOOPBACK}:{self.port}"

    def status(self) -> dict[str, int]:
        """VmRSS and VmHWM in bytes."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
        return out

    def reset_peak(self) -> int:
        """Reset VmHWM to the current RSS (Linux >= 4.0); the RSS."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        return self.status()["VmRSS"]


@contextmanager
def serve(db_url: str, log: Path) -> Iterator[Server]:
    """A fresh server with the default limits, warmed by one small batch."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESTORE_")}
    args = [TRACESTORE, "serve", "--db", db_url, "--host", LOOPBACK, "--port", str(port)]
    with log.open("ab") as out:
        proc = subprocess.Popen([*args, "--log-level", "warning"], stdout=out, stderr=out, env=env)
    server = Server(proc, port)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        warm = orjson.dumps({"run_id": "warm", "trajectories": [], "metrics": {}}) + b"\n"
        httpx.post(
            server.url + "/v1/rollouts/batch",
            content=warm,
            headers={"Content-Type": "application/x-ndjson"},
            timeout=60,
        )
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


# --- the attacks: each returns what the server answered -----------------------------------


def _answer(sock: socket.socket, wait: float = 30.0) -> str:
    sock.settimeout(wait)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 "):
        return "no answer"
    code = ""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        code = " " + orjson.loads(body)["error"]["code"]
    return head[9:12].decode() + code


def _post(server: Server, path: str, body: bytes, content_type: str) -> str:
    headers = {"Content-Type": content_type, "Content-Encoding": "gzip"}
    response = httpx.post(server.url + path, content=body, headers=headers, timeout=600)
    code = ""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        code = " " + response.json()["error"]["code"]
    return f"{response.status_code}{code}"


def ndjson_bomb() -> Callable[[Server], str]:
    """gzip of 22.4 M `{}` lines (67 MB decoded, 64 KiB on the wire), NDJSON batch."""
    body = gzip.compress(b"{}\n" * ITEMS, 9)
    return lambda server: _post(server, "/v1/rollouts/batch", body, "application/x-ndjson")


def array_bomb() -> Callable[[Server], str]:
    """gzip of a JSON array of 21 M `{}` (64 MiB decoded), JSON batch."""
    n = (64 * MIB - 2) // 3
    body = gzip.compress(b"[" + b"{}," * (n - 1) + b"{}]", 9)
    return lambda server: _post(server, "/v1/rollouts/batch", body, "application/json")


def blank_lines() -> Callable[[Server], str]:
    """gzip of 33 M whitespace-only lines (64 MiB decoded), NDJSON batch."""
    body = gzip.compress(b" \n" * (32 * MIB - 1), 9)
    return lambda server: _post(server, "/v1/rollouts/batch", body, "application/x-ndjson")


def _tiny_values(run_id: str, size: int) -> bytes:
    head = (
        b'{"run_id":"%s","trajectories":[],"metrics":{"episode_returns":[],'
        b'"mean_return":0,"num_steps":0},"pad":[' % run_id.encode()
    )
    n = (size - len(head)) // 3
    return gzip.compress(head + b"{}," * (n - 1) + b"{}]}", 9)


def tiny_values_rollout() -> Callable[[Server], str]:
    """One valid rollout (single post, gzip) padded to 60 MiB with 20 M empty objects."""
    body = _tiny_values("tiny", 60 * MIB)
    return lambda server: _post(server, "/v1/rollouts", body, "application/json")


def tiny_values_under_cap() -> Callable[[Server], str]:
    """The worst the parsed-size estimate lets in: empty objects (24 estimated bytes per
    byte) up to just under TRACESTORE_MAX_PARSED_BYTES."""
    size = int(Settings().max_parsed_bytes / 24 * 0.98)
    body = _tiny_values("tiny-under-cap", size)
    return lambda server: _post(server, "/v1/rollouts", body, "application/json")


def header_line_8mb() -> Callable[[Server], str]:
    """One request with an 8 MB header line, sent whole before reading."""

    def attack(server: Server) -> str:
        with socket.create_connection((LOOPBACK, server.port), timeout=60) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8_000_000)
            sock.sendall(b"\r\n\r\n")
            return _answer(sock)

    return attack


def _unfinished(port: int) -> str:
    with socket.create_connection((LOOPBACK, port), timeout=60) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        with contextlib.suppress(OSError):
            for _ in range(64):
                sock.sendall(b"a" * MIB)
        return _answer(sock, 5)


def unfinished_headers() -> Callable[[Server], str]:
    """8 connections, each sending an unfinished 64 MiB header line at once."""

    def attack(server: Server) -> str:
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda _: _unfinished(server.port), range(8)))
        return ", ".join(sorted(set(answers)))

    return attack


def _held_upload(port: int, declared: int, send: int) -> tuple[socket.socket, str]:
    sock = socket.create_connection((LOOPBACK, port), timeout=60)
    head = (
        b"POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % declared
    )
    with contextlib.suppress(OSError):
        sock.sendall(head + b'{"run_id": "held", "pad": "')
        for _ in range(send // MIB):
            sock.sendall(b"x" * MIB)
    sock.settimeout(0.5)
    data = b""
    with contextlib.suppress(OSError):
        data = sock.recv(300)
    return sock, (data[9:12].decode() if data.startswith(b"HTTP/1.1 ") else "held")


def held_uploads(n: int, size: int) -> Callable[[Server], str]:
    """`n` uploads declaring `size` bytes, each sending all but the last MiB and stalling."""

    def attack(server: Server) -> str:
        with ThreadPoolExecutor(max_workers=8) as pool:
            uploads = list(
                pool.map(lambda _: _held_upload(server.port, size, size - MIB), range(n))
            )
        time.sleep(1.0)  # the peak is read while they are held (by the caller, after this)
        for sock, _ in uploads:
            sock.close()
        answers = [a for _, a in uploads]
        return f"{answers.count('held')} held, {answers.count('503')} refused 503"

    return attack


def legit_rollout() -> Callable[[Server], str]:
    """For reference, not an attack: one real-shaped 60 MiB rollout (bench/corpus.py), gzip."""
    from bench.corpus import sized

    body = gzip.compress(sized(60 * MIB, seed=3), 6)
    return lambda server: _post(server, "/v1/rollouts", body, "application/json")


ATTACKS: dict[str, tuple[str, Callable[[], Callable[[Server], str]]]] = {
    "ndjson_bomb": ("gzip NDJSON batch: 22.4 M lines of {} (64 KiB sent)", ndjson_bomb),
    "array_bomb": ("gzip JSON-array batch: 21 M {} (64 KiB sent)", array_bomb),
    "blank_lines": ("gzip NDJSON batch: 33 M blank lines (64 KiB sent)", blank_lines),
    "header_8mb": ("one 8 MB header line", header_line_8mb),
    "unfinished_headers": ("8 unfinished 64 MiB header lines", unfinished_headers),
    "stalled_4x64mib": (
        "4 uploads declaring 64 MiB, 63 MiB sent, stalled",
        lambda: held_uploads(4, 64 * MIB),
    ),
    "held_flood_32x32mib": (
        "32 uploads declaring 32 MiB, 31 MiB sent, held",
        lambda: held_uploads(32, 32 * MIB),
    ),
    "legit_60mib_rollout": (
        "(reference) one real-shaped 60 MiB rollout, gzip: stored",
        legit_rollout,
    ),
    "tiny_values_rollout": (
        "one gzip rollout of 60 MiB: 20 M empty objects in an undeclared key",
        tiny_values_rollout,
    ),
    "tiny_values_under_cap": (
        "one gzip rollout of empty objects just under the parsed-size limit (15.7 MiB)",
        tiny_values_under_cap,
    ),
}


def run(db_url: str, names: list[str], log: Path) -> list[dict[str, Any]]:
    """Every attack in `names` on a fresh server each; one row per attack."""
    settings = Settings()
    target = 2 * settings.max_inflight_bytes
    rows = []
    for name in names:
        what, make = ATTACKS[name]
        attack = make()
        with serve(db_url, log) as server:
            before = server.reset_peak()
            start = time.monotonic()
            answer = attack(server)
            took = time.monotonic() - start
            peak = server.status()["VmHWM"]
            healthy = httpx.get(server.url + "/health", timeout=30).status_code == 200
        rows.append(
            {
                "attack": name,
                "what": what,
                "answer": answer,
                "seconds": round(took, 2),
                "rss_before_mib": round(before / MIB, 1),
                "peak_rss_mib": round(peak / MIB, 1),
                "growth_mib": round((peak - before) / MIB, 1),
                "inflight_limit_mib": settings.max_inflight_bytes // MIB,
                "target_peak_mib": target // MIB,
                "within_target": peak <= target,
                "healthy_after": healthy,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _markdown(rows: list[dict[str, Any]], backend: str) -> str:
    lines = [
        f"Hostile requests, {backend}: peak RSS of the server process vs 2x the in-flight "
        f"limit ({rows[0]['inflight_limit_mib']} MiB -> target {rows[0]['target_peak_mib']} "
        "MiB)",
        "",
        "| attack | answer | peak RSS (MiB) | growth (MiB) | within target |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ok = "yes" if r["within_target"] else "**no**"
        lines.append(
            f"| {r['what']} | {r['answer']} | {r['peak_rss_mib']} | {r['growth_mib']} | {ok} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the attacks; write bench/results/hostile_memory.{json,md}."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--only", nargs="*", choices=sorted(ATTACKS), default=list(ATTACKS))
    args = parser.parse_args()
    if args.db == "postgresql" and not pg_available():
        raise SystemExit("PostgreSQL is not reachable")
    with fresh_database(args.db) as url, tempfile.TemporaryDirectory() as tmp:
        rows = run(url, args.only, Path(tmp) / "server.log")
    RESULTS.mkdir(exist_ok=True)
    body = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "backend": args.db,
        "rows": rows,
    }
    (RESULTS / "hostile_memory.json").write_text(json.dumps(body, indent=2) + "\n")
    table = _markdown(rows, args.db)
    (RESULTS / "hostile_memory.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
