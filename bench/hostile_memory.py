"""Peak memory of a `tracestore serve` worker under hostile requests, next to the in-flight
bound (issue 18 item 3: no hostile body may take RSS past twice that bound).

Each attack runs against a fresh server with the default limits (64 MiB body, 256 MiB in
flight, 32 KiB heads, 10,000 batch items, the parsed-size limit), warmed by one small
batch, on each database asked for. The figures are the server process's peak RSS (/proc
VmHWM, reset just before the attack) and its growth over the RSS before the attack; the
answer the attack got is recorded too. The bodies "under the parsed-size limit" are the
worst of their shape the estimate admits (tracestore/api/body.py): each grown until its
estimate is within 1% of TRACESTORE_MAX_PARSED_BYTES.

    .venv/bin/python -m bench.hostile_memory [--db sqlite|postgresql|both] [--only NAME ...]

Writes bench/results/hostile_memory.json and .md (with --only: nothing, unless --write).
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
from collections import Counter
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
from tracestore.api.body import parsed_estimate
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


def ndjson_bomb() -> Body:
    """gzip of 22.4 M `{}` lines (67 MB decoded, 64 KiB on the wire), NDJSON batch."""
    return Body("/v1/rollouts/batch", "application/x-ndjson", b"{}\n" * ITEMS)


def array_bomb() -> Body:
    """gzip of a JSON array of 21 M `{}` (64 MiB decoded), JSON batch."""
    n = (64 * MIB - 2) // 3
    return Body("/v1/rollouts/batch", "application/json", b"[" + b"{}," * (n - 1) + b"{}]")


def blank_lines() -> Body:
    """gzip of 33 M whitespace-only lines (64 MiB decoded), NDJSON batch."""
    return Body("/v1/rollouts/batch", "application/x-ndjson", b" \n" * (32 * MIB - 1))


_HEAD = (
    b'{"run_id":"%s","trajectories":[],"metrics":{"episode_returns":[],'
    b'"mean_return":0,"num_steps":0},"pad":'
)


def _padded(run_id: str, first: bytes, unit: bytes, last: bytes, n: int) -> bytes:
    """A valid rollout whose undeclared key `pad` holds `first + unit * n + last`."""
    return _HEAD % run_id.encode() + first + unit * n + last + b"}"


def _largest_under_cap(
    build: Callable[[int], bytes], fraction: float = 0.99, probe: int = 1_000
) -> bytes:
    """build(n) for the largest n whose body the parsed-size estimate puts within
    `fraction` of TRACESTORE_MAX_PARSED_BYTES (and under it)."""
    cap = Settings.model_construct().max_parsed_bytes  # the defaults: serve() sets none
    small, large = parsed_estimate(build(probe)), parsed_estimate(build(2 * probe))
    per_unit = (large - small) / probe
    n = int((cap * fraction - (small - probe * per_unit)) / per_unit)
    body = build(n)
    while parsed_estimate(body) > cap:
        n = int(n * 0.99)
        body = build(n)
    return body


@dataclass
class Body:
    """A request body (decoded) and where and how it is sent."""

    path: str
    content_type: str
    raw: bytes  # before gzip
    gzip_level: int = 9

    def attack(self) -> Callable[[Server], str]:
        """Post it (gzip) to a server; the answer."""
        body = gzip.compress(self.raw, self.gzip_level)
        return lambda server: _post(server, self.path, body, self.content_type)


def tiny_values_rollout() -> Body:
    """One valid rollout (single post, gzip) padded to 60 MiB with 20 M empty objects."""
    raw = _padded("tiny", b"[", b"{},", b"{}]", (60 * MIB) // 3)
    return Body("/v1/rollouts", "application/json", raw)


def tiny_values_under_cap() -> Body:
    """The issue's shape, as large as the estimate admits: empty objects."""
    raw = _largest_under_cap(lambda n: _padded("tiny-under", b"[", b"{},", b"{}]", n))
    return Body("/v1/rollouts", "application/json", raw)


def nested_lists_under_cap() -> Body:
    """The shape that takes most memory per byte: lists nested 500 deep, repeated."""
    unit = b"[" * 500 + b"]" * 500 + b","
    raw = _largest_under_cap(lambda n: _padded("nested-under", b"[", unit, b"0]", n))
    return Body("/v1/rollouts", "application/json", raw)


def short_strings_under_cap() -> Body:
    """Two-character strings (a 64-byte object each), as many as the estimate admits."""
    raw = _largest_under_cap(lambda n: _padded("strings-under", b"[", b'"ab",', b'"ab"]', n))
    return Body("/v1/rollouts", "application/json", raw)


def floats_under_cap() -> Body:
    """Floats (a 32-byte object each), as many as the estimate admits."""
    raw = _largest_under_cap(lambda n: _padded("floats-under", b"[", b"1.5,", b"1.5]", n))
    return Body("/v1/rollouts", "application/json", raw)


# Printable ASCII but the characters the estimate charges (`"`, `\\`, `{`, `[`, `,`, `:`):
# random text of these compresses least (to ~0.83) for its estimate.
_PRINTABLE = bytes(c for c in range(32, 127) if c not in b'"\\{[,:')
_TO_PRINTABLE = bytes.maketrans(
    bytes(range(256)), bytes(_PRINTABLE[i % len(_PRINTABLE)] for i in range(256))
)


def _random_string_under_cap(run_id: str, first: bytes) -> Body:
    noise = os.urandom(64 * MIB).translate(_TO_PRINTABLE)

    def build(n: int) -> bytes:
        return _padded(run_id, b'"' + first, b"", noise[:n] + b'"', 0)

    return Body("/v1/rollouts", "application/json", _largest_under_cap(build), gzip_level=1)


def random_string_under_cap() -> Body:
    """One string of random printable ASCII (stored nearly incompressible), as long as the
    estimate admits."""
    return _random_string_under_cap("ascii-under", b"")


def wide_string_under_cap() -> Body:
    """The same, made four bytes a character by one emoji at its start."""
    return _random_string_under_cap("wide-under", "\U0001f600".encode())


def _at_once(body: Body, path: str, n: int, level: int) -> Callable[[Server], str]:
    """An attack: `n` posts at once of `body` (gzip at `level`) to `path`."""
    sent = gzip.compress(body.raw, level)

    def attack(server: Server) -> str:
        with ThreadPoolExecutor(max_workers=n) as pool:
            answers = Counter(
                pool.map(lambda _: _post(server, path, sent, "application/json"), range(n))
            )
        return ", ".join(f"{k} x {a}" for a, k in sorted(answers.items()))

    return attack


def concurrent_tiny_values_under_cap() -> Callable[[Server], str]:
    """4 posts at once of the empty-objects rollout the estimate just admits (one at a time
    through the worker's parse budget, api/overload.py). The same rollout each time:
    duplicates after the first, each parsed all the same."""
    return _at_once(tiny_values_under_cap(), "/v1/rollouts", 4, 9)


def concurrent_converts_under_cap() -> Callable[[Server], str]:
    """8 conversions at once (POST /v1/convert) of the empty-objects rollout the estimate
    just admits: parsed, converted and answered in full, nothing stored."""
    return _at_once(tiny_values_under_cap(), "/v1/convert?to=trace", 8, 9)


def concurrent_random_strings_under_cap() -> Callable[[Server], str]:
    """32 posts at once of the random-ASCII-string rollout the estimate admits: as many
    bodies as the in-flight bound holds wait, read, for the parse budget (docs/RELIABILITY.md:
    a limit of the promise)."""
    return _at_once(random_string_under_cap(), "/v1/rollouts", 32, 1)


def _stored_steps_run(server: Server, run_id: str, n: int) -> None:
    """Store a trajectories-only rollout of `n` one-line steps (5 MiB for 200,000: it
    costs ~7x its parsed-size estimate converted to a trace)."""
    doc = {
        "run_id": run_id,
        "trajectories": [
            {
                "env_id": "e",
                "policy_id": "p",
                "steps": [{"reward": 0, "done": False}] * n,
                "length": n,
                "inference_url": "",
            }
        ],
        "metrics": {"episode_returns": [0], "mean_return": 0, "num_steps": n},
    }
    answer = _post(server, "/v1/rollouts", gzip.compress(orjson.dumps(doc), 1), "application/json")
    if not answer.startswith(("200", "201")):
        raise RuntimeError(f"storing {run_id}: {answer}")


def concurrent_inspections() -> Callable[[Server], str]:
    """8 inspections at once (GET /v1/inspect/{run_id}) of a stored trajectories-only run
    of 200,000 one-line steps: each converts the run to a trace on read. The run is stored
    first and the peak reset after it, so the peak is the reads'."""

    def attack(server: Server) -> str:
        _stored_steps_run(server, "inspected", 200_000)
        server.reset_peak()

        def inspect(_: int) -> str:
            response = httpx.get(server.url + "/v1/inspect/inspected", timeout=600)
            code = ""
            with contextlib.suppress(ValueError, KeyError, TypeError):
                code = " " + response.json()["error"]["code"]
            return f"{response.status_code}{code}"

        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = Counter(pool.map(inspect, range(8)))
        return ", ".join(f"{k} x {a}" for a, k in sorted(answers.items()))

    return attack


def _real(n_bytes: int) -> bytes:
    from bench.corpus import sized

    return sized(n_bytes, seed=3)


def legit_rollout() -> Body:
    """For reference: one real-shaped 60 MiB rollout (bench/corpus.py), gzip."""
    return Body("/v1/rollouts", "application/json", _real(60 * MIB), gzip_level=6)


def legit_rollout_under_cap() -> Body:
    """The largest real-shaped rollout (bench/corpus.py: more steps) the estimate admits."""
    return Body("/v1/rollouts", "application/json", _largest_under_cap(_real, 0.99, MIB), 6)


def repeated_key_rollout() -> Body:
    """A rollout of empty objects as large as the estimate admits, repeating a key at its
    end: refused (422) only after tracestore/jsontext.py's first_repeated_key has parsed
    it a second time (orjson's value dropped first; no path kept per value)."""
    raw = _largest_under_cap(lambda n: _padded("repeated", b"[", b"{},", b'{"a":1,"a":1}]', n))
    return Body("/v1/rollouts", "application/json", raw)


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
        # Spaces: the cheapest bytes for the parsed-size estimate (4 each), so the upload
        # stalls before the estimate refuses it.
        sock.sendall(head + b'{"run_id": "held", "pad": "')
        for _ in range(send // MIB):
            sock.sendall(b" " * MIB)
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
        answers = Counter(a for _, a in uploads)
        return ", ".join(
            f"{n} {'held' if a == 'held' else 'answered ' + a}" for a, n in answers.items()
        )

    return attack


Make = Callable[[], "Body | Callable[[Server], str]"]

# name: (what it is; {mib} is the decoded body's size), how to make it.
ATTACKS: dict[str, tuple[str, Make]] = {
    "ndjson_bomb": ("gzip NDJSON batch: 22.4 M lines of {{}} (64 KiB sent)", ndjson_bomb),
    "blank_lines": ("gzip NDJSON batch: 33 M blank lines (64 KiB sent)", blank_lines),
    "array_bomb": ("gzip JSON-array batch: 21 M {{}} (64 KiB sent)", array_bomb),
    "tiny_values_rollout": (
        "one gzip rollout of 60 MiB: 20 M empty objects in an undeclared key",
        tiny_values_rollout,
    ),
    "tiny_values_under_cap": (
        "one gzip rollout of empty objects, the most the estimate admits ({mib} MiB)",
        tiny_values_under_cap,
    ),
    "nested_lists_under_cap": (
        "one gzip rollout of lists nested 500 deep, the most the estimate admits ({mib} MiB)",
        nested_lists_under_cap,
    ),
    "short_strings_under_cap": (
        'one gzip rollout of "ab" strings, the most the estimate admits ({mib} MiB)',
        short_strings_under_cap,
    ),
    "floats_under_cap": (
        "one gzip rollout of floats, the most the estimate admits ({mib} MiB)",
        floats_under_cap,
    ),
    "random_string_under_cap": (
        "one gzip rollout holding one string of random ASCII, the most the estimate admits "
        "({mib} MiB)",
        random_string_under_cap,
    ),
    "wide_string_under_cap": (
        "the same string after one emoji (4 bytes a character), the most the estimate admits "
        "({mib} MiB)",
        wide_string_under_cap,
    ),
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
    "legit_60mib_rollout": ("one real-shaped 60 MiB rollout, gzip", legit_rollout),
    "legit_largest_rollout": (
        "the largest real-shaped rollout the estimate admits ({mib} MiB), gzip",
        legit_rollout_under_cap,
    ),
    "concurrent_tiny_values_under_cap": (
        "4 posts at once of the empty-objects rollout the estimate admits",
        concurrent_tiny_values_under_cap,
    ),
    "concurrent_converts_under_cap": (
        "8 conversions at once (POST /v1/convert) of the empty-objects rollout the estimate admits",
        concurrent_converts_under_cap,
    ),
    "concurrent_random_strings_under_cap": (
        "32 posts at once of the random-ASCII-string rollout the estimate admits",
        concurrent_random_strings_under_cap,
    ),
    "concurrent_inspections": (
        "8 inspections at once (GET /v1/inspect) of a stored run of 200,000 one-line steps",
        concurrent_inspections,
    ),
    "repeated_key_rollout": (
        "one rollout of empty objects the estimate admits, repeating a key at its end",
        repeated_key_rollout,
    ),
}


def _attack_once(server: Server, attack: Callable[[Server], str], target: int) -> dict[str, Any]:
    before = server.reset_peak()
    start = time.monotonic()
    answer = attack(server)
    took = time.monotonic() - start
    peak = server.status()["VmHWM"]
    healthy = httpx.get(server.url + "/health", timeout=30).status_code == 200
    return {
        "answer": answer,
        "seconds": round(took, 2),
        "rss_before_mib": round(before / MIB, 1),
        "peak_rss_mib": round(peak / MIB, 1),
        "growth_mib": round((peak - before) / MIB, 1),
        "within_target": peak <= target,
        "healthy_after": healthy,
    }


def run(db_urls: dict[str, str], names: list[str], log: Path) -> list[dict[str, Any]]:
    """Every attack in `names` on a fresh server each, on each database; one row per attack
    and database."""
    settings = Settings.model_construct()
    target = 2 * settings.max_inflight_bytes
    rows = []
    for name in names:
        what, make = ATTACKS[name]
        made = make()
        row: dict[str, Any] = {"attack": name}
        if isinstance(made, Body):
            attack = made.attack()
            row["body_mib"] = round(len(made.raw) / MIB, 1)
            row["estimate_mib"] = round(parsed_estimate(made.raw) / MIB, 1)
            what = what.format(mib=row["body_mib"])
            del made
        else:
            attack = made
            what = what.format()
        row["what"] = what
        for backend, url in db_urls.items():
            with serve(url, log) as server:
                result = {**row, "db": backend, **_attack_once(server, attack, target)}
            rows.append(result)
            print(json.dumps(result), flush=True)
    return rows


def _markdown(rows: list[dict[str, Any]], settings: Settings, backends: list[str]) -> str:
    target = 2 * settings.max_inflight_bytes // MIB
    names = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
    lines = [
        f"Hostile requests: peak RSS of the server process (MiB; its growth during the attack "
        f"in brackets) vs {target} MiB, twice the in-flight limit "
        f"({settings.max_inflight_bytes // MIB} MiB). Parsed-size limit "
        f"{settings.max_parsed_bytes // MIB} MiB; body limit {settings.max_body_bytes // MIB} "
        "MiB. `estimate`: the parsed-size estimate of the decoded body (MiB).",
        "",
        "| attack | estimate | "
        + " | ".join(f"{names[b]}: answer | {names[b]}: peak (growth)" for b in backends)
        + " | within target |",
        "|---|---|" + "---|---|" * len(backends) + "---|",
    ]
    by_attack: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_attack.setdefault(r["attack"], []).append(r)
    for group in by_attack.values():
        cells = [group[0]["what"], str(group[0].get("estimate_mib", ""))]
        for r in group:
            cells += [r["answer"], f"{r['peak_rss_mib']} ({r['growth_mib']})"]
        ok = all(r["within_target"] for r in group)
        cells.append("yes" if ok else "**no**")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the attacks; write bench/results/hostile_memory.{json,md}."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--only", nargs="*", choices=sorted(ATTACKS))
    parser.add_argument("--write", action="store_true", help="write the results with --only")
    args = parser.parse_args()
    backends = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    if "postgresql" in backends and not pg_available():
        raise SystemExit("PostgreSQL is not reachable")
    names = args.only or list(ATTACKS)
    settings = Settings.model_construct()
    with contextlib.ExitStack() as stack:
        urls = {b: stack.enter_context(fresh_database(b)) for b in backends}
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        rows = run(urls, names, Path(tmp) / "server.log")
    table = _markdown(rows, settings, backends)
    print(table)
    if args.only and not args.write:
        return
    RESULTS.mkdir(exist_ok=True)
    body = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "command": "python -m bench.hostile_memory --db " + args.db,
        "settings": {
            "max_body_bytes": settings.max_body_bytes,
            "max_inflight_bytes": settings.max_inflight_bytes,
            "max_parsed_bytes": settings.max_parsed_bytes,
            "target_peak_bytes": 2 * settings.max_inflight_bytes,
        },
        "backends": backends,
        "rows": rows,
    }
    (RESULTS / "hostile_memory.json").write_text(json.dumps(body, indent=2) + "\n")
    (RESULTS / "hostile_memory.md").write_text(table)


if __name__ == "__main__":
    main()
