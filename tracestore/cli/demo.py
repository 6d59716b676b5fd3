"""`tracestore demo`: fill a store (or a running server) with the example rollouts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from tracestore.cli.common import DbOption, console, fail, reported_errors, store_url
from tracestore.cli.ingest import ApiKeyOption, Tally, UrlOption, send
from tracestore.cli.remote import server_url
from tracestore.ingest.files import FileItem, iter_file

EXAMPLES_FILE = "rollouts.jsonl"
# The shapes a newcomer should see one of, in the order they are shown.
SHAPES = (
    ("full", "full trace and trajectories"),
    ("wrapped", "wrapped trace and trajectories"),
    ("summary", "summary trace and trajectories"),
    ("legacy", "trajectories only (trace null)"),
    ("trace_only", "trace only (trajectories: []; served converted from the trace)"),
)


def examples_dir() -> Path:
    """The example rollouts: shipped in the wheel, or at the top of a checkout."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "_examples"
    if (shipped / EXAMPLES_FILE).is_file():
        return shipped
    return package.parent / "examples"


def _shape(doc: dict[str, Any]) -> str | None:
    from tracestore.wire.trace import classify_trace

    kind = classify_trace(doc.get("trace"))
    if kind is None:
        return "legacy"
    if not doc.get("trajectories"):
        return "trace_only"
    return kind


@dataclass
class _Picks:
    """The smallest stored example of each shape, and the examples' correlation ids."""

    tally: Tally = field(default_factory=Tally)
    # shape -> (size, run_id): small documents are the ones worth printing on a terminal.
    smallest: dict[str, tuple[int, str]] = field(default_factory=dict)
    cids: dict[str, str] = field(default_factory=dict)  # run_id -> canonical cid

    def record(self, item: FileItem, status: str, reason: str | None) -> None:
        """Count one example's outcome and note it when it is stored."""
        self.tally.record(item, status, reason)
        if status not in ("created", "duplicate") or not isinstance(item.value, dict):
            return
        from tracestore.correlation import resolve_correlation

        doc = item.value
        shape, size = _shape(doc), len(item.raw)
        if shape is not None and (shape not in self.smallest or size < self.smallest[shape][0]):
            self.smallest[shape] = (size, doc["run_id"])
        cid = resolve_correlation(doc).correlation_id
        if cid is not None:
            self.cids.setdefault(doc["run_id"], cid)

    @property
    def runs(self) -> dict[str, str]:
        """shape -> run_id of the smallest example of that shape."""
        return {shape: run_id for shape, (_, run_id) in self.smallest.items()}

    def first_run(self) -> str | None:
        """The run to try first: the smallest with both a trace and trajectories, else any."""
        both = [self.smallest[s] for s in ("full", "wrapped") if s in self.smallest]
        return min(both or self.smallest.values(), default=(0, None))[1]

    def cid(self) -> tuple[str, str] | None:
        """A correlation id to look up, and its run: the first run's when it has one."""
        first = self.first_run()
        if first is not None and first in self.cids:
            return self.cids[first], first
        return next(((cid, run_id) for run_id, cid in self.cids.items()), None)


def _shown(db_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(db_url).render_as_string(hide_password=True)


def _next_steps(picks: _Picks, db: str | None, url: str | None) -> list[str]:
    first, cid = picks.first_run(), picks.cid()
    lines: list[str] = []
    if url:
        base = url.rstrip("/")
        if first:
            lines.append(f"curl -s {base}/v1/rollouts/{first}")
        if cid:
            lines.append(f"curl -s {base}/v1/correlations/{cid[0]}")
        if "trace_only" in picks.runs:
            lines.append(f"curl -s {base}/v1/rollouts/{picks.runs['trace_only']}/trajectories")
        lines.append(f"curl -s {base}/v1/drift")
        lines.append(f"open {base}/reports/drift and {base}/docs in a browser")
        return lines
    # Repeat --db only when it was given (the default store needs no flag); a password
    # stays off the screen.
    flag = f" --db {_shown(db)}" if db else ""
    if first:
        lines.append(f"tracestore show {first}{flag}")
    if cid:
        lines.append(f"tracestore cid {cid[0]}{flag}")
    lines.append(f"tracestore drift{flag}")
    lines.append(f"tracestore serve{flag}    (then open http://127.0.0.1:8000/docs)")
    return lines


def say(text: str) -> None:
    """Print one plain line (no highlighting, no wrapping: commands stay copyable)."""
    console.print(text, highlight=False, soft_wrap=True)


def demo(
    db: DbOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Fill the store with the example rollouts (every kind), so there is data to look at.

    A new SQLite file is created and migrated; --url posts them to a running server instead.

    Running it again is harmless: what it created is then a duplicate.

    Exit status: 0, or 2 when an example was refused as invalid.
    """
    url = server_url(db, url)  # TRACESTORE_URL when neither is given, as `ingest` takes it
    path = examples_dir() / EXAMPLES_FILE
    if not path.is_file():
        fail(f"the example rollouts are missing: {path} does not exist")
    picks = _Picks()
    with reported_errors():
        # The store's URL checked as every verb checks it (before naming it below).
        where = url or _shown(store_url(db, must_exist=False))
        say(f"tracestore demo: the example rollouts ({path}) into {where}")
        send(iter_file(path), picks.record, db=db, url=url, api_key=api_key)
    picks.tally.print()
    counts = picks.tally.counts
    if counts["conflict"] or counts["duplicate"]:
        say(
            "The examples repeat some run_ids on purpose: an exact retry is a duplicate, the "
            "same run_id with other content a conflict. Running the demo again is harmless: "
            "what it created is then a duplicate."
        )
    if picks.runs:
        say("\nOne rollout of each shape:")
        for shape, label in SHAPES:
            if shape in picks.runs:
                say(f"  {picks.runs[shape]}  {label}")
    cid = picks.cid()
    if cid is not None:
        say(f"A correlation id: {cid[0]} (of {cid[1]})")
    say("\nNext:")
    for line in _next_steps(picks, db, url):
        say(f"  {line}")
    if counts["invalid"]:
        raise typer.Exit(2)
