"""Running the producer's code (synth-ai 0.2.23) from the test process.

The producer lives in its own venv (scripts/synth-venv): its dependency set (pydantic,
SQLAlchemy, FastAPI versions of its own) must not meet tracestore's. Two scripts run
there and talk JSON over stdin/stdout: judge.py (synth-ai's consumers on documents) and
crafter_app.py (the registered grpo-crafter task app, served offline, producing rollouts).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SYNTH_VENV_SCRIPT = ROOT / "scripts" / "synth-venv"
REQUIRE_ENV = "TRACESTORE_TEST_REQUIRE_SYNTH"
# scripts/test builds the venv before pytest starts and passes on the result, so a
# failed build (no PyPI) is not retried by every test session of the same run.
PYTHON_ENV = "TRACESTORE_SYNTH_PYTHON"
PROBLEM_ENV = "TRACESTORE_SYNTH_PROBLEM"

# The task app's rollouts: a few seeds of a few steps keep the suite near a minute.
CRAFTER_SEEDS = (0, 1, 2)
CRAFTER_STEPS = 4


class SynthUnavailable(RuntimeError):
    """The producer's venv could not be built (its reason is the message)."""


def synth_required() -> bool:
    """True when the producer's venv must be there (CI): its absence is an error."""
    return os.environ.get(REQUIRE_ENV) == "1"


def build_synth_venv(timeout: float = 1800) -> Path:
    """The producer venv's python, building the venv first when needed."""
    if os.environ.get(PROBLEM_ENV):
        raise SynthUnavailable(os.environ[PROBLEM_ENV])
    given = os.environ.get(PYTHON_ENV)
    if given and Path(given).is_file():
        return Path(given)
    try:
        done = subprocess.run(
            [str(SYNTH_VENV_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SynthUnavailable(f"scripts/synth-venv did not run: {exc}") from exc
    python = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not Path(python).is_file():
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise SynthUnavailable(f"scripts/synth-venv failed ({done.returncode}): {tail}")
    return Path(python)


@dataclass
class Producer:
    """The producer venv's python and the time spent in it, per script."""

    python: Path
    seconds: dict[str, float] = field(default_factory=dict)

    def _run(self, script: str, request: dict[str, Any], timeout: float) -> Any:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        started = time.monotonic()
        done = subprocess.run(
            [str(self.python), str(HERE / script)],
            input=orjson.dumps(request),
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
        )
        self.seconds[script] = self.seconds.get(script, 0.0) + time.monotonic() - started
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace")[-4000:]
            raise RuntimeError(f"{script} exited {done.returncode}:\n{tail}")
        return orjson.loads(done.stdout)

    def judge(self, documents: dict[str, dict[str, Any]], judges: list[str] | None = None) -> Any:
        """synth-ai's consumers on each document: {id: verdict}, plus producer versions."""
        request = {
            "documents": [{"id": ident, "doc": doc} for ident, doc in documents.items()],
            "judges": judges,
        }
        answer = self._run("judge.py", request, timeout=600)
        return {v["id"]: v for v in answer["verdicts"]}, answer["producer"]

    def synth_tracer(self, request: dict[str, Any]) -> Any:
        """synth-ai's own tracer writing (or reading back) its trace database (synth_tracer.py)."""
        return self._run("synth_tracer.py", request, timeout=900)

    def crafter_rollouts(
        self,
        seeds: tuple[int, ...],
        steps: int,
        tracestore_url: str | None,
        trace_db: Path | None = None,
    ) -> dict[str, Any]:
        """Rollouts of the real grpo-crafter task app (see crafter_app.py); with `trace_db`,
        the app's own trace database is copied there."""
        request = {
            "seeds": list(seeds),
            "steps": steps,
            "tracestore_url": tracestore_url,
            "trace_db": str(trace_db) if trace_db is not None else None,
        }
        result: dict[str, Any] = self._run("crafter_app.py", request, timeout=600)
        return result
