"""Rollouts from the producer's real task app: synth-ai's registered `grpo-crafter`, offline.

Run by the producer venv's python (scripts/synth-venv). It serves the app the way
`synth-ai serve grpo-crafter` does (the registered TaskAppEntry's config factory, then
synth_ai.task.server.create_task_app, then uvicorn) on 127.0.0.1 with tracing on (a
SQLite trace database in a temp dir), with an OpenAI-compatible stub policy on
127.0.0.1 in place of the model: it answers every chat completion with one valid
`interact_many` tool call (the tool the app's crafter-react policy declares). Then it
posts a RolloutRequest per seed to the app's /rollout, as a trainer does, with the
inference URL carrying a `?cid=`.

stdin:  {"seeds": [int], "steps": int, "tracestore_url": str | null, "trace_db": str | null}
stdout: {"rollouts": [RolloutResponse dicts], "seconds": [per rollout], "posted": [...]
         | null, "policy_calls": [{"path", "query", "tools", "n_messages"}], ...}
With tracestore_url and the light client (tracestore_client) installed in this venv, the
app's rollout handler also posts each rollout it returns, the one call the README asks a
task app to add; "posted" holds the client's results (null without the client).
With "trace_db", the app's own trace database (what its tracer wrote) is copied there.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

# The app's tracer commits (and fsyncs) every row: on a RAM disk when there is one.
_SHM = Path("/dev/shm")
_WORKDIR = Path(tempfile.mkdtemp(prefix="tracestore-crafter-", dir=_SHM if _SHM.is_dir() else None))
ENV_KEY = "compat-env-key"
MODEL = "compat-stub-policy"

# Set before any synth_ai import: importing synth_ai.task writes to /modal_volumes/ and a
# queue database otherwise; tracing on, into a SQLite file (not the default local sqld).
os.environ.setdefault("MATH_MODAL_DATASET_DIR", str(_WORKDIR / "math"))
os.environ.setdefault("EXPERIMENT_QUEUE_DB_PATH", str(_WORKDIR / "queue.db"))
os.environ["HOME"] = str(_WORKDIR / "home")
os.environ["TASKAPP_TRACING_ENABLED"] = "1"
os.environ["SYNTH_TRACES_DB"] = f"sqlite+aiosqlite:///{_WORKDIR / 'task_traces.db'}"
os.environ["ENVIRONMENT_API_KEY"] = ENV_KEY
os.environ["OPENAI_API_KEY"] = "sk-compat-stub"  # the app sends it to our stub only

# A short, fixed cycle of valid Crafter actions: the same episodes on every run (ids and
# timestamps aside).
ACTIONS = [["move_right", "do"], ["move_left"], ["do"], ["move_up", "do"], ["noop"]]


class StubPolicy(BaseHTTPRequestHandler):
    """OpenAI chat completions: one `interact_many` tool call per request, with usage."""

    calls: ClassVar[list[dict[str, Any]]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        """Answer a chat completion."""
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        parts = urlsplit(self.path)
        with self.lock:
            n = len(self.calls)
            tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
            self.calls.append(
                {
                    "path": parts.path,
                    "query": parts.query,
                    "tools": tools,
                    "n_messages": len(body.get("messages") or []),
                }
            )
        if not parts.path.endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {parts.path}"}})
            return
        prompt_chars = sum(len(json.dumps(m.get("content"))) for m in body.get("messages") or [])
        arguments = json.dumps({"actions": ACTIONS[n % len(ACTIONS)]})
        self._send(
            200,
            {
                "id": f"chatcmpl-compat-{n}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": f"call_compat_{n}",
                                    "type": "function",
                                    "function": {"name": "interact_many", "arguments": arguments},
                                }
                            ],
                        },
                        "finish_reason": "tool_calls",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_chars // 4,
                    "completion_tokens": 16,
                    "total_tokens": prompt_chars // 4 + 16,
                },
            },
        )

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: Any) -> None:
        """Quiet: the calls are recorded instead."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _client_class(url: str | None) -> Any:
    """tracestore's light client class, when installed in this venv (client/ of the checkout)."""
    if not url:
        return None
    try:
        from tracestore_client import AsyncTracestoreClient
    except ImportError:
        return None  # the caller posts the returned JSON from its own process
    return AsyncTracestoreClient


async def _status(client: Any, rollout: Any) -> str:
    """The store's status for one post; a refusal (409 conflict) is a status, not a crash."""
    from tracestore_client import TracestoreHTTPError

    try:
        result = await client.post_rollout(rollout)
    except TracestoreHTTPError as exc:
        return str(exc.code)
    return str(result["status"])


def _task_app(store: Any, url: str | None, posted: list[Any]) -> Any:
    """The registered grpo-crafter app, built as the CLI's serve command builds it.

    With `store`, its rollout handler gets the one call the README asks a task app to add:
    post what the handler returns (the JSON the /rollout route sends) to tracestore.
    """
    from synth_ai.task.apps import registry
    from synth_ai.task.contracts import RolloutResponse
    from synth_ai.task.json import to_jsonable
    from synth_ai.task.server import create_task_app

    # synth-ai's own wrapper loads examples/warming_up_to_rl/task_app/grpo_crafter.py
    # (shipped in the wheel), whose import registers the `grpo-crafter` entry.
    importlib.import_module("synth_ai.demos.crafter.grpo_crafter_task_app")
    config = registry.get("grpo-crafter").config_factory()
    if store is not None:
        run_episode = config.rollout

        async def rollout(request: Any, fastapi_request: Any) -> Any:
            response = await run_episode(request, fastapi_request)
            # What create_task_app's /rollout route puts on the wire for this response.
            wire = to_jsonable(
                response.model_dump() if isinstance(response, RolloutResponse) else response
            )
            # A client per call: the app's event loop lives in uvicorn's thread. The model
            # itself first (what a task app has in hand), then the same rollout as the
            # route's HTTP body (repr datetimes) and as pydantic's JSON (ISO datetimes):
            # one rollout, so both repeats must be duplicates.
            async with store(url) as client:
                first = await client.post_rollout(response)
                first["repeats"] = [
                    await _status(client, wire),
                    await _status(client, response.model_dump(mode="json")),
                ]
                posted.append(first)
            return response

        config.rollout = rollout
    return create_task_app(config)


@contextlib.contextmanager
def _serving(app: Any, port: int) -> Any:
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the task app did not start")
        time.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def rollout_request(seed: int, steps: int, inference_url: str) -> dict[str, Any]:
    """A trainer's RolloutRequest for one seed (RL mode: the cid rides in the URL)."""
    return {
        "run_id": f"compat-crafter-seed{seed}",
        "env": {
            "env_name": "crafter",
            "seed": seed,
            "config": {"env_params": {"max_steps_per_episode": steps}},
        },
        "policy": {
            "policy_name": "crafter-react",
            "config": {
                "inference_url": inference_url,
                "model": MODEL,
                "max_llm_calls": steps,
                "max_tokens": 64,
            },
        },
        "ops": ["agent", "env"] * steps,
        "record": {"return_trace": True, "trace_format": "structured"},
        "mode": "rl",
    }


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Serve the app and the stub, run one rollout per seed, return what came back."""
    import httpx

    steps = int(request.get("steps", 3))
    policy_port, app_port = _free_port(), _free_port()
    policy = ThreadingHTTPServer(("127.0.0.1", policy_port), StubPolicy)
    threading.Thread(target=policy.serve_forever, daemon=True).start()
    started = time.monotonic()
    store = _client_class(request.get("tracestore_url"))
    posted: list[Any] = []
    app = _task_app(store, request.get("tracestore_url"), posted)
    build_s = time.monotonic() - started
    rollouts: list[dict[str, Any]] = []
    seconds: list[float] = []
    requests: list[dict[str, Any]] = []
    try:
        with _serving(app, app_port), httpx.Client(timeout=300) as http:
            for seed in request["seeds"]:
                cid = f"trace_compat_seed{seed}"
                url = f"http://127.0.0.1:{policy_port}/v1/chat/completions?cid={cid}"
                body = rollout_request(int(seed), steps, url)
                requests.append(body)
                t0 = time.monotonic()
                response = http.post(
                    f"http://127.0.0.1:{app_port}/rollout",
                    json=body,
                    headers={"X-API-Key": ENV_KEY},
                )
                seconds.append(round(time.monotonic() - t0, 3))
                if response.status_code != 200:
                    raise RuntimeError(f"/rollout {response.status_code}: {response.text[:2000]}")
                rollouts.append(response.json())
    finally:
        policy.shutdown()
    if request.get("trace_db"):
        # The app's tracer has closed its connection: the file is whole.
        shutil.copyfile(_WORKDIR / "task_traces.db", request["trace_db"])
    return {
        "rollouts": rollouts,
        "requests": requests,
        "seconds": seconds,
        "app_build_seconds": round(build_s, 3),
        "posted": posted if store is not None else None,
        "policy_calls": StubPolicy.calls,
    }


def main() -> None:
    """Read the request on stdin, write the rollouts on stdout (temp files removed)."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the app prints freely: only our JSON answer goes to stdout
    sys.stdout = sys.stderr
    try:
        answer = run(json.loads(sys.stdin.buffer.read()))
    finally:
        shutil.rmtree(_WORKDIR, ignore_errors=True)
    json.dump(answer, out)
    out.close()


if __name__ == "__main__":
    main()
