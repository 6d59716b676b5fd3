"""The README's task-app snippet runs as written and stores the rollout, spool included."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import LiveServer, free_port, minimal_rollout
from tracestore.client import RetryPolicy

README = Path(__file__).resolve().parents[2] / "README.md"


def _snippet() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Posting from a task app", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the section holds one Python block"
    return str(blocks[0])


def _episode(run_id: str) -> dict[str, Any]:
    return minimal_rollout(run_id)


def _task_app(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The snippet executed as a module of a task app, against `url`."""
    monkeypatch.setenv("TRACESTORE_URL", url)
    monkeypatch.delenv("TRACESTORE_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)  # the snippet's relative spool path lands here

    async def run_episode(request: dict[str, Any]) -> dict[str, Any]:
        return _episode(request["run_id"])

    namespace: dict[str, Any] = {"run_episode": run_episode, "__name__": "task_app"}
    exec(compile(_snippet(), str(README), "exec"), namespace)
    return namespace


def test_readme_snippet_stores_the_rollout(
    server: LiveServer, http: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _task_app(server.url, tmp_path, monkeypatch)
    returned = asyncio.run(app["rollout"]({"run_id": "readme-run"}))
    assert returned["run_id"] == "readme-run"
    stored = http.get("/v1/rollouts/readme-run")
    assert stored.status_code == 200
    assert orjson.loads(stored.content) == _episode("readme-run")


def test_readme_snippet_spools_while_the_store_is_down(
    server: LiveServer, http: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    app = _task_app(down, tmp_path, monkeypatch)
    # Give up on the dead server fast (the default retries for minutes).
    app["store"].retry = RetryPolicy(max_retries=1, backoff=0.01, max_time=5.0)
    asyncio.run(app["rollout"]({"run_id": "readme-spooled"}))
    assert (tmp_path / "rollouts.spool").stat().st_size > 0
    assert http.get("/v1/rollouts/readme-spooled").status_code == 404

    # The task app restarts with the store back: its next post delivers the spool too.
    app = _task_app(server.url, tmp_path, monkeypatch)
    asyncio.run(app["rollout"]({"run_id": "readme-after"}))
    for run_id in ("readme-spooled", "readme-after"):
        stored = http.get(f"/v1/rollouts/{run_id}")
        assert stored.status_code == 200, run_id
        assert orjson.loads(stored.content) == _episode(run_id)
