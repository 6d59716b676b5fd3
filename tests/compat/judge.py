"""The producer's own consumers, run on rollout documents: JSON request in, verdicts out.

Run by the producer venv's python (scripts/synth-venv), never by tracestore's: it imports
synth-ai 0.2.23 and calls its code as its own tools do. Nothing here re-implements a
check; where a consumer is a CLI command (`synth-ai filter`) the command itself runs.

stdin:  {"documents": [{"id": str, "doc": RolloutResponse dict}, ...],
         "judges": [names] (optional: all)}
stdout: {"producer": {...versions}, "verdicts": [{"id": str, <judge>: {...}}, ...]}

Judges (each verdict has "ok" and, when not ok, the producer's own error text):
- rollout_response: synth_ai.task.contracts.RolloutResponse validation, and
  RolloutTrajectory validation of each trajectory;
- rl: synth_ai.task.validators.validate_rollout_response_for_rl (its issues);
- trace_reader: synth_ai.cli.task_apps._session_trace_from_dict on the session payload
  `_store_trace` picks from the trace, with what it read (steps, events, messages);
- judge_payload: synth_ai.judge_schemas.JudgeTracePayload on the trace as
  synth_ai.evals.JudgeClient.score sends it (normalize_for_json);
- sft: the trace stored the way `synth-ai eval` stores it (cli.task_apps._store_trace
  into a SessionTracer on a temp SQLite file), then `synth-ai filter` run on that
  database: the SFT records it wrote for this document;
- cids: synth_ai.task.trace_correlation_helpers.extract_trace_correlation_id on every
  URL in the document (every string under a key ending in "url").
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ALL_JUDGES = ("rollout_response", "rl", "trace_reader", "judge_payload", "sft", "cids")
# The producer's trace store commits (and fsyncs) every row: on a RAM disk when there is
# one, storing a few hundred traces takes seconds instead of minutes on a busy disk.
_SHM = Path("/dev/shm")
_WORKDIR = Path(tempfile.mkdtemp(prefix="tracestore-judge-", dir=_SHM if _SHM.is_dir() else None))

# Importing synth_ai.task writes to /modal_volumes/ and a queue database unless these
# point elsewhere; HOME too, so the producer's caches and records stay in the temp dir.
os.environ.setdefault("MATH_MODAL_DATASET_DIR", str(_WORKDIR / "math"))
os.environ.setdefault("EXPERIMENT_QUEUE_DB_PATH", str(_WORKDIR / "queue.db"))
os.environ["HOME"] = str(_WORKDIR / "home")
os.environ.setdefault("SYNTH_SILENCE_EXPERIMENTAL", "1")


def _error(exc: BaseException) -> str:
    """The producer's error text, as its own callers would see it."""
    return f"{type(exc).__name__}: {exc}"


def judge_rollout_response(doc: dict[str, Any]) -> dict[str, Any]:
    """RolloutResponse (and each RolloutTrajectory) pydantic validation."""
    from pydantic import ValidationError
    from synth_ai.task.contracts import RolloutResponse, RolloutTrajectory

    verdict: dict[str, Any] = {"ok": True, "error": None, "trajectories": []}
    try:
        RolloutResponse.model_validate(doc)
    except ValidationError as exc:
        verdict.update(ok=False, error=_error(exc))
    trajectories = doc.get("trajectories")
    for traj in trajectories if isinstance(trajectories, list) else []:
        try:
            RolloutTrajectory.model_validate(traj)
            verdict["trajectories"].append({"ok": True, "error": None})
        except ValidationError as exc:
            verdict["trajectories"].append({"ok": False, "error": _error(exc)})
    return verdict


def judge_rl(doc: dict[str, Any]) -> dict[str, Any]:
    """validate_rollout_response_for_rl: the RL trainer's requirements."""
    from synth_ai.task.validators import validate_rollout_response_for_rl

    try:
        issues = validate_rollout_response_for_rl(doc, warn_only=True)
    except Exception as exc:  # the validator itself crashing is a verdict too
        return {"ok": False, "error": _error(exc), "issues": []}
    return {"ok": not issues, "error": None, "issues": list(issues)}


def _session_payload(trace: Any) -> tuple[str | None, Any]:
    # The selection synth_ai.cli.task_apps._store_trace makes (and `synth-ai eval` before
    # it): the `session_trace` key of a wrapped trace, else the trace when it has a
    # session_id. It is a few lines inside that coroutine, so it cannot be called alone.
    if not isinstance(trace, dict):
        return None, None
    inner = trace.get("session_trace")
    if isinstance(inner, dict):
        return "session_trace", inner
    if "session_id" in trace:
        return "trace", trace
    return None, None


def judge_trace_reader(doc: dict[str, Any]) -> dict[str, Any]:
    """_session_trace_from_dict, the CLI's trace reader, and what it read."""
    from synth_ai.cli.task_apps import _session_trace_from_dict

    where, payload = _session_payload(doc.get("trace"))
    verdict: dict[str, Any] = {"ok": False, "error": None, "payload": where}
    if payload is None:
        verdict["error"] = "no session trace: _store_trace would skip this trace"
        return verdict
    try:
        trace = _session_trace_from_dict(payload)
    except Exception as exc:
        verdict["error"] = _error(exc)
        return verdict
    if trace is None:
        verdict["error"] = "_session_trace_from_dict returned None"
        return verdict
    step_events = [e for s in trace.session_time_steps for e in s.events]
    step_messages = [m for s in trace.session_time_steps for m in s.markov_blanket_messages]
    event_kinds: dict[str, int] = {}
    for event in trace.event_history or step_events:
        name = type(event).__name__
        event_kinds[name] = event_kinds.get(name, 0) + 1
    message_types: dict[str, int] = {}
    for message in trace.markov_blanket_message_history or step_messages:
        message_types[message.message_type] = message_types.get(message.message_type, 0) + 1
    verdict.update(
        ok=True,
        session_id=trace.session_id,
        steps=len(trace.session_time_steps),
        events=len(trace.event_history),
        messages=len(trace.markov_blanket_message_history),
        step_events=len(step_events),
        step_messages=len(step_messages),
        event_kinds=event_kinds,
        message_types=message_types,
    )
    return verdict


def judge_judge_payload(doc: dict[str, Any]) -> dict[str, Any]:
    """JudgeTracePayload on the trace as JudgeClient.score sends it."""
    from pydantic import ValidationError
    from synth_ai.judge_schemas import JudgeTracePayload
    from synth_ai.tracing_v3.serialization import normalize_for_json

    trace = doc.get("trace")
    try:
        payload = JudgeTracePayload.model_validate(normalize_for_json(trace))
    except ValidationError as exc:
        return {"ok": False, "error": _error(exc)}
    return {
        "ok": True,
        "error": None,
        "events": len(payload.event_history),
        "messages": len(payload.markov_blanket_message_history),
    }


def _eval_storage_metadata(doc: dict[str, Any]) -> dict[str, Any]:
    # The metadata `synth-ai eval` stores with each trace (cli/commands/eval/core.py,
    # _run_seed): taken from the first trajectory's first step obs and final observation.
    # Inline in that coroutine, so mirrored here; no judges or model in this setting.
    meta: dict[str, Any] = {
        "eval_seed": None,
        "prompt_index": None,
        "task_id": None,
        "task_split": None,
        "task_rubric_id": None,
        "official_score": None,
        "judge_scores": {},
        "model": None,
        "prompt": None,
        "completion": None,
    }
    trajs = doc.get("trajectories")
    first = trajs[0] if isinstance(trajs, list) and trajs else None
    if isinstance(first, dict):
        steps = first.get("steps")
        if isinstance(steps, list) and steps and isinstance(steps[0], dict):
            obs = steps[0].get("obs")
            if isinstance(obs, dict):
                if isinstance(obs.get("prompt_index"), int):
                    meta["prompt_index"] = obs["prompt_index"]
                if isinstance(obs.get("prompt"), str):
                    meta["prompt"] = obs["prompt"]
                for key in ("task_id", "task_split", "task_rubric_id"):
                    if isinstance(obs.get(key), str) and obs[key]:
                        meta[key] = obs[key]
        final = first.get("final")
        final_obs = final.get("observation") if isinstance(final, dict) else None
        if isinstance(final_obs, dict) and isinstance(final_obs.get("completion"), str):
            meta["completion"] = final_obs["completion"]
    metrics = doc.get("metrics")
    if isinstance(metrics, dict):
        for key in ("mean_return", "total_reward", "outcome_score"):
            if isinstance(metrics.get(key), int | float):
                meta["official_score"] = min(1.0, max(0.0, float(metrics[key])))
                break
    return meta


def _buckets(items: list[tuple[str, dict[str, Any]]]) -> list[list[tuple[str, dict[str, Any]]]]:
    """Split documents so that no trace database gets one session_id twice."""
    # The tracer stores a session once: a second trace with the same session_id would
    # keep the first one's messages. Each bucket is one database.
    buckets: list[tuple[set[Any], list[tuple[str, dict[str, Any]]]]] = []
    for ident, doc in items:
        _, payload = _session_payload(doc.get("trace"))
        key = payload.get("session_id", "") if isinstance(payload, dict) else None
        for seen, members in buckets:
            if key not in seen:
                seen.add(key)
                members.append((ident, doc))
                break
        else:
            buckets.append(({key}, [(ident, doc)]))
    return [members for _, members in buckets]


def _filter_records(db_path: Path, out_dir: Path) -> tuple[list[dict[str, Any]], str | None]:
    """Run `synth-ai filter` (the click command itself) on a trace database."""
    import click
    from synth_ai.cli.commands.filter.core import filter_command

    output = out_dir / "sft.jsonl"
    config = out_dir / "filter.toml"
    config.write_text(
        f'[filter]\ndb = "sqlite+aiosqlite:///{db_path}"\noutput = "{output}"\n',
        encoding="utf-8",
    )
    try:
        filter_command.main(["--config", str(config)], standalone_mode=False)
    except click.ClickException as exc:
        return [], exc.format_message()
    lines = output.read_text(encoding="utf-8").splitlines() if output.exists() else []
    return [json.loads(line) for line in lines], None


async def _store(db_path: Path, members: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """Store each trace as `synth-ai eval` does; the store errors by document id."""
    from synth_ai.cli.task_apps import SessionTracer, _store_trace

    errors: dict[str, str] = {}
    tracer = SessionTracer(db_url=f"sqlite+aiosqlite:///{db_path}", auto_save=True)
    await tracer.initialize()
    try:
        for ident, doc in members:
            trace = doc.get("trace")
            if not trace:  # eval stores nothing then (`if trace_tracer and trace_namespace`)
                errors[ident] = "no trace: synth-ai eval stores nothing"
                continue
            try:
                await _store_trace(tracer, trace, _eval_storage_metadata(doc))
            except Exception as exc:
                errors[ident] = _error(exc)
    finally:
        if tracer.db is not None:
            await tracer.db.close()
    return errors


def judge_sft(items: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Eval storage + `synth-ai filter`: the SFT records of each document."""
    verdicts: dict[str, dict[str, Any]] = {}
    for n, members in enumerate(_buckets(items)):
        out_dir = _WORKDIR / f"sft-{n}"
        out_dir.mkdir()
        db_path = out_dir / "traces.db"
        store_errors = asyncio.run(_store(db_path, members))
        records, filter_error = _filter_records(db_path, out_dir)
        by_session: dict[Any, list[dict[str, Any]]] = {}
        for record in records:
            by_session.setdefault(record.get("metadata", {}).get("session_id"), []).append(record)
        for ident, doc in members:
            _, payload = _session_payload(doc.get("trace"))
            session_id = payload.get("session_id", "") if isinstance(payload, dict) else None
            mine = by_session.get(session_id, []) if ident not in store_errors else []
            error = store_errors.get(ident)
            if error is None and not mine:
                error = filter_error or "synth-ai filter wrote no record for this trace"
            verdicts[ident] = {
                "ok": bool(mine),
                "error": error,
                "records": [r["messages"] for r in mine],
            }
    return verdicts


def _urls(value: Any, path: str = "$") -> Iterator[tuple[str, str]]:
    """Every (path, string) under a key ending in 'url', anywhere in the document."""
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}"
            if isinstance(item, str) and str(key).lower().endswith("url"):
                yield here, item
            else:
                yield from _urls(item, here)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _urls(item, f"{path}[{i}]")


def judge_cids(doc: dict[str, Any]) -> dict[str, Any]:
    """extract_trace_correlation_id on every URL of the document (unique URLs)."""
    from synth_ai.task.trace_correlation_helpers import extract_trace_correlation_id

    found: dict[str, dict[str, Any]] = {}
    for path, url in _urls(doc):
        if url in found:
            found[url]["count"] += 1
            continue
        try:
            cid = extract_trace_correlation_id({}, url, mode="eval")
            error = None
        except Exception as exc:
            cid, error = None, _error(exc)
        found[url] = {"url": url, "first_path": path, "count": 1, "cid": cid, "error": error}
    urls = list(found.values())
    return {"ok": all(u["error"] is None for u in urls), "urls": urls}


_PER_DOCUMENT = {
    "rollout_response": judge_rollout_response,
    "rl": judge_rl,
    "trace_reader": judge_trace_reader,
    "judge_payload": judge_judge_payload,
    "cids": judge_cids,
}


def run(request: dict[str, Any]) -> dict[str, Any]:
    """All requested judges on all documents."""
    from importlib.metadata import version

    judges = request.get("judges") or list(ALL_JUDGES)
    unknown = sorted(set(judges) - set(ALL_JUDGES))
    if unknown:
        raise SystemExit(f"unknown judges: {unknown}")
    items = [(str(d["id"]), d["doc"]) for d in request["documents"]]
    verdicts: dict[str, dict[str, Any]] = {ident: {"id": ident} for ident, _ in items}
    seconds: dict[str, float] = {}
    for name in judges:
        started = time.monotonic()
        if name == "sft":
            for ident, verdict in judge_sft(items).items():
                verdicts[ident]["sft"] = verdict
            seconds[name] = round(time.monotonic() - started, 2)
            continue
        for ident, doc in items:
            try:
                verdicts[ident][name] = _PER_DOCUMENT[name](doc)
            except Exception as exc:  # a judge crashing on a document fails it
                verdicts[ident][name] = {"ok": False, "error": _error(exc)}
        seconds[name] = round(time.monotonic() - started, 2)
    producer = {pkg: version(pkg) for pkg in ("synth-ai", "pydantic", "pandas")}
    return {
        "producer": producer,
        "seconds": seconds,
        "verdicts": [verdicts[ident] for ident, _ in items],
    }


def main() -> None:
    """Read the request on stdin, write the verdicts on stdout (temp files removed)."""
    # The producer prints (and its libraries may write to fd 1): keep our stdout for the
    # one JSON answer and send everything else to stderr.
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
    json.dump(answer, out)
    out.close()


if __name__ == "__main__":
    main()
