"""Every report's figures computed in Python from the documents, independently of DuckDB.

Each function takes the stored runs (document, received_at, drift rows) and returns rows
keyed like the report's rows, unrounded; the tests compare them with the SQL's output.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

import orjson

from tracestore.correlation import clean_cid, resolve_correlation
from tracestore.drift.rows import drift_rows
from tracestore.toolcalls import normalize_tool_calls
from tracestore.wire.trace import classify_trace, infer_event_type, unwrap_trace, view_trace


@dataclass(frozen=True)
class StoredRun:
    """One created run as the test stored it."""

    doc: dict[str, Any]
    received_at: datetime

    @property
    def day(self) -> date:
        return self.received_at.date()


@dataclass(frozen=True)
class LegacyReadRow:
    """One legacy_reads row the test inserted."""

    client: str
    day: date
    route: str
    reads: int


def quantile(values: list[float], q: float) -> float | None:
    """DuckDB's quantile_cont: linear interpolation between the closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    lo, hi = math.floor(position), math.ceil(position)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (position - lo)


def mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


_DRIFT: dict[str, Any] = {}


def drift_of(doc: Mapping[str, Any]) -> Any:
    """drift_rows(doc), computed once per run."""
    if doc["run_id"] not in _DRIFT:
        _DRIFT[doc["run_id"]] = drift_rows(doc)
    return _DRIFT[doc["run_id"]]


def json_text(value: Any) -> str | None:
    """What DuckDB's json_extract_string gives for a JSON value."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _session(trace: Any) -> Mapping[str, Any]:
    if classify_trace(trace) == "wrapped":
        return unwrap_trace(trace)[0]
    return trace if isinstance(trace, Mapping) else {}


def run_env(doc: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """A run's env and policy: its first trajectory's, else its trace metadata's id, else
    (the id absent or null) its metadata's name (`env_name`, `policy_name`)."""
    meta = _session(doc.get("trace")).get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    first = doc["trajectories"][0] if doc["trajectories"] else {}

    def named(own: Any, key: str, name: str) -> str | None:
        if own is not None:
            return str(own)
        # Taken only as ingest takes an id: a string of at most 1,024 bytes.
        value = meta.get(key)
        if value is None:
            value = meta.get(name)
        fits = isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) <= 1024
        return value if fits else None

    return (
        named(first.get("env_id"), "env_id", "env_name"),
        named(first.get("policy_id"), "policy_id", "policy_name"),
    )


def step_source(doc: Mapping[str, Any]) -> str:
    n_steps = sum(len(t["steps"]) for t in doc["trajectories"])
    if n_steps > 0:
        return "trajectory"
    return "trace" if classify_trace(doc.get("trace")) in ("full", "wrapped") else "trajectory"


def _env_events(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    trace = doc.get("trace")
    if trace is None or classify_trace(trace) not in ("full", "wrapped"):
        return []
    return list(view_trace(trace).environment_events())


def _reward(value: Any) -> float:
    return float(value or 0.0)


def _in(run: StoredRun, env: str | None, row_env: str | None) -> bool:
    return env is None or row_env == env


# --- returns ------------------------------------------------------------------------------


def episodes(run: StoredRun) -> list[dict[str, Any]]:
    doc = run.doc
    if step_source(doc) == "trajectory":
        return [
            {
                "env_id": t.get("env_id"),
                "policy_id": t.get("policy_id"),
                "return": math.fsum(_reward(s.get("reward")) for s in t["steps"]),
                "length": len(t["steps"]),
            }
            for t in doc["trajectories"]
        ]
    events = _env_events(doc)
    if not events:
        return []
    env, policy = run_env(doc)
    return [
        {
            "env_id": env,
            "policy_id": policy,
            "return": math.fsum(_reward(e.get("reward")) for e in events),
            "length": len(events),
        }
    ]


def returns(runs: list[StoredRun], env: str | None = None) -> dict[tuple[Any, ...], dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        for ep in episodes(run):
            if _in(run, env, ep["env_id"]):
                groups[(run.day, ep["env_id"], ep["policy_id"])].append(ep)
    return {
        key: {
            "episodes": len(eps),
            "mean_return": mean([e["return"] for e in eps]),
            "p50_return": quantile([e["return"] for e in eps], 0.5),
            "p90_return": quantile([e["return"] for e in eps], 0.9),
            "mean_length": mean([float(e["length"]) for e in eps]),
        }
        for key, eps in groups.items()
    }


# --- rewards ------------------------------------------------------------------------------


def decision_steps(run: StoredRun) -> list[dict[str, Any]]:
    """Decision steps: (env, source, step key, reward, tool calls)."""
    doc = run.doc
    out = []
    for t_idx, t in enumerate(doc["trajectories"]):
        for s_idx, s in enumerate(t["steps"]):
            out.append(
                {
                    "env_id": t.get("env_id"),
                    "source": "trajectory",
                    "key": (t_idx, s_idx),
                    "reward": None if s.get("reward") is None else float(s["reward"]),
                    "calls": normalize_tool_calls(s.get("tool_calls")),
                }
            )
    if step_source(doc) == "trace" and _env_events(doc):
        env, _ = run_env(doc)
        for i, step in enumerate(view_trace(doc["trace"]).environment_steps()):
            reward = step.event.get("reward")
            out.append(
                {
                    "env_id": env,
                    "source": "trace",
                    "key": (None, i),
                    "reward": None if reward is None else float(reward),
                    "calls": normalize_tool_calls(step.tool_calls),
                }
            )
    return out


def rewards(runs: list[StoredRun], env: str | None = None) -> dict[tuple[Any, ...], dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        for step in decision_steps(run):
            if _in(run, env, step["env_id"]):
                groups[(step["env_id"],)].append(step)
    out = {}
    for key, steps in groups.items():
        values = [s["reward"] or 0.0 for s in steps]
        rewarded = sum(1 for v in values if v != 0)
        out[key] = {
            "steps": len(steps),
            "trace_steps": sum(1 for s in steps if s["source"] == "trace"),
            "null_rewards": sum(1 for s in steps if s["reward"] is None),
            "rewarded_steps": rewarded,
            "reward_density": rewarded / len(steps),
            "positive_steps": sum(1 for v in values if v > 0),
            "negative_steps": sum(1 for v in values if v < 0),
            "total_reward": math.fsum(values),
            "mean_reward": mean(values),
            "min_reward": min(values),
            "p50_reward": quantile(values, 0.5),
            "p90_reward": quantile(values, 0.9),
            "p99_reward": quantile(values, 0.99),
            "max_reward": max(values),
        }
    return out


# --- tools --------------------------------------------------------------------------------


def tools(runs: list[StoredRun], env: str | None = None) -> dict[tuple[Any, ...], dict[str, Any]]:
    calls: dict[tuple[Any, ...], int] = defaultdict(int)
    steps: dict[tuple[Any, ...], set[Any]] = defaultdict(set)
    run_ids: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    per_env: dict[Any, int] = defaultdict(int)
    for run in runs:
        for step in decision_steps(run):
            if not _in(run, env, step["env_id"]):
                continue
            for call in step["calls"]:
                name = json_text(call["name"])
                key = (step["env_id"], name)
                calls[key] += 1
                steps[key].add((run.doc["run_id"], step["source"], step["key"]))
                run_ids[key].add(run.doc["run_id"])
                per_env[step["env_id"]] += 1
    return {
        key: {
            "calls": n,
            "steps": len(steps[key]),
            "runs": len(run_ids[key]),
            "share_of_env_calls": n / per_env[key[0]],
        }
        for key, n in calls.items()
    }


# --- models -------------------------------------------------------------------------------


def lm_events(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """LM events of the run-level trace, else of the per-trajectory traces."""
    traces: list[Any]
    if isinstance(doc.get("trace"), Mapping):
        traces = [doc["trace"]]
    else:
        traces = [t["trace"] for t in doc["trajectories"] if isinstance(t.get("trace"), Mapping)]
    out = []
    for trace in traces:
        if classify_trace(trace) in ("full", "wrapped"):
            for placed in view_trace(trace).events:
                if infer_event_type(placed.item) == "lm_call":
                    out.append(placed.item)
    return out


def _sum(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def models(runs: list[StoredRun], env: str | None = None) -> dict[tuple[Any, ...], dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[tuple[str, Mapping[str, Any]]]] = defaultdict(list)
    for run in runs:
        if not _in(run, env, run_env(run.doc)[0]):
            continue
        for event in lm_events(run.doc):
            groups[(event.get("model_name"), event.get("provider"))].append(
                (run.doc["run_id"], event)
            )
    out = {}
    for key, items in groups.items():
        events = [e for _, e in items]
        latencies = [float(e["latency_ms"]) for e in events if e.get("latency_ms") is not None]
        costs = [float(e["cost_usd"]) for e in events if e.get("cost_usd") is not None]
        out[key] = {
            "calls": len(events),
            "runs": len({r for r, _ in items}),
            "input_tokens": _sum([e.get("input_tokens") for e in events]),
            "output_tokens": _sum([e.get("output_tokens") for e in events]),
            "total_tokens": _sum([e.get("total_tokens") for e in events]),
            "cost_usd": math.fsum(costs) if costs else None,
            "calls_with_cost": len(costs),
            "calls_with_latency": len(latencies),
            "mean_latency_ms": mean(latencies),
            "p50_latency_ms": quantile(latencies, 0.5),
            "p90_latency_ms": quantile(latencies, 0.9),
            "p99_latency_ms": quantile(latencies, 0.99),
        }
    return out


# --- correlation --------------------------------------------------------------------------


def cid_conflict(doc: Mapping[str, Any]) -> bool:
    """The stored ids of a run disagree (canonical, pipeline_metadata, trajectories)."""
    resolution = resolve_correlation(doc)
    named = {cid for cid, _ in resolution.trajectory_cids if cid is not None}
    if resolution.correlation_id is not None:
        named.add(resolution.correlation_id)
    pipeline = doc.get("pipeline_metadata")
    if isinstance(pipeline, Mapping):
        pm = clean_cid(pipeline.get("trace_correlation_id"))
        if pm is not None:
            named.add(pm)
    return len(named) > 1


def correlation(
    runs: list[StoredRun], env: str | None = None
) -> dict[tuple[Any, ...], dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[StoredRun]] = defaultdict(list)
    for run in runs:
        if _in(run, env, run_env(run.doc)[0]):
            source = resolve_correlation(run.doc).source or "none"
            groups[(source,)].append(run)
    total = sum(len(v) for v in groups.values())
    return {
        key: {
            "runs": len(members),
            "share_of_runs": len(members) / total,
            "conflicts": sum(1 for r in members if cid_conflict(r.doc)),
        }
        for key, members in groups.items()
    }


# --- drift --------------------------------------------------------------------------------


def drift(runs: list[StoredRun], env: str | None = None) -> dict[tuple[Any, ...], dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[StoredRun]] = defaultdict(list)
    for run in runs:
        # Under each of its envs: every trajectory's, and the run's own.
        own = [t.get("env_id") for t in run.doc["trajectories"] if t.get("env_id") is not None]
        for run_env_id in dict.fromkeys([*own, run_env(run.doc)[0]]):
            if _in(run, env, run_env_id):
                groups[(run.day, run_env_id)].append(run)
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for (day, env_id), members in groups.items():
        rows = {r.doc["run_id"]: drift_of(r.doc) for r in members}
        comparable = [rid for rid, d in rows.items() if d.check["comparable"]]
        drifted = [rid for rid in comparable if rows[rid].check["n_findings"] > 0]
        group = {
            "runs": len(members),
            "checked_runs": len(members),
            "comparable_runs": len(comparable),
            "drifted_runs": len(drifted),
            "drift_rate": share(len(drifted), len(comparable)),
        }
        kinds: dict[str, list[str]] = defaultdict(list)
        for rid, d in rows.items():
            for finding in d.findings:
                kinds[finding["kind"]].append(rid)
        if not kinds:
            out[(day, env_id, None)] = {"findings": 0, "runs_with_kind": 0, **group}
        for kind, rids in kinds.items():
            out[(day, env_id, kind)] = {
                "findings": len(rids),
                "runs_with_kind": len(set(rids)),
                **group,
            }
    return out


# --- migration ----------------------------------------------------------------------------


def migration(
    runs: list[StoredRun], reads: list[LegacyReadRow], env: str | None = None
) -> dict[tuple[Any, ...], dict[str, Any]]:
    groups: dict[date, list[StoredRun]] = defaultdict(list)
    for run in runs:
        if _in(run, env, run_env(run.doc)[0]):
            groups[run.day].append(run)
    read_days: dict[date, list[LegacyReadRow]] = defaultdict(list)
    for r in reads:
        if r.client != "anonymous":  # a person's look: not counted, as in the gate
            read_days[r.day].append(r)
    days = set(groups) | (set(read_days) if env is None else set())
    out = {}
    for day in days:
        members = groups.get(day, [])
        checks = [drift_of(r.doc).check for r in members]
        has_traj = [bool(r.doc["trajectories"]) for r in members]
        has_trace = [r.doc.get("trace") is not None for r in members]
        kinds = [classify_trace(r.doc.get("trace")) for r in members]
        n = len(members)
        dual_serialized = [c for c in checks if c["dual_serialized"]]
        # Dual-serialized (a trajectory step and a trace), as the gate counts them: not
        # every run that sent both parts.
        dual = len(dual_serialized)
        comparable = [c for c in checks if c["comparable"]]
        day_reads = read_days.get(day, [])
        out[(day,)] = {
            "runs": n,
            "dual": dual,
            "legacy_only": sum(1 for a, b in zip(has_traj, has_trace, strict=True) if a and not b),
            "trace_only": sum(1 for a, b in zip(has_traj, has_trace, strict=True) if b and not a),
            "full_traces": sum(1 for k in kinds if k in ("full", "wrapped")),
            "converted_traces": 0,
            "trace_coverage": share(sum(has_trace), n),
            "legacy_share": share(sum(has_traj), n),
            "checked_runs": n,
            "usable_trace_share": share(sum(1 for c in checks if c["usable_trace"]), n),
            "reproduce_share": share(
                sum(1 for c in dual_serialized if c["reproduces"]), len(dual_serialized)
            ),
            "comparable_runs": len(comparable),
            "drift_rate": share(sum(1 for c in comparable if c["n_findings"] > 0), len(comparable)),
            "legacy_reads": sum(r.reads for r in day_reads) if env is None else None,
            "legacy_clients": len({r.client for r in day_reads}) if env is None else None,
        }
    return out


# name -> (its figures from the runs, the columns that key a row); migration's function
# also takes the legacy reads, so the signature is left open.
COMPUTE: dict[str, tuple[Callable[..., dict[tuple[Any, ...], dict[str, Any]]], tuple[str, ...]]] = {
    "returns": (returns, ("day", "env_id", "policy_id")),
    "rewards": (rewards, ("env_id",)),
    "tools": (tools, ("env_id", "tool_name")),
    "models": (models, ("model_name", "provider")),
    "correlation": (correlation, ("correlation_source",)),
    "drift": (drift, ("day", "env_id", "kind")),
    "migration": (migration, ("day",)),
}


def days_from(base: datetime, n: int) -> list[datetime]:
    """Receive times spread over three days, one minute apart."""
    return [base + timedelta(days=i % 3, minutes=i) for i in range(n)]
