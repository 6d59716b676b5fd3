"""Fixtures of the inspector's tests: a store holding the examples (and a long run, and a
second run of one cid), a real `tracestore serve` over it, and a real Chromium."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.inspector_render import long_rollout
from tests.conftest import Database, Example, _PgDatabases, new_database
from tests.drift.helpers import ingest_examples
from tests.reliability.harness import ServerProcess
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_bytes

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "inspector"
CHROMIUM = os.environ.get("TRACESTORE_CHROMIUM", "/usr/bin/chromium")
# This machine's network is closed: nothing in the background may try to reach it.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LONG_STEPS = 1200
LONG_DRIFT_AT = 1111
# A run that shares its cid with an example's (a retry under a new run_id): the cid then
# names two runs, and a look-up by it leads to the correlation page.
SHARED_CID_SOURCE = "run-1001-00003-626fda73"
SHARED_CID_RUN = "run-1001-00003-626fda73-retry"


@dataclass(frozen=True)
class Store:
    """A database holding the examples, the long run and the shared-cid run."""

    db: Database
    long_run_id: str
    shared_cid: str


def extra_rollouts(examples: list[Example]) -> tuple[list[bytes], str, str]:
    """The long run and a second run of an example's cid, as bytes; their ids."""
    long_doc = long_rollout(LONG_STEPS, drift_at=LONG_DRIFT_AT)
    source = next(e for e in examples if e.label["run_id"] == SHARED_CID_SOURCE)
    twin = copy.deepcopy(source.doc)
    twin["run_id"] = SHARED_CID_RUN
    return (
        [orjson.dumps(long_doc), orjson.dumps(twin)],
        long_doc["run_id"],
        source.label["correlation_id"],
    )


def fill(url: str, examples: list[Example]) -> Store:
    """Migrate the database at `url` and store the examples and the extra runs."""
    engine = create_engine(url)
    try:
        migrate.upgrade(engine)
        ingest_examples(engine, examples)
        raws, long_id, cid = extra_rollouts(examples)
        for raw in raws:
            assert ingest_bytes(engine, raw).status == "created"
    finally:
        engine.dispose()
    return Store(Database("", url), long_id, cid)


@pytest.fixture(scope="module")
def store(
    backend: str,
    tmp_path_factory: pytest.TempPathFactory,
    pg_databases: _PgDatabases | None,
    examples: list[Example],
) -> Store:
    """A database of `backend` with the examples and the extra runs (one per module)."""
    db = new_database(backend, "inspector", tmp_path_factory, pg_databases)
    filled = fill(db.url, examples)
    return Store(db, filled.long_run_id, filled.shared_cid)


@pytest.fixture(scope="module")
def served(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`tracestore serve` over the store, without keys."""
    log = tmp_path_factory.mktemp("served") / "server.log"
    with ServerProcess(store.db.url, log) as server:
        yield server


def chromium_path() -> str:
    """The Chromium binary; skip (or, in CI, fail) with the fix when it or Playwright is
    missing."""
    problem = None
    if not os.access(CHROMIUM, os.X_OK):
        problem = (
            f"Chromium not found at {CHROMIUM}: run scripts/ensure-chromium "
            "(apt-get install chromium) or set TRACESTORE_CHROMIUM"
        )
    try:
        import playwright.sync_api  # noqa: F401  (only whether it is installed)
    except ImportError:
        problem = "the playwright package is missing: pip install -e '.[dev]'"
    if problem is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    return CHROMIUM


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium driven by Playwright (the system's Chromium: no download)."""
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


class Console:
    """What a page logged: console errors and warnings, uncaught exceptions, failed or
    outside requests. A test asserts it stays empty."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.problems: list[str] = []

    def watch(self, page: Any) -> Any:
        """Record `page`'s problems; returns the page."""
        page.on(
            "console",
            lambda m: (
                self.problems.append(f"console {m.type}: {m.text} at {page.url}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e} at {page.url}"))
        # ERR_ABORTED: the browser cancelled the request itself, leaving the page (a favicon
        # still loading when a test clicks on): no failure of the server's.
        page.on(
            "requestfailed",
            lambda r: (
                self.problems.append(f"request failed: {r.url} ({r.failure})")
                if "ERR_ABORTED" not in (r.failure or "")
                else None
            ),
        )
        page.on(
            "request",
            lambda r: (
                self.problems.append(f"request outside the server: {r.url}")
                if not r.url.startswith((self.base, "blob:", "data:", "about:"))
                else None
            ),
        )
        return page


def screenshot(page: Any, name: str, backend: str) -> Path:
    """Keep a screenshot of `page` as a test artifact; returns its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}-{backend}.png"
    page.screenshot(path=str(path), full_page=False)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path
