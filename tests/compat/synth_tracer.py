"""synth-ai's own tracer writing its own trace database: JSON request in, what it recorded out.

Run by the producer venv's python (scripts/synth-venv), never by tracestore's: it records
sessions with synth_ai.tracing_v3's SessionTracer into a SQLite file through synth-ai's
storage (NativeLibsqlTraceManager), the way task apps and `synth-ai eval` do, and reports
what was recorded so a test can compare it with what tracestore imports and serves.

stdin, one of:
  {"mode": "fixture", "db": path}
      a few sessions covering what the store holds (below); answers
      {"sessions": {session_id: {"trace": SessionTrace.to_dict() as JSON, "path": how it
      was written, "steps": [{"reward", "done", "truncated", "obs", "tool_calls"}]}}}
  {"mode": "bulk", "db": path, "sessions": N, "steps": S}
      N sessions of S decisions each, for the throughput benchmark; answers the counts
  {"mode": "readback", "db": path, "session_ids": [...]}
      synth_ai.tracing_v3.trace_utils.load_session_trace of each: {"traces": {id: trace}}

The fixture's sessions:
- import-tools (the tracer writing as it goes, as a task app does): a system prompt, three
  decisions each with a user message, an LM call (call record with a tool call, cost in
  USD), the assistant's tool call as a JSON message (`is_tool_call`), an environment event
  (reward, states; the last terminates), event rewards and an outcome reward; its cid is
  in the session metadata.
- import-json (recorded in memory, then stored whole by `insert_session_trace`, as
  `synth-ai eval` stores a returned trace): JSON and text message content, two
  decisions; its cid is in a call record's inference URL.
- import-runtime (the tracer writing as it goes): a runtime event with actions, an event
  outside any time step, a truncated episode, tool_use / tool_result messages; it belongs
  to an experiment.
- import-empty: a session with nothing in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_WORKDIR = Path(tempfile.mkdtemp(prefix="tracestore-synth-tracer-"))
# Importing synth_ai writes caches under HOME: keep them in the temp dir.
os.environ["HOME"] = str(_WORKDIR / "home")
os.environ.setdefault("SYNTH_SILENCE_EXPERIMENTAL", "1")


def _jsonable(value: Any) -> Any:
    """A SessionTrace.to_dict() value as JSON: datetimes as synth-ai's store writes them."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _url(db: str) -> str:
    return f"sqlite+aiosqlite:///{db}"


def _call_record(n: int, tool: str, arguments: dict[str, Any], meta: dict[str, Any]) -> Any:
    """An LLMCallRecord of one chat completion that answered with one tool call."""
    from synth_ai.tracing_v3.lm_call_record_abstractions import (
        LLMCallRecord,
        LLMContentPart,
        LLMMessage,
        LLMUsage,
        ToolCallSpec,
    )

    started = datetime(2025, 11, 20, 12, 0, n, tzinfo=UTC)
    return LLMCallRecord(
        call_id=f"call-{n}",
        api_type="chat_completions",
        provider="openai",
        model_name="gpt-test",
        started_at=started,
        completed_at=started,
        latency_ms=40 + n,
        input_messages=[LLMMessage(role="user", parts=[LLMContentPart(type="text", text="go")])],
        output_tool_calls=[
            ToolCallSpec(
                name=tool, arguments_json=json.dumps(arguments), call_id=f"tc-{n}", index=0
            )
        ],
        usage=LLMUsage(input_tokens=100 + n, output_tokens=10, total_tokens=110 + n),
        finish_reason="tool_calls",
        metadata=meta,
    )


def _openai_call(n: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"tc-{n}",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps(arguments)},
    }


class Recorder:
    """Records decisions on a SessionTracer and keeps what each step should read back as."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.steps: list[dict[str, Any]] = []
        self.clock = 1_763_640_000.0

    def tick(self) -> float:
        """A strictly increasing event time (unix seconds)."""
        self.clock += 0.25
        return self.clock

    async def decision(
        self,
        n: int,
        state: dict[str, Any],
        after: dict[str, Any],
        reward: float,
        done: bool,
        *,
        tool_message: Any,
        call_meta: dict[str, Any] | None = None,
        user_content: Any = None,
    ) -> int | None:
        """One decision: user message, LM call with a tool call, tool message, env event."""
        from synth_ai.tracing_v3.abstractions import EnvironmentEvent, LMCAISEvent, TimeRecord

        tracer = self.tracer
        arguments = {"direction": ["right", "up", "left"][n % 3], "steps": n + 1}
        await tracer.start_timestep(f"decision_{n}", turn_number=n, metadata={"turn": n})
        await tracer.record_message(
            content=user_content if user_content is not None else f"You are at {state['pos']}",
            message_type="user",
            event_time=self.tick(),
            metadata={"turn": n},
        )
        await tracer.record_event(
            LMCAISEvent(
                system_instance_id="policy:walker",
                time_record=TimeRecord(event_time=self.tick(), message_time=n),
                model_name="gpt-test",
                provider="openai",
                input_tokens=100 + n,
                output_tokens=10,
                total_tokens=110 + n,
                cost_usd=0.0123 + n,
                latency_ms=40 + n,
                call_records=[_call_record(n, "move", arguments, call_meta or {})],
                metadata={"turn": n},
            )
        )
        await tracer.record_message(
            content=tool_message(n, arguments),
            message_type="assistant",
            event_time=self.tick(),
            metadata={"turn": n, "is_tool_call": True},
        )
        event_id: int | None = await tracer.record_event(
            EnvironmentEvent(
                system_instance_id="environment:grid",
                time_record=TimeRecord(event_time=self.tick()),
                reward=reward,
                terminated=done,
                truncated=False,
                system_state_before=state,
                system_state_after=after,
                metadata={"turn": n},
            )
        )
        await tracer.end_timestep(f"decision_{n}")
        self.steps.append(
            {
                "reward": reward,
                "done": done,
                "truncated": False,
                "obs": state,
                "tool_calls": [{"tool_name": "move", "arguments": arguments}],
            }
        )
        return event_id


def _states(n: int) -> list[dict[str, Any]]:
    return [{"pos": [i, 0], "step": i, "inventory": {"wood": i}} for i in range(n + 1)]


async def _tools_session(db: str) -> dict[str, Any]:
    from synth_ai.tracing_v3.session_tracer import SessionTracer

    tracer = SessionTracer(db_url=_url(db), auto_save=True)
    await tracer.initialize()
    recorder = Recorder(tracer)
    sid = "import-tools"
    meta = {
        "run_id": sid,
        "env_name": "grid",
        "policy_name": "walker",
        "seed": 7,
        "trace_correlation_id": "trace_import_tools",
    }
    await tracer.start_session(session_id=sid, metadata=meta)
    await tracer.record_message(
        content="You walk a grid. Call move.", message_type="system", event_time=recorder.tick()
    )
    states = _states(3)
    rewards = [0.5, 0.0, 1.0]
    for n in range(3):
        event_id = await recorder.decision(
            n,
            states[n],
            states[n + 1],
            rewards[n],
            n == 2,
            tool_message=lambda k, args: {
                "role": "assistant",
                "tool_calls": [_openai_call(k, "move", args)],
            },
        )
        assert event_id is not None
        await tracer.record_event_reward(
            event_id=event_id,
            turn_number=n,
            reward_value=float(n),
            reward_type="achievement_delta",
            annotation={"achievements": ["collect_wood"] * n},
            source="environment",
        )
    await tracer.record_outcome_reward(
        total_reward=2, achievements_count=1, total_steps=3, reward_metadata={"won": True}
    )
    trace = await tracer.end_session()
    await tracer.close()
    return {"trace": trace, "path": "tracer", "steps": recorder.steps}


async def _json_session(db: str) -> dict[str, Any]:
    from synth_ai.tracing_v3.abstractions import SessionMessageContent
    from synth_ai.tracing_v3.session_tracer import SessionTracer
    from synth_ai.tracing_v3.turso.native_manager import NativeLibsqlTraceManager

    # No storage while recording: the trace is stored whole afterwards, as `synth-ai eval`
    # stores the trace a task app returned (cli/task_apps.py _store_trace).
    tracer = SessionTracer(auto_save=False)
    recorder = Recorder(tracer)
    sid = "import-json"
    await tracer.start_session(session_id=sid, metadata={"env_name": "grid", "policy_id": "p-1"})
    await tracer.record_message(
        content=SessionMessageContent(text="Plain text system prompt"),
        message_type="system",
        event_time=recorder.tick(),
    )
    states = _states(2)
    url = "https://infer.example/v1/chat/completions?cid=trace_import_json"
    for n in range(2):
        await recorder.decision(
            n,
            states[n],
            states[n + 1],
            0.25 * (n + 1),
            n == 1,
            tool_message=lambda k, args: {
                "role": "assistant",
                "tool_calls": [_openai_call(k, "move", args)],
            },
            call_meta={"inference_url": url},
            user_content={"observation": states[n], "legal": ["move"], "note": "ünïcode ✓"},
        )
    trace = await tracer.end_session(save=False)
    storage = NativeLibsqlTraceManager(db_url=_url(db))
    await storage.initialize()
    await storage.insert_session_trace(trace)
    await storage.close()
    return {"trace": trace, "path": "insert_session_trace", "steps": recorder.steps}


async def _runtime_session(db: str) -> dict[str, Any]:
    from synth_ai.tracing_v3.abstractions import EnvironmentEvent, RuntimeEvent, TimeRecord
    from synth_ai.tracing_v3.session_tracer import SessionTracer

    tracer = SessionTracer(db_url=_url(db), auto_save=True)
    await tracer.initialize()
    recorder = Recorder(tracer)
    sid = "import-runtime"
    await tracer.start_session(session_id=sid, metadata={"env_name": "counter"})
    # Before any time step: stored without one.
    await tracer.record_event(
        RuntimeEvent(
            system_instance_id="runtime:boot",
            time_record=TimeRecord(event_time=recorder.tick()),
            actions=[0],
            metadata={"phase": "boot"},
        )
    )
    steps: list[dict[str, Any]] = []
    for n in range(2):
        await tracer.start_timestep(f"tick_{n}", turn_number=n)
        await tracer.record_message(
            content=f"press {n + 1}", message_type="tool_use", event_time=recorder.tick()
        )
        await tracer.record_event(
            RuntimeEvent(
                system_instance_id="runtime:keys",
                time_record=TimeRecord(event_time=recorder.tick()),
                actions=[n, n + 1],
            )
        )
        await tracer.record_message(
            content=f"count is {n + 1}", message_type="tool_result", event_time=recorder.tick()
        )
        state = {"count": n}
        await tracer.record_event(
            EnvironmentEvent(
                system_instance_id="environment:counter",
                time_record=TimeRecord(event_time=recorder.tick()),
                reward=-1.0,
                terminated=False,
                truncated=n == 1,
                system_state_before=state,
                system_state_after={"count": n + 1},
            )
        )
        await tracer.end_timestep()
        steps.append(
            {"reward": -1.0, "done": False, "truncated": n == 1, "obs": state, "tool_calls": []}
        )
    trace = await tracer.end_session()
    # An experiment the session belongs to (synth-ai's experiment tables).
    await tracer.db.create_experiment("exp-1", "grid sweep", configuration={"lr": 0.1})
    await tracer.db.link_session_to_experiment(sid, "exp-1")
    await tracer.close()
    return {"trace": trace, "path": "tracer", "steps": steps}


async def _empty_session(db: str) -> dict[str, Any]:
    from synth_ai.tracing_v3.session_tracer import SessionTracer

    tracer = SessionTracer(db_url=_url(db), auto_save=True)
    await tracer.initialize()
    await tracer.start_session(session_id="import-empty", metadata={})
    trace = await tracer.end_session()
    await tracer.close()
    return {"trace": trace, "path": "tracer", "steps": []}


async def fixture(db: str) -> dict[str, Any]:
    """The fixture's sessions, each written by synth-ai into `db`."""
    out: dict[str, Any] = {}
    for make in (_tools_session, _json_session, _runtime_session, _empty_session):
        made = await make(db)
        trace = made.pop("trace")
        out[trace.session_id] = {"trace": _jsonable(trace.to_dict()), **made}
    return {"sessions": out}


async def bulk(db: str, sessions: int, steps: int) -> dict[str, Any]:
    """`sessions` sessions of `steps` decisions, through one tracer writing as it goes."""
    from synth_ai.tracing_v3.session_tracer import SessionTracer

    tracer = SessionTracer(db_url=_url(db), auto_save=True)
    await tracer.initialize()
    recorder = Recorder(tracer)
    started = time.monotonic()
    for s in range(sessions):
        meta = {"env_name": "grid", "policy_name": "walker", "seed": s}
        await tracer.start_session(session_id=f"bulk-{s:06d}", metadata=meta)
        await tracer.record_message(
            content="You walk a grid.", message_type="system", event_time=recorder.tick()
        )
        states = _states(steps)
        for n in range(steps):
            await recorder.decision(
                n,
                states[n],
                states[n + 1],
                float(n % 2),
                n == steps - 1,
                tool_message=lambda k, args: {
                    "role": "assistant",
                    "tool_calls": [_openai_call(k, "move", args)],
                },
            )
        await tracer.record_outcome_reward(
            total_reward=steps // 2, achievements_count=0, total_steps=steps
        )
        await tracer.end_session()
        recorder.steps.clear()
    await tracer.close()
    return {"sessions": sessions, "seconds": round(time.monotonic() - started, 2)}


def readback(db: str, session_ids: list[str]) -> dict[str, Any]:
    """synth-ai's own read-back of each session (trace_utils.load_session_trace)."""
    from synth_ai.tracing_v3.trace_utils import connect, load_session_trace

    conn = connect(db)
    try:
        return {"traces": {sid: load_session_trace(conn, sid) for sid in session_ids}}
    finally:
        conn.close()


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Do what the request's mode asks."""
    from importlib.metadata import version

    mode = request["mode"]
    if mode == "fixture":
        answer = asyncio.run(fixture(request["db"]))
    elif mode == "bulk":
        answer = asyncio.run(bulk(request["db"], int(request["sessions"]), int(request["steps"])))
    elif mode == "readback":
        answer = readback(request["db"], list(request["session_ids"]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    answer["producer"] = {pkg: version(pkg) for pkg in ("synth-ai", "libsql")}
    return answer


def main() -> None:
    """Read the request on stdin, write the answer on stdout (temp files removed)."""
    # The producer logs and prints freely: keep our stdout for the one JSON answer.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    request = json.loads(sys.stdin.buffer.read())
    try:
        with contextlib.redirect_stdout(sys.stderr):
            answer = run(request)
    except Exception:
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        shutil.rmtree(_WORKDIR, ignore_errors=True)
    json.dump(answer, out, default=str)
    out.close()


if __name__ == "__main__":
    main()
