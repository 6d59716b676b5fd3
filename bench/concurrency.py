"""The load task apps really make (issue 19): many concurrent clients, each posting ONE
rollout per request to `tracestore serve --workers 2`, next to the NDJSON batch route.

For each database, for the 108 KB (`multi`) and 1.2 KB (`single`) corpora of
bench/corpus.py, and for 1, 8, 32 and 128 clients (keep-alive connections, each posting
its next rollout as soon as the last one is acknowledged):

- single posts (`POST /v1/rollouts`): rollouts/s, p50/p99 acknowledgement latency (from
  the request's first byte sent to its answer's last byte received), and the server's CPU
  per rollout (user + system time of the server process and its workers, read from /proc
  before and after);
- the batch route (`POST /v1/rollouts/batch`, NDJSON, 50 rollouts a request) with the
  same number of clients (fewer when the corpus does not give each client a batch):
  rollouts/s, p50/p99 per request, server CPU per rollout.

Every rollout is new (created); the single posts and the batches of one client count run
back to back on the same server, so what slows one slows the other. Before them the store
is given rollouts of the corpus (`stored`, in batches: a store in use, not an empty one)
and on PostgreSQL analyzed, as autovacuum analyzes a table taking writes within its first
minute: on a new table never analyzed, the cached plans of the ingest's look-up scanned
every row of `runs` for each group of single posts, a cost no store in use pays. The clients are
asyncio streams in this process (minimal HTTP/1.1): hundreds of them cost little CPU,
which is reported too (`client_cpu_ms_per_rollout`), since on 2 cores it is CPU the
server does not get.

    .venv/bin/python -m bench concurrency [--quick|--full] [--db sqlite|postgresql|both]
        [--out NAME]   # bench/results/NAME.{json,md}; default concurrency[-quick]

`python -m bench all` runs it too (its --quick size stays small for CI).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine

from bench.common import (
    TRACESTORE,
    cpu_split,
    free_port,
    fresh_database,
    pg_available,
    proc_stat,
    tcp_sockets,
)
from bench.corpus import corpus

RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 50
WORKERS = 2
LOOPBACK = "127.0.0.1"
LOG = ("--log-level", "warning")
# py-spy: 250 samples/s of the threads holding the GIL, raw stacks (see profile()).
SPY = ("-r", "250", "--gil", "--format", "raw", "-o")

SIZES: dict[str, dict[str, Any]] = {
    # CI runs `bench all --quick` under a 15-minute timeout shared by every bench.
    "quick": {
        "clients": [1, 8],
        "rollouts": {"multi": 24, "single": 150},
        "batch_max": {"multi": 50, "single": 200},
        # Rollouts in the store before the measurements (see the module doc).
        "stored": {"multi": 20, "single": 500},
    },
    "full": {
        "clients": [1, 8, 32, 128],
        # Single posts: this many, and at least 3 per client.
        # (Fewer made the 1.2 KB figures swing by a third from one run to the next.)
        "rollouts": {"multi": 600, "single": 5000},
        # Batches: enough for one batch per client, at most this many rollouts.
        "batch_max": {"multi": 1600, "single": 5000},
        "stored": {"multi": 300, "single": 10000},
    },
}


# --- the server and its CPU ----------------------------------------------------------------


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += [child for child, parent in parents.items() if parent == pid]
    return out


def postgres_cpu() -> float:
    """User + system CPU seconds of every live process named `postgres` on this machine
    (the local server and its backends; one that ends during a measurement takes its
    seconds with it, so the figure is a floor)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                name, seconds = proc_stat(int(entry))
            except OSError:  # gone meanwhile
                continue
            if name == "postgres":
                total += seconds
    return total


def tree_cpu(root: int) -> tuple[float, float]:
    """User and system CPU seconds of process `root` and every live descendant."""
    user = system = 0.0
    for pid in _descendants(root):
        try:
            u, s = cpu_split(pid)
        except OSError:
            continue
        user += u
        system += s
    return user, system


@contextmanager
def serve(
    url: str, env: dict[str, str] | None = None, workers: int = WORKERS
) -> Iterator[tuple[str, int]]:
    """`tracestore serve --workers N` on loopback; yields (base URL, process id)."""
    port = free_port()
    command = [TRACESTORE, "serve", "--db", url, "--port", str(port), "--workers", str(workers)]
    with serving([*command, *LOG], port, env, workers) as up:
        yield up


@contextmanager
def serving(
    command: Sequence[str], port: int, env: dict[str, str] | None, workers: int
) -> Iterator[tuple[str, int]]:
    """Run `command`, a server of `workers` workers on loopback `port` answering /health;
    yields (base URL, process id) once every worker listens."""
    proc = subprocess.Popen(
        command,
        env=dict(os.environ, **(env or {})),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"server exited: {err}")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.1)
        # /health answers once one worker is up; each listens on its own socket (SO_REUSEPORT,
        # api/server.py): wait for all, or clients connecting now would all go to the first.
        # (A server whose workers share one socket never shows more than one: go on.)
        deadline = time.monotonic() + 15
        while len(tcp_sockets(port, "0A")) < workers and time.monotonic() < deadline:
            time.sleep(0.1)
        yield base, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


# --- the clients ---------------------------------------------------------------------------


async def _post(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, body: bytes
) -> tuple[int, bytes]:
    writer.write(head % len(body) + body)
    await writer.drain()
    lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


_SINGLE = (
    b"POST /v1/rollouts HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
)
_BATCH = (
    b"POST /v1/rollouts/batch HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n"
)


def post_all(base: str, bodies: Sequence[bytes], clients: int, batch: bool) -> dict[str, Any]:
    """Post `bodies` (rollouts, or NDJSON batches) from `clients` keep-alive connections;
    wall time, per-request latencies, and what failed."""
    port = int(base.rsplit(":", 1)[1])
    head = _BATCH if batch else _SINGLE
    queue = list(reversed(bodies))
    latencies: list[float] = []
    failures: list[str] = []

    async def client(ready: asyncio.Barrier) -> None:
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        await ready.wait()
        try:
            while queue:
                body = queue.pop()
                start = time.perf_counter()
                status, answer = await _post(reader, writer, head, body)
                latencies.append(time.perf_counter() - start)
                if status != (207 if batch else 201) or (
                    batch and b'"conflict":0,"invalid":0' not in answer
                ):
                    failures.append(f"{status} {answer[:300]!r}")
        finally:
            writer.close()

    async def run() -> float:
        ready = asyncio.Barrier(clients + 1)
        tasks = [asyncio.create_task(client(ready)) for _ in range(clients)]
        await ready.wait()  # every client connected: the clock starts with the first post
        start = time.perf_counter()
        await asyncio.gather(*tasks)
        return time.perf_counter() - start

    client_cpu = time.process_time()
    seconds = asyncio.run(run())
    return {
        "seconds": seconds,
        "latencies": latencies,
        "failures": failures,
        "client_cpu": time.process_time() - client_cpu,
    }


def _figures(
    done: dict[str, Any], rollouts: int, server_cpu: float, clients: int, postgres: float
) -> dict[str, Any]:
    lat = sorted(done["latencies"])
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
    return {
        "clients": clients,
        "rollouts": rollouts,
        "requests": len(lat),
        "seconds": round(done["seconds"], 4),
        "rollouts_per_s": round(rollouts / done["seconds"], 1),
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "server_cpu_ms_per_rollout": round(server_cpu * 1000 / rollouts, 3),
        "client_cpu_ms_per_rollout": round(done["client_cpu"] * 1000 / rollouts, 3),
        # The two cores are shared: on PostgreSQL its CPU is the throughput's too.
        "postgres_cpu_ms_per_rollout": round(postgres * 1000 / rollouts, 3),
        "failures": len(done["failures"]),
        "first_failure": done["failures"][0] if done["failures"] else None,
    }


def measure(
    base: str, pid: int, docs: Sequence[bytes], clients: int, batch: bool
) -> dict[str, Any]:
    """Post `docs` (single, or NDJSON batches of 50) from `clients` clients; the figures."""
    bodies = (
        [b"\n".join(docs[i : i + BATCH]) for i in range(0, len(docs), BATCH)]
        if batch
        else list(docs)
    )
    clients = min(clients, len(bodies))
    (user, system), postgres = tree_cpu(pid), postgres_cpu()
    done = post_all(base, bodies, clients, batch)
    (user_after, system_after), postgres = tree_cpu(pid), postgres_cpu() - postgres
    figures = _figures(
        done, len(docs), user_after - user + system_after - system, clients, postgres
    )
    # Where a single post's cost beyond a batch item lies: the kernel's (sockets) or the
    # processes' own (Python: the event loop's and the write's).
    figures["server_user_ms_per_rollout"] = round((user_after - user) * 1000 / len(docs), 3)
    figures["server_system_ms_per_rollout"] = round((system_after - system) * 1000 / len(docs), 3)
    return figures


# --- the runs ------------------------------------------------------------------------------


class Seeds:
    """Fresh corpus seeds, so every rollout posted is new."""

    def __init__(self) -> None:
        self.next = 10_000_000

    def take(self, kind: str, n: int) -> list[bytes]:
        """`n` new rollouts of `kind`."""
        docs = corpus(kind, n, start=self.next)
        self.next += n
        return docs


def run_backend(
    backend: str,
    size: str,
    env: dict[str, str] | None = None,
    log: Any = print,
    clients: Sequence[int] | None = None,
    kinds: Sequence[str] = ("multi", "single"),
    scale: int = 1,
    stored_rollouts: int | None = None,
) -> dict[str, Any]:
    """Every measurement of `size` on `backend`: {corpus: {clients: {single, batch}}};
    `scale` times the size's rollouts in each, after `stored_rollouts` rollouts are
    stored (None: the size's)."""
    cfg = SIZES[size]
    counts: Sequence[int] = clients or cfg["clients"]
    seeds = Seeds()
    out: dict[str, Any] = {}
    for kind in kinds:
        out[kind] = {}
        with fresh_database(backend) as url, serve(url, env) as (base, pid):
            # Warm-up: each worker's first requests import and connect.
            measure(base, pid, seeds.take(kind, 16), 8, batch=False)
            measure(base, pid, seeds.take(kind, 2 * BATCH), 2, batch=True)
            stored = cfg["stored"][kind] if stored_rollouts is None else stored_rollouts
            if stored:
                measure(base, pid, seeds.take(kind, stored), 8, batch=True)
            if backend == "postgresql":
                analyze(url)
            for n_clients in counts:
                rollouts = scale * cfg["rollouts"][kind]
                n = max(rollouts, 3 * n_clients)
                single = measure(base, pid, seeds.take(kind, n), n_clients, batch=False)
                nb = max(rollouts, min(n_clients * BATCH, scale * cfg["batch_max"][kind]))
                batch = measure(base, pid, seeds.take(kind, nb), n_clients, batch=True)
                out[kind][str(n_clients)] = {"single": single, "batch": batch}
                log(
                    f"{backend} {kind} {n_clients:>3} clients: single {single['rollouts_per_s']}/s "
                    f"p50 {single['p50_ms']} ms cpu {single['server_cpu_ms_per_rollout']} ms"
                    f" (user {single['server_user_ms_per_rollout']}, system "
                    f"{single['server_system_ms_per_rollout']}; postgres "
                    f"{single['postgres_cpu_ms_per_rollout']}); "
                    f"batch {batch['rollouts_per_s']}/s "
                    f"cpu {batch['server_cpu_ms_per_rollout']} ms"
                    f" (user {batch['server_user_ms_per_rollout']}, system "
                    f"{batch['server_system_ms_per_rollout']}; postgres "
                    f"{batch['postgres_cpu_ms_per_rollout']})",
                    flush=True,
                )
    return out


def analyze(url: str) -> None:
    """ANALYZE the PostgreSQL store at `url` (what autovacuum does on a table taking
    writes): the servers' cached plans are made again with its statistics."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE")
            conn.commit()
    finally:
        engine.dispose()


def run(
    size: str,
    backends: Sequence[str],
    env: dict[str, str] | None = None,
    log: Any = print,
    clients: Sequence[int] | None = None,
    kinds: Sequence[str] = ("multi", "single"),
    scale: int = 1,
    stored_rollouts: int | None = None,
) -> dict[str, Any]:
    """The whole benchmark at `size` on `backends` (`scale` times its rollouts)."""
    out: dict[str, Any] = {
        "size": size,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_at_start": os.getloadavg(),
        },
        "server": f"tracestore serve --workers {WORKERS}",
        "env": env or {},
        "scale": scale,
        "stored": {
            kind: SIZES[size]["stored"][kind] if stored_rollouts is None else stored_rollouts
            for kind in kinds
        },
        "results": {
            b: run_backend(b, size, env, log, clients, kinds, scale, stored_rollouts)
            for b in backends
        },
    }
    out["machine"]["load_at_end"] = os.getloadavg()
    out["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    return out


# --- the tables ----------------------------------------------------------------------------

CORPUS_NAMES = {"multi": "108 KB", "single": "1.2 KB"}


def _postgres(backend: str, m: dict[str, Any]) -> str:
    # Results written before the figure existed have none; SQLite's run has nothing to show.
    figure = m.get("postgres_cpu_ms_per_rollout")
    return "-" if backend != "postgresql" or figure is None else f"{figure:.2f}"


def markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table, and the issue's targets."""
    lines = [
        f"`python -m bench concurrency --{results['size']}`, {results['started']} to "
        f"{results['finished']}, {results['machine']['cpus']} CPUs, {results['server']}"
        + (
            ", store holding "
            + " / ".join(f"{n} {CORPUS_NAMES[k]}" for k, n in results["stored"].items())
            + " rollouts first"
            if "stored" in results
            else ""
        )
        + ".",
        "",
        "| database | corpus | clients | single: rollouts/s | p50 / p99 ack (ms) | server CPU "
        "(ms/rollout) | batch of 50: rollouts/s | p50 / p99 per batch (ms) | server CPU "
        "(ms/rollout) | single / batch rollouts/s | CPU single / batch | PostgreSQL CPU "
        "single / batch (ms/rollout) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, by_corpus in results["results"].items():
        for kind, by_clients in by_corpus.items():
            for clients, m in by_clients.items():
                s, b = m["single"], m["batch"]
                fewer = "" if b["clients"] == int(clients) else f" ({b['clients']} clients)"
                lines.append(
                    f"| {backend} | {CORPUS_NAMES[kind]} | {clients} | {s['rollouts_per_s']:.0f} "
                    f"| {s['p50_ms']:.1f} / {s['p99_ms']:.1f} | "
                    f"{s['server_cpu_ms_per_rollout']:.2f} | {b['rollouts_per_s']:.0f}"
                    f"{fewer} | "
                    f"{b['p50_ms']:.0f} / {b['p99_ms']:.0f} | "
                    f"{b['server_cpu_ms_per_rollout']:.2f} | "
                    f"{s['rollouts_per_s'] / b['rollouts_per_s']:.2f} | "
                    f"{s['server_cpu_ms_per_rollout'] / b['server_cpu_ms_per_rollout']:.2f} | "
                    f"{_postgres(backend, s)} / {_postgres(backend, b)} |"
                )
    lines += ["", targets(results)]
    return "\n".join(lines) + "\n"


def targets(results: dict[str, Any], clients: int = 32) -> str:
    """Issue 19's targets measured here, each met or not."""
    rows: list[tuple[str, str, str, bool]] = []
    for backend, by_corpus in results["results"].items():
        for kind, by_clients in by_corpus.items():
            m = by_clients.get(str(clients))
            if m is None:
                continue
            s, b = m["single"], m["batch"]
            ratio = s["rollouts_per_s"] / b["rollouts_per_s"]
            where = f"{backend} {CORPUS_NAMES[kind]}, {clients} clients"
            rows.append(
                ("single posts >= 0.8x batch rollouts/s", where, f"{ratio:.2f}x", ratio >= 0.8)
            )
            cpu = s["server_cpu_ms_per_rollout"] / b["server_cpu_ms_per_rollout"]
            rows.append(
                (
                    "server CPU per single post <= 1.3x per batch item",
                    where,
                    f"{cpu:.2f}x",
                    cpu <= 1.3,
                )
            )
    if not rows:
        return f"(no run with {clients} clients: the targets are read at the full size)"
    out = ["| target | where | this run | met |", "|---|---|---:|---|"]
    out += [f"| {t} | {w} | {v} | {'yes' if ok else '**no**'} |" for t, w, v, ok in rows]
    return "\n".join(out)


def compare(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Before and after side by side (same command, same machine, back to back)."""
    lines = [
        "| database | corpus | clients | single rollouts/s before -> after | single p50 ack ms "
        "| server CPU ms/single post | batch rollouts/s | server CPU ms/batch item "
        "| single/batch rollouts/s | CPU single/batch item |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, by_corpus in after["results"].items():
        for kind, by_clients in by_corpus.items():
            for clients, a in by_clients.items():
                b = before["results"].get(backend, {}).get(kind, {}).get(clients)
                if b is None:
                    continue

                def pair(key: str, side: str, fmt: str, a: Any = a, b: Any = b) -> str:
                    return f"{b[side][key]:{fmt}} -> {a[side][key]:{fmt}}"

                def ratio(key: str, x: Any) -> float:
                    return float(x["single"][key] / x["batch"][key])

                lines.append(
                    f"| {backend} | {CORPUS_NAMES[kind]} | {clients} "
                    f"| {pair('rollouts_per_s', 'single', '.0f')} "
                    f"| {pair('p50_ms', 'single', '.1f')} "
                    f"| {pair('server_cpu_ms_per_rollout', 'single', '.2f')} "
                    f"| {pair('rollouts_per_s', 'batch', '.0f')} "
                    f"| {pair('server_cpu_ms_per_rollout', 'batch', '.2f')} "
                    f"| {ratio('rollouts_per_s', b):.2f} -> {ratio('rollouts_per_s', a):.2f} "
                    f"| {ratio('server_cpu_ms_per_rollout', b):.2f} -> "
                    f"{ratio('server_cpu_ms_per_rollout', a):.2f} |"
                )
    return "\n".join(lines) + "\n"


def profile(
    backend: str,
    kind: str,
    clients: int,
    n: int,
    out: Path,
    batch: bool = False,
    env: dict[str, str] | None = None,
) -> str:
    """py-spy (`pip install py-spy`; not a dependency) on ONE worker while `clients` post
    `n` rollouts: samples of the threads holding the GIL (what costs CPU), summarized as
    each function's inclusive share. The raw stacks go to `out`."""
    seeds = Seeds()
    with fresh_database(backend) as url, serve(url, env, workers=1) as (base, pid):
        measure(base, pid, seeds.take(kind, 40), 4, batch=False)  # warm-up
        spy = subprocess.Popen(
            [str(Path(TRACESTORE).parent / "py-spy"), "record", "-p", str(pid), *SPY, str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.5)
        figures = measure(base, pid, seeds.take(kind, n), clients, batch=batch)
        spy.send_signal(2)
        spy.wait(60)
    shares: dict[str, int] = {}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        for name in {frame.split(" (")[0] for frame in stack.split(";")}:
            shares[name] = shares.get(name, 0) + int(count)
    head = (
        f"{backend} {CORPUS_NAMES[kind]}, {'batches' if batch else 'single posts'}, "
        f"{clients} clients, 1 worker: {figures['rollouts_per_s']:.0f} rollouts/s, server CPU "
        f"{figures['server_cpu_ms_per_rollout']:.2f} ms/rollout; {total} samples holding the GIL"
    )
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:60]
    return "\n".join([head, *(f"{100 * c / total:5.1f}%  {name}" for name, c in top)])


def main(argv: Sequence[str] | None = None) -> None:
    """Run, write bench/results/<out>.{json,md}, print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench concurrency", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_const", const="quick", dest="size")
    group.add_argument("--full", action="store_const", const="full", dest="size")
    parser.add_argument("--db", default="both", choices=["sqlite", "postgresql", "both"])
    parser.add_argument("--out", default=None, help="result name (bench/results/NAME.*)")
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for the server (repeatable)"
    )
    parser.add_argument(
        "--clients", type=int, nargs="*", help="client counts (default: the size's)"
    )
    parser.add_argument(
        "--corpus", nargs="*", choices=["multi", "single"], default=["multi", "single"]
    )
    parser.add_argument(
        "--compare", default=None, help="a previous result's NAME: a before/after table"
    )
    parser.add_argument(
        "--profile", default=None, help="FILE: py-spy one worker instead (see profile())"
    )
    parser.add_argument("--batch", action="store_true", help="with --profile: batches of 50")
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        help="post this many times the size's rollouts in each measurement: longer runs, "
        "steadier figures (at 1 a 1.2 KB measurement lasts ~1-2 s, and its ratios swing by "
        "20-40%% between runs on a shared machine)",
    )
    parser.add_argument(
        "--stored",
        type=int,
        default=None,
        help="rollouts stored before the measurements (default: the size's; 0: an empty "
        "store, whose never-analyzed tables PostgreSQL scans whole for each look-up)",
    )
    args = parser.parse_args(argv)
    if args.stored is not None and args.stored < 0:
        parser.error("--stored must be 0 or more")
    if args.scale < 1:
        parser.error("--scale must be 1 or more")
    if bad := [item for item in args.env if "=" not in item]:
        parser.error(f"--env {bad[0]}: give NAME=VALUE")
    env = dict(item.split("=", 1) for item in args.env)
    if args.profile:
        print(
            profile(
                "sqlite" if args.db == "both" else args.db,
                args.corpus[0],
                (args.clients or [32])[0],
                args.scale * (1500 if args.corpus[0] == "single" else 300),
                Path(args.profile),
                batch=args.batch,
                env=env,
            )
        )
        return
    if args.compare and not (RESULTS / f"{args.compare}.json").exists():
        parser.error(f"--compare {args.compare}: no bench/results/{args.compare}.json")
    size = args.size or "full"
    backends = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    if "postgresql" in backends and not pg_available():
        print("PostgreSQL is unreachable: measuring SQLite only")
        backends.remove("postgresql")
    results = run(
        size,
        backends,
        env,
        clients=args.clients,
        kinds=args.corpus,
        scale=args.scale,
        stored_rollouts=args.stored,
    )
    name = args.out or ("concurrency" if size == "full" else f"concurrency-{size}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2))
    text = markdown(results)
    if args.compare:
        before = json.loads((RESULTS / f"{args.compare}.json").read_text())
        text += f"\nBefore ({args.compare}, {before['started']}) -> after ({name}):\n\n"
        text += compare(before, results)
    (RESULTS / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
