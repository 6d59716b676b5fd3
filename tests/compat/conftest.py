"""Fixtures of the compatibility suite (issue 11): the producer's venv, a live server, figures.

The producer's code (synth-ai 0.2.23) runs in its own venv, built on first use by
scripts/synth-venv. When it cannot be built (no PyPI), the suite's tests are skipped and
the run says so loudly, unless TRACESTORE_TEST_REQUIRE_SYNTH=1 (as in CI), which makes
it an error. The figures the issue asks for are printed at the end of the run and written
to test-artifacts/compat-baseline.json.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.compat.baseline import Figures, Run, measure, table
from tests.compat.harness import (
    ROOT,
    Producer,
    SynthUnavailable,
    build_synth_venv,
    synth_required,
)
from tests.compat.sources import crafter_runs, example_runs, post_runs
from tests.reliability.harness import ServerProcess

SOURCES = ("examples", "crafter")
_state: dict[str, Any] = {"problem": None, "figures": {}, "notes": {}}


def _report_path() -> Path:
    default = ROOT / "test-artifacts" / "compat-baseline.json"
    return Path(os.environ.get("TRACESTORE_COMPAT_REPORT", default))


@pytest.fixture(scope="session")
def producer(pytestconfig: pytest.Config) -> Producer:
    """The producer venv's python (built on first use); skipped or failed when impossible."""
    capture: Any = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\ncompat: locating the producer's venv (scripts/synth-venv)", flush=True)
    try:
        return Producer(build_synth_venv())
    except SynthUnavailable as exc:
        _state["problem"] = problem = str(exc)
    if synth_required():
        pytest.fail(
            f"the producer's venv is required (TRACESTORE_TEST_REQUIRE_SYNTH=1) but could not "
            f"be built: {problem}",
            pytrace=False,
        )
    pytest.skip(f"the producer's venv (synth-ai) could not be built: {problem}")


@pytest.fixture(scope="session")
def compat_server(
    producer: Producer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A `tracestore serve` process on a new SQLite store, for both sources."""
    # SQLite only: the conversions are pure and served from the stored document; which
    # database holds it is covered by the store and API suites.
    tmp = tmp_path_factory.mktemp("compat")
    with ServerProcess(f"sqlite:///{tmp / 'store.db'}", tmp / "server.log") as server:
        yield server


class Measured:
    """Each source's runs, fetched from the server and judged by synth-ai, once."""

    def __init__(self, producer: Producer, server: ServerProcess) -> None:
        self.producer = producer
        self.server = server
        self.done: dict[str, tuple[list[Run], Figures]] = {}

    def get(self, source: str) -> tuple[list[Run], Figures]:
        """The runs and figures of `source` ('examples' or 'crafter')."""
        if source not in self.done:
            if source == "examples":
                runs = example_runs()
                post_runs(self.server.url, runs)
            else:
                runs, out = crafter_runs(self.producer, self.server.url)
                _state["notes"]["crafter"] = {
                    "seeds": [r["env"]["seed"] for r in out["requests"]],
                    "steps": out["requests"][0]["env"]["config"]["env_params"],
                    "rollout_seconds": out["seconds"],
                    "app_build_seconds": out["app_build_seconds"],
                    "policy_calls": len(out["policy_calls"]),
                    "posted_from": out["posted_from"],
                }
            with httpx.Client(base_url=self.server.url, timeout=120) as http:
                figures, versions = measure(source, runs, http, self.producer)
            _state["notes"]["producer"] = versions
            _state["figures"][source] = figures
            self.done[source] = (runs, figures)
        return self.done[source]


@pytest.fixture(scope="session")
def measured(producer: Producer, compat_server: ServerProcess) -> Measured:
    """Lazily measured sources (a test of one source does not pay for the other)."""
    return Measured(producer, compat_server)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _state["problem"] and not synth_required():
        terminalreporter.write_line(
            f"WARNING: the producer's venv (synth-ai) could not be built "
            f"({_state['problem'].splitlines()[0]}); the compatibility suite was SKIPPED.",
            red=True,
            bold=True,
        )
    figures: dict[str, Figures] = _state["figures"]
    if not figures:
        return
    ordered = [figures[s] for s in SOURCES if s in figures]
    terminalreporter.section("compat: synth-ai's consumers on what tracestore serves")
    for line in table(ordered).splitlines():
        terminalreporter.write_line(line)
    for name, note in _state["notes"].items():
        terminalreporter.write_line(f"{name}: {note}")
    path = _report_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"notes": _state["notes"], "sources": [f.as_dict() for f in ordered]}
    path.write_text(json.dumps(body, indent=2, default=str) + "\n")
    terminalreporter.write_line(f"compat figures: {path}")
