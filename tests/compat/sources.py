"""The two sources of rollouts: the examples, and the real grpo-crafter task app's rollouts."""

from __future__ import annotations

import json
from typing import Any

from tests.compat.baseline import Run
from tests.compat.harness import CRAFTER_SEEDS, CRAFTER_STEPS, Producer
from tests.conftest import EXAMPLES
from tracestore.client import TracestoreClient


def example_runs() -> list[Run]:
    """One run per distinct run_id of examples/rollouts.jsonl (first occurrence)."""
    labels = [json.loads(x) for x in (EXAMPLES / "labels.jsonl").read_text().splitlines()]
    runs: dict[str, Run] = {}
    lines = (EXAMPLES / "rollouts.jsonl").read_bytes().splitlines()
    for raw, label in zip(lines, labels, strict=True):
        doc = json.loads(raw)
        if doc["run_id"] not in runs:
            runs[doc["run_id"]] = Run(doc["run_id"], doc, label.get("expected_steps"))
    return list(runs.values())


def post_runs(url: str, runs: list[Run]) -> None:
    """Post the runs through tracestore's client (one batch); record each status."""
    with TracestoreClient(url) as store:
        result = store.post_batch([r.doc for r in runs])
    for run, item in zip(runs, result["results"], strict=True):
        run.post_status = item.get("status")


def crafter_runs(producer: Producer, url: str) -> tuple[list[Run], dict[str, Any]]:
    """Rollouts of the real task app, posted to `url` through tracestore's client.

    From the producer's process when the light client is installed in its venv (as a
    task app would), else from this process with the JSON the app returned.
    """
    out = producer.crafter_rollouts(CRAFTER_SEEDS, CRAFTER_STEPS, url)
    runs = [Run(doc["run_id"], doc) for doc in out["rollouts"]]
    if out["posted"] is None:
        with TracestoreClient(url) as store:
            posted = [store.post_rollout(r.doc) for r in runs]
        out["posted_from"] = "test process"
    else:
        posted = out["posted"]
        out["posted_from"] = "task app process"
    for run, result in zip(runs, posted, strict=True):
        run.post_status = result.get("status")
        run.post_repeats = result.get("repeats")
    return runs, out
