"""How fast the inspector's run page shows a long rollout (issue 12).

A 5,000-step dual-serialized Crafter-style rollout (bench/corpus.py's multi_step: each
step an LM call with its call record, an environment event and two messages, both lists
of a full trace; ~27 MB of JSON), with one reward drift at step 4,321, is stored through
a running `tracestore serve`. Then, each measured cold and warm (median of `--repeats`):

- `server`: GET /runs/{run_id}, the first screen's HTML (header, drift, the reward chart
  of all 5,000 steps, the first page of steps), time to the last byte;
- `server_drift_step`: the page holding the drifting step (`?step=4321`);
- `browser`: a real Chromium (scripts/ensure-chromium) loading the page: navigation start
  to the load event (HTML, CSS and script fetched, parsed, laid out), and to first
  contentful paint.

The target is under a second for the first screen on this machine. Run:

    .venv/bin/python -m bench.inspector_render [--steps 5000] [--db sqlite|postgresql]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import fresh_database, server
from bench.corpus import multi_step
from tracestore.api.body import parsed_estimate
from tracestore.settings import Settings

RESULTS = Path(__file__).resolve().parent / "results"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TARGET_SECONDS = 1.0


def long_rollout(n_steps: int, drift_at: int | None = None, seed: int = 12) -> dict[str, Any]:
    """A dual-serialized rollout of `n_steps` steps; with `drift_at`, the trace's reward of
    that step differs from the trajectory's (one reward_mismatch finding)."""
    doc = multi_step(seed, n_steps)
    doc["run_id"] = f"long-{n_steps}-{seed}"
    if drift_at is not None:
        step = doc["trajectories"][0]["steps"][drift_at]
        trace_reward = 0.25 if step["reward"] != 0.25 else 0.75
        # The same event object sits in its time step and in the history list.
        for event in doc["trace"]["session_time_steps"][drift_at]["events"]:
            if "reward" in event:
                event["reward"] = trace_reward
        rewards = [e["reward"] for e in doc["trace"]["event_history"] if "reward" in e]
        doc["metrics"]["episode_returns"] = [sum(rewards)]
        doc["metrics"]["mean_return"] = sum(rewards)
    return doc


def _timed_get(client: httpx.Client, path: str) -> tuple[float, int]:
    started = time.perf_counter()
    response = client.get(path)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, len(response.content)


def _browser(url: str, repeats: int) -> dict[str, float | None] | None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path(CHROMIUM).exists():
        return None
    loads, paints = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for _ in range(repeats):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(url, wait_until="load")
                timing = page.evaluate(
                    "() => { const n = performance.getEntriesByType('navigation')[0];"
                    " const p = performance.getEntriesByName('first-contentful-paint')[0];"
                    " return {load: n.loadEventEnd - n.startTime,"
                    " paint: p ? p.startTime : null}; }"
                )
                loads.append(timing["load"] / 1000)
                if timing["paint"] is not None:
                    paints.append(timing["paint"] / 1000)
                page.close()
        finally:
            browser.close()
    return {
        "load_s": statistics.median(loads),
        "first_paint_s": statistics.median(paints) if paints else None,
    }


def measure(backend: str, n_steps: int, repeats: int) -> dict[str, Any]:
    """Store the long rollout through a live server and time its run page."""
    doc = long_rollout(n_steps, drift_at=min(4321, n_steps - 1))
    raw = orjson.dumps(doc)
    # The parsed-size estimate assumes the worst text (docs/RELIABILITY.md): a real
    # rollout this long passes the default limit, so the server is given what it takes,
    # as an operator storing such rollouts would (TRACESTORE_MAX_PARSED_BYTES).
    max_parsed = max(Settings.model_construct().max_parsed_bytes, parsed_estimate(raw))
    with (
        fresh_database(backend) as url,
        server(url, TRACESTORE_MAX_PARSED_BYTES=str(max_parsed)) as base,
        httpx.Client(base_url=base, timeout=600) as client,
    ):
        started = time.perf_counter()
        posted = client.post(
            "/v1/rollouts", content=raw, headers={"Content-Type": "application/json"}
        )
        posted.raise_for_status()
        ingest_s = time.perf_counter() - started
        path = "/runs/" + doc["run_id"]
        cold, size = _timed_get(client, path)
        warm = statistics.median(_timed_get(client, path)[0] for _ in range(repeats))
        drift_step = min(4321, n_steps - 1)
        drift = statistics.median(
            _timed_get(client, f"{path}?step={drift_step}")[0] for _ in range(repeats)
        )
        browser = _browser(base + path, repeats)
    out: dict[str, Any] = {
        "backend": backend,
        "steps": n_steps,
        "document_bytes": len(raw),
        "max_parsed_bytes": max_parsed,
        "ingest_s": ingest_s,
        "server_first_screen_cold_s": cold,
        "server_first_screen_s": warm,
        "server_drift_step_s": drift,
        "html_bytes": size,
        "target_s": TARGET_SECONDS,
    }
    if browser is not None:
        out["browser_load_s"] = browser["load_s"]
        out["browser_first_paint_s"] = browser["first_paint_s"]
    shown = out.get("browser_load_s", warm)
    out["met"] = shown < TARGET_SECONDS and cold < TARGET_SECONDS
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure and print (and write bench/results/inspector-<db>.json, or --out)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="where the JSON goes (bench/results/ by default)")
    args = parser.parse_args(argv)
    result = measure(args.db, args.steps, args.repeats)
    out = args.out or RESULTS / f"inspector-{args.db}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for key, value in result.items():
        shown = f"{value:.3f}" if isinstance(value, float) else value
        print(f"{key:32} {shown}")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
