"""`python -m bench all --quick|--full`: every measurement, on SQLite and PostgreSQL.

Writes bench/results/<size>.json and <size>.md (a Markdown table with each figure and its
ratio to the floor measured in the same run) and prints the table. See bench/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench import concurrency, fetch, ingest_breakdown, lookup, memory
from bench import ingest as ingest_bench
from bench.common import fresh_database, pg_available
from bench.corpus import corpus
from bench.ingest_examples import size_on_disk

RESULTS = Path(__file__).resolve().parent / "results"

SIZES: dict[str, dict[str, Any]] = {
    "quick": {
        "multi": 30,
        "single": 200,
        "http": [(1, 50), (2, 50), (2, 1)],
        "lookup_runs": [100_000],
        "lookup_samples": 300,
        "fetch_samples": 40,
        "memory_bytes": 10_000_000,
        "ingest_repeats": 1,
    },
    "full": {
        "multi": 300,
        "single": 3000,
        "http": [(1, 50), (2, 50), (1, 1), (2, 1)],
        "lookup_runs": [100_000, 1_000_000],
        "lookup_samples": 2000,
        "fetch_samples": 200,
        "memory_bytes": 50_000_000,
        "ingest_repeats": 3,
    },
}


def _steps(docs: list[bytes]) -> int:
    return sum(len(t["steps"]) for d in docs for t in orjson.loads(d)["trajectories"])


def _disk(backend: str, docs: list[bytes]) -> dict[str, float]:
    with fresh_database(backend) as url:
        empty = size_on_disk(url)
        ingest_bench.in_process(url, docs, batch=50)
        disk = size_on_disk(url) - empty
    raw = sum(map(len, docs))
    return {
        "raw_bytes_per_rollout": raw / len(docs),
        "gzip_bytes_per_rollout": sum(len(gzip.compress(d)) for d in docs) / len(docs),
        "disk_bytes_per_rollout": disk / len(docs),
        "disk_to_raw": disk / raw,
    }


def run_all(size: str, backends: list[str]) -> dict[str, Any]:
    """Every measurement at `size` on `backends`."""
    cfg = SIZES[size]
    corpora = {"multi": corpus("multi", cfg["multi"]), "single": corpus("single", cfg["single"])}
    out: dict[str, Any] = {
        "size": size,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": __import__("os").cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "corpora": {
            k: {"n": len(v), "mean_bytes": statistics.mean(map(len, v)), "steps": _steps(v)}
            for k, v in corpora.items()
        },
        "results": {},
    }
    for backend in backends:
        r: dict[str, Any] = {}
        t0 = time.perf_counter()
        for name, docs in corpora.items():
            r[f"ingest_{name}"] = ingest_bench.run(
                backend, docs, _steps(docs), cfg["http"], repeats=cfg["ingest_repeats"]
            )
            r[f"disk_{name}"] = _disk(backend, docs)
        for n in cfg["lookup_runs"]:
            with fresh_database(backend) as url:
                lookup.fill(url, n)
                r[f"lookup_{n}"] = lookup.measure(url, n, cfg["lookup_samples"])
        with fresh_database(backend) as url:
            r["fetch"] = fetch.measure(url, cfg["fetch_samples"])
        with fresh_database(backend) as url:
            r["memory"] = memory.measure(url, cfg["memory_bytes"])
        r["seconds"] = time.perf_counter() - t0
        out["results"][backend] = r
    # Where in-process ingest time goes (parse, prepare, write), next to the floor.
    out["breakdown"] = ingest_breakdown.run(
        backends, n_multi=min(cfg["multi"], 100), n_single=min(cfg["single"], 1000)
    )
    # Many concurrent single posts next to the batch route (issue 19).
    out["concurrency"] = concurrency.run(size, backends)
    # The DuckDB reports benchmark (live store vs Parquet snapshot) runs as its own process.
    args = [sys.executable, "-m", "bench.reports_bench"]
    args += ["--quick"] if size == "quick" else []
    args += [] if "postgresql" in backends else ["--no-pg"]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    out["reports"] = {"exit_status": done.returncode, "markdown": done.stdout}
    out["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    return out


def table(results: dict[str, Any]) -> str:
    """The results as Markdown: each figure next to its floor and the ratio."""
    lines = [
        f"Size `{results['size']}`, {results['started']} to {results['finished']}, "
        f"{results['machine']['cpus']} CPUs, Python {results['machine']['python']}.",
        "",
        "| database | measurement | figure | floor | ratio to floor |",
        "|---|---|---|---|---|",
    ]
    for backend, r in results["results"].items():
        for name in ("multi", "single"):
            ing = r[f"ingest_{name}"]
            floor = ing["floor"]
            for mode, fig in ing.items():
                if mode == "floor":
                    continue
                lines.append(
                    f"| {backend} | ingest {name} {mode} | {fig['rollouts_per_s']:.0f} rollouts/s, "
                    f"{fig['steps_per_s']:.0f} steps/s, {fig['mb_per_s']:.1f} MB/s | "
                    f"{floor['rollouts_per_s']:.0f} rollouts/s | {fig['ratio_to_floor']:.2f} |"
                )
            d = r[f"disk_{name}"]
            lines.append(
                f"| {backend} | bytes on disk per {name} rollout | "
                f"{d['disk_bytes_per_rollout']:.0f} B (gzip {d['gzip_bytes_per_rollout']:.0f} B) | "
                f"raw JSON {d['raw_bytes_per_rollout']:.0f} B | {d['disk_to_raw']:.2f} |"
            )
        for key, look in r.items():
            if not key.startswith("lookup_"):
                continue
            n = key.split("_")[1]
            for kind in ("cid", "run_id"):
                floor = look[f"floor_{kind}"]
                for where in ("in_process", "http"):
                    fig = look[f"{where}_{kind}"]
                    lines.append(
                        f"| {backend} | look-up by {kind} at {int(n):,} runs, {where} | "
                        f"p50 {fig['p50_ms']:.3f} ms, p99 {fig['p99_ms']:.3f} ms | "
                        f"p99 {floor['p99_ms']:.3f} ms | {fig['p99_ratio_to_floor']:.1f} (p99) |"
                    )
        for name, f in r["fetch"].items():
            http, floor = f["http"], f["floor_file"]
            lines.append(
                f"| {backend} | GET whole rollout {name} | p50 {http['p50_ms']:.2f} ms, "
                f"p99 {http['p99_ms']:.2f} ms | file read p50 {floor['p50_ms']:.3f} ms "
                f"| {http['p50_ratio_to_floor']:.0f} (p50) |"
            )
        m = r["memory"]
        lines.append(
            f"| {backend} | peak memory ingesting one {m['bytes'] / 1e6:.0f} MB rollout | "
            f"{m['peak_growth_bytes'] / 1e6:.0f} MB | document size | "
            f"{m['multiple_of_size']:.1f}x |"
        )
    lines += ["", "Targets (issue 6):", "", targets(results)]
    if results.get("breakdown"):
        lines += [
            "",
            "In-process ingest per rollout, batches of 50 (`python -m bench.ingest_breakdown`):",
            "",
            ingest_breakdown.markdown(results["breakdown"]),
        ]
    if results.get("concurrency"):
        lines += [
            "",
            "Concurrent single posts next to the batch route (`python -m bench concurrency`):",
            "",
            concurrency.markdown(results["concurrency"]),
        ]
    if results.get("reports"):
        lines += ["", results["reports"].get("markdown", "")]
    return "\n".join(lines) + "\n"


def _report_seconds(markdown: str) -> dict[str, dict[str, float]]:
    """Seconds per report and source from the reports benchmark's table."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    if len(lines) < 3:
        return {}
    sources = [cell.strip() for cell in lines[0].strip("|").split("|")][1:]
    out: dict[str, dict[str, float]] = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].startswith("("):
            continue  # (open DuckDB)
        out[cells[0]] = {
            src: float(v.split()[0]) for src, v in zip(sources, cells[1:], strict=True)
        }
    return out


def targets(results: dict[str, Any]) -> str:
    """Issue 6's targets, each with the figure of this run and whether it is met."""
    rows: list[tuple[str, str, str, bool]] = []
    for backend, r in results["results"].items():
        for name in ("multi", "single"):
            ing = r[f"ingest_{name}"]
            for mode in ("in_process_single", "in_process_batch"):
                ratio = ing[mode]["ratio_to_floor"]
                rows.append(
                    (
                        "in-process ingest >= 0.5x floor",
                        f"{backend} {name} {mode}",
                        f"{ratio:.2f}x",
                        ratio >= 0.5,
                    )
                )
            if backend == "postgresql":
                for mode in ("http_2w_batch", "http_2w_single"):
                    ratio = ing[mode]["ratio_to_floor"]
                    rows.append(
                        (
                            "HTTP ingest, 2 workers, PostgreSQL >= 0.3x floor",
                            f"{name} {mode}",
                            f"{ratio:.2f}x",
                            ratio >= 0.3,
                        )
                    )
            disk = r[f"disk_{name}"]["disk_to_raw"]
            rows.append(
                ("bytes on disk <= 1.0x raw JSON", f"{backend} {name}", f"{disk:.2f}x", disk <= 1.0)
            )
        for key, look in r.items():
            if key.startswith("lookup_"):
                n = int(key.split("_")[1])
                ratio = look["in_process_cid"]["p99_ratio_to_floor"]
                rows.append(
                    (
                        "cid look-up p99 <= 2x bare SELECT, in-process",
                        f"{backend} {n:,} runs",
                        f"{ratio:.1f}x",
                        ratio <= 2,
                    )
                )
                if n >= 1_000_000:
                    p99 = look["http_cid"]["p99_ms"]
                    rows.append(
                        (
                            "cid look-up p99 <= 5 ms over HTTP at 1,000,000 runs",
                            backend,
                            f"{p99:.2f} ms",
                            p99 <= 5,
                        )
                    )
        mem = r["memory"]["multiple_of_size"]
        rows.append(("peak memory <= 6x a 50 MB rollout", backend, f"{mem:.1f}x", mem <= 6))
    reports = _report_seconds(results.get("reports", {}).get("markdown", ""))
    for report, by_source in reports.items():
        snap = by_source.get("Parquet snapshot")
        for source, seconds in by_source.items():
            if source != "Parquet snapshot" and snap:
                ratio = seconds / snap
                rows.append(
                    (
                        "report on the live store <= 2x the snapshot",
                        f"{report}, {source}",
                        f"{ratio:.1f}x",
                        ratio <= 2,
                    )
                )
    lines = ["| target | where | this run | met |", "|---|---|---:|---|"]
    lines += [f"| {t} | {w} | {v} | {'yes' if ok else '**no**'} |" for t, w, v, ok in rows]
    return "\n".join(lines)


def main() -> None:
    """Parse arguments, run, write and print the results."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    if sys.argv[1:2] == ["concurrency"]:
        concurrency.main(sys.argv[2:])
        return
    parser.add_argument("what", choices=["all", "concurrency"], help="what to run")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_const", const="quick", dest="size")
    group.add_argument("--full", action="store_const", const="full", dest="size")
    parser.add_argument("--db", default="both", choices=["sqlite", "postgresql", "both"])
    args = parser.parse_args()
    size = args.size or "quick"
    backends = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    if "postgresql" in backends and not pg_available():
        print("PostgreSQL is unreachable: measuring SQLite only")
        backends = [b for b in backends if b != "postgresql"]
    results = run_all(size, backends)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{size}.json").write_text(json.dumps(results, indent=2))
    markdown = table(results)
    (RESULTS / f"{size}.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
