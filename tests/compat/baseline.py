"""Fidelity figures (issue 11): what synth-ai's own consumers say of what tracestore serves.

For one source of rollouts (the examples, or the real grpo-crafter task app's rollouts),
already posted to a live tracestore server: fetch each run's served and converted parts
over HTTP, have the producer's code judge them (judge.py in the producer venv), and
reduce the verdicts to the figures the issue's done-when names. The tests assert on these
figures; `python -m tests.compat.baseline` prints them for both sources.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from tests.compat.harness import Producer

# The documents judged per run: as posted; as served (GET .../trajectories and .../trace in
# place of its parts, judged when that differs from the posted one: a part converted or a
# wrapped trace unwrapped); and POST /v1/convert's documents.
ORIGINAL, SERVED = "original", "served"
TO_TRAJECTORIES, TO_TRACE = "to_trajectories", "to_trace"
VARIANTS = (ORIGINAL, SERVED, TO_TRAJECTORIES, TO_TRACE)
STEP_FIELDS = ("obs", "tool_calls", "reward", "done", "truncated", "info")
TRAJECTORY_FIELDS = ("env_id", "policy_id", "inference_url", "final", "decision_samples")


@dataclass
class Run:
    """One rollout of a source: what was posted, what tracestore serves, what synth-ai says."""

    run_id: str
    doc: dict[str, Any]
    expected_steps: list[dict[str, Any]] | None = None  # a trace-only example's lost steps
    post_status: str | None = None
    # The same rollout posted again in other forms (the task app's HTTP body, pydantic's
    # JSON): their statuses, when the source did that.
    post_repeats: list[str] | None = None
    stored_equal: bool | None = None
    converted: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    losses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    convert_status: dict[str, int] = field(default_factory=dict)
    served: dict[str, tuple[int, str | None, Any]] = field(default_factory=dict)
    drift: dict[str, Any] | None = None
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    cid_lookups: list[dict[str, Any]] = field(default_factory=list)

    def document(self, variant: str) -> dict[str, Any] | None:
        """The document of `variant` (None when there is none, or the same as posted)."""
        if variant == ORIGINAL:
            return self.doc
        if variant == SERVED:
            doc = dict(self.doc)
            for part, (status, _, data) in self.served.items():
                if status == 200:
                    doc[part] = data
            return doc if doc != self.doc else None
        return self.converted.get(variant)


def _path_id(value: str) -> str:
    return quote(value, safe="")


def fetch(http: httpx.Client, run: Run) -> None:
    """Everything tracestore serves for `run`: stored bytes, served parts, conversions."""
    rid = _path_id(run.run_id)
    stored = http.get(f"/v1/rollouts/{rid}")
    run.stored_equal = stored.status_code == 200 and orjson.loads(stored.content) == run.doc
    for part in ("trajectories", "trace"):
        r = http.get(f"/v1/rollouts/{rid}/{part}")
        data = orjson.loads(r.content) if r.status_code == 200 else None
        run.served[part] = (r.status_code, r.headers.get("x-tracestore-source"), data)
    body = orjson.dumps(run.doc)
    for variant, to in ((TO_TRAJECTORIES, "trajectories"), (TO_TRACE, "trace")):
        # replace=true: the converter's output even where the document has the part (by
        # default a part the document has is kept); a conversion that gives nothing keeps it.
        r = http.post(
            f"/v1/convert?to={to}&replace=true",
            content=body,
            headers={"content-type": "application/json"},
        )
        run.convert_status[variant] = r.status_code
        answer = orjson.loads(r.content) if r.is_success else {}
        run.converted[variant] = answer.get("document")
        run.losses[variant] = list(answer.get("losses") or [])
    drift = http.get(f"/v1/rollouts/{rid}/drift")
    run.drift = orjson.loads(drift.content) if drift.status_code == 200 else None


def judge_all(producer: Producer, runs: list[Run]) -> dict[str, str]:
    """Every variant of every run through synth-ai's consumers (one producer process)."""
    documents: dict[str, dict[str, Any]] = {}
    for run in runs:
        for variant in VARIANTS:
            doc = run.document(variant)
            if doc is not None:
                documents[f"{variant}|{run.run_id}"] = doc
    verdicts, versions = producer.judge(documents)
    for ident, verdict in verdicts.items():
        variant, _, run_id = ident.partition("|")
        next(r for r in runs if r.run_id == run_id).verdicts[variant] = verdict
    return dict(versions)


def lookup_cids(http: httpx.Client, run: Run) -> None:
    """GET /v1/correlations/{cid} for every cid synth-ai derives from the run's URLs."""
    for entry in run.verdicts[ORIGINAL]["cids"]["urls"]:
        cid = entry["cid"]
        if not cid:
            continue
        r = http.get(f"/v1/correlations/{_path_id(cid)}")
        runs = orjson.loads(r.content).get("runs", []) if r.status_code == 200 else []
        found = any(isinstance(x, Mapping) and x.get("run_id") == run.run_id for x in runs)
        run.cid_lookups.append(
            {"cid": cid, "url": entry["url"], "where": entry["first_path"], "status": r.status_code}
            | {"found": found}
        )


# --- reducing verdicts to figures ---------------------------------------------------------


def error_pattern(text: str) -> str:
    """A producer error with its specifics (indices, ids, quoted values) blanked, to group."""
    text = text.split("\n    For further information", 1)[0]  # pydantic's doc link
    text = re.sub(r"\[\d+\]", "[i]", text)
    text = re.sub(r"Got: .*", "Got: ...", text)
    text = re.sub(r"input_value=.*?(, input_type|\])", r"input_value=...\1", text)
    text = re.sub(r"\d+ validation error", "N validation error", text)
    return " ".join(text.split())[:240]


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == [] or value == ""


def _unwrap(trace: Any) -> dict[str, Any] | None:
    if not isinstance(trace, Mapping):
        return None
    inner = trace.get("session_trace")
    if isinstance(inner, Mapping):
        return dict(inner)
    if "session_time_steps" in trace or "event_history" in trace:
        return dict(trace)
    return None


def _events(trace: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    history = [e for e in trace.get("event_history") or [] if isinstance(e, Mapping)]
    if history:
        return history
    steps = trace.get("session_time_steps") or []
    return [e for s in steps if isinstance(s, Mapping) for e in s.get("events") or []]


def _messages(trace: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    history = trace.get("markov_blanket_message_history") or []
    if history:
        return [m for m in history if isinstance(m, Mapping)]
    steps = trace.get("session_time_steps") or []
    return [
        m for s in steps if isinstance(s, Mapping) for m in s.get("markov_blanket_messages") or []
    ]


def _env_events(trace: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [e for e in _events(trace) if {"reward", "terminated", "truncated"} & e.keys()]


def _lm_events(trace: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [e for e in _events(trace) if {"model_name", "provider", "call_records"} & e.keys()]


def _trace_parts(trace: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a trace whose emptiness matters to its readers."""
    env = _env_events(trace)
    lm = _lm_events(trace)
    records = [c for e in lm for c in e.get("call_records") or [] if isinstance(c, Mapping)]
    parts: dict[str, Any] = {
        "session_time_steps": trace.get("session_time_steps"),
        "event_history": trace.get("event_history"),
        "markov_blanket_message_history": trace.get("markov_blanket_message_history"),
        "environment events": env,
        "lm events": lm,
        "lm call_records": records,
        "lm output_tool_calls": [t for c in records for t in c.get("output_tool_calls") or []],
        "lm token counts": [e.get("total_tokens") for e in lm if e.get("total_tokens")],
    }
    for m in _messages(trace):
        mtype = m.get("message_type")
        kind = f"messages:{_ROLE_OF_TYPE.get(mtype, mtype) if isinstance(mtype, str) else mtype}"
        parts.setdefault(kind, []).append(m)
    return parts


# Message types that say the same thing under a producer's own name: the task app's
# `policy_*` prompts and tool calls, a hand-built app's observations (what the user turn
# of a chat shows the policy) and actions. A converted trace writes the chat roles.
_ROLE_OF_TYPE = {
    "policy_system_prompt": "system",
    "policy_user_prompt": "user",
    "observation": "user",
    "policy_tool_call": "assistant",
    "action": "assistant",
}


def _part_path(key: str) -> str:
    """The loss-report path a part key stands for (indices as [i])."""
    if key.startswith("trajectory."):
        return "trajectories[i]." + key.removeprefix("trajectory.")
    if key.startswith("step."):
        return "trajectories[i].steps[i]." + key.removeprefix("step.")
    if key.startswith("trajectories"):
        return "trajectories"
    # A trace part: a word that a loss path of the trace about it would hold.
    if key.startswith("messages:"):
        return "message"
    if key.startswith("environment event."):
        return key.removeprefix("environment event.")
    words = {"environment events": "events", "lm events": "events", "lm token counts": "tokens"}
    return words.get(key, key.removeprefix("lm "))


def _reported(key: str, losses: list[dict[str, Any]]) -> bool:
    """True when the conversion's loss report names this part (or a part of it)."""
    # A `replaced` entry only says the document's part was overwritten, not what was lost.
    paths = [
        re.sub(r"\[(\d+|\*)\]", "[i]", str(x.get("path", "")))
        for x in losses
        if x.get("kind") != "replaced"
    ]
    part = _part_path(key)
    if part == "trajectories":  # emptied whole: never a documented loss
        return False
    if part.startswith("trajectories"):
        return any(p.startswith(part) or part.startswith(p) for p in paths)
    return any(part in p for p in paths if p.startswith("trace"))


def empty_parts(run: Run) -> dict[str, Counter[str]]:
    """Per conversion, parts returned empty where the run had something real.

    Keys are part names; an unreported part (not named by the conversion's loss report)
    also counts under "unreported: <part>".
    """
    found: dict[str, Counter[str]] = {TO_TRAJECTORIES: Counter(), TO_TRACE: Counter()}

    def hit(variant: str, key: str, n: int = 1) -> None:
        found[variant][key] += n
        if not _reported(key, run.losses.get(variant, [])):
            found[variant][f"unreported: {key}"] += n

    # trace -> trajectories: the reference is the run's own trajectories, or (trace-only
    # examples) the steps the producer had before it dropped them.
    converted = run.converted.get(TO_TRAJECTORIES)
    ref_trajs: list[Any] = list(run.doc.get("trajectories") or [])
    if not ref_trajs and run.expected_steps:
        ref_trajs = [{"steps": run.expected_steps}]
    if ref_trajs and converted is not None:
        conv_trajs = converted.get("trajectories") or []
        if not conv_trajs:
            kind = "usable" if _unwrap(run.doc.get("trace")) else "not convertible"
            hit(TO_TRAJECTORIES, f"trajectories replaced by [] (trace {kind})")
        for ref, conv in zip(ref_trajs, conv_trajs, strict=False):
            for key in TRAJECTORY_FIELDS:
                if key in ref and not _empty(ref[key]) and _empty(conv.get(key)):
                    hit(TO_TRAJECTORIES, f"trajectory.{key}")
            ref_steps, conv_steps = ref.get("steps") or [], conv.get("steps") or []
            if len(conv_steps) < len(ref_steps):
                hit(
                    TO_TRAJECTORIES,
                    "trajectories steps (missing)",
                    len(ref_steps) - len(conv_steps),
                )
            for rs, cs in zip(ref_steps, conv_steps, strict=False):
                for key in STEP_FIELDS:
                    if key in rs and not _empty(rs[key]) and _empty(cs.get(key)):
                        hit(TO_TRAJECTORIES, f"step.{key}")
    # trajectories -> trace: the reference is the run's own full (or wrapped) trace.
    ref_trace = _unwrap(run.doc.get("trace"))
    conv_doc = run.converted.get(TO_TRACE)
    if ref_trace is not None and conv_doc is not None:
        conv_trace = _unwrap(conv_doc.get("trace")) or {}
        ref_parts, conv_parts = _trace_parts(ref_trace), _trace_parts(conv_trace)
        for key, value in ref_parts.items():
            if not _empty(value) and _empty(conv_parts.get(key)):
                hit(TO_TRACE, key)
        for re_, ce in zip(_env_events(ref_trace), _env_events(conv_trace), strict=False):
            for key in ("system_state_before", "system_state_after"):
                if not _empty(re_.get(key)) and _empty(ce.get(key)):
                    hit(TO_TRACE, f"environment event.{key}")
    return found


def _sans_created_at(part: Any) -> Any:
    if isinstance(part, Mapping):
        return {k: v for k, v in part.items() if k != "created_at"}
    return part


def _sft_sides(records: list[list[dict[str, Any]]], role: str) -> list[Any]:
    return [m.get("content") for r in records for m in r if m.get("role") == role]


@dataclass
class Figures:
    """The done-when figures of one source."""

    source: str
    runs: int = 0
    judged: dict[str, int] = field(default_factory=dict)
    judges: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    rl: dict[str, Any] = field(default_factory=dict)
    sft: dict[str, Any] = field(default_factory=dict)
    drift: dict[str, Any] = field(default_factory=dict)
    cids: dict[str, Any] = field(default_factory=dict)
    empty_parts: dict[str, dict[str, int]] = field(default_factory=dict)
    served: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able figures."""
        return dict(self.__dict__)


def _verdict_ok(verdict: Mapping[str, Any], judge: str) -> bool:
    v = verdict.get(judge) or {}
    if judge == "rollout_response":
        return bool(v.get("ok")) and all(t["ok"] for t in v.get("trajectories", []))
    return bool(v.get("ok"))


def _verdict_errors(verdict: Mapping[str, Any], judge: str) -> list[str]:
    v = verdict.get(judge) or {}
    errors = [v["error"]] if v.get("error") else []
    errors += [t["error"] for t in v.get("trajectories", []) if t.get("error")]
    errors += list(v.get("issues") or [])
    return errors


def reduce(source: str, runs: list[Run]) -> Figures:
    """The figures of `source` from its fetched and judged runs."""
    fig = Figures(source=source, runs=len(runs))
    for variant in VARIANTS:
        fig.judged[variant] = sum(1 for r in runs if variant in r.verdicts)
    for judge in ("rollout_response", "rl", "trace_reader", "judge_payload", "sft"):
        fig.judges[judge] = {}
        for variant in VARIANTS:
            judged = [r for r in runs if variant in r.verdicts]
            errors: Counter[str] = Counter()
            for r in judged:
                if not _verdict_ok(r.verdicts[variant], judge):
                    for e in _verdict_errors(r.verdicts[variant], judge)[:1]:
                        errors[error_pattern(e)] += 1
            passed = sum(1 for r in judged if _verdict_ok(r.verdicts[variant], judge))
            fig.judges[judge][variant] = {
                "pass": passed,
                "of": len(judged),
                "errors": dict(errors.most_common()),
            }
    # 1. trace -> trajectories passing the RL validator where the original does.
    base = [
        r
        for r in runs
        if ORIGINAL in r.verdicts and TO_TRAJECTORIES in r.verdicts and _unwrap(r.doc.get("trace"))
    ]
    orig_ok = [r for r in base if _verdict_ok(r.verdicts[ORIGINAL], "rl")]
    conv_ok = [r for r in orig_ok if _verdict_ok(r.verdicts[TO_TRAJECTORIES], "rl")]
    issues: Counter[str] = Counter()
    for r in orig_ok:
        if r not in conv_ok:
            for issue in dict.fromkeys(
                error_pattern(i) for i in _verdict_errors(r.verdicts[TO_TRAJECTORIES], "rl")
            ):
                issues[issue] += 1
    fig.rl = {
        "runs_with_trace": len(base),
        "original_pass": len(orig_ok),
        "converted_pass": len(conv_ok),
        "pct": round(100 * len(conv_ok) / len(orig_ok), 1) if orig_ok else None,
        "failing_runs": [r.run_id for r in orig_ok if r not in conv_ok],
        "issues": dict(issues.most_common()),
    }
    # 2. SFT records from synth-ai filter: converted trace (trajectories -> trace) vs
    # the original trace.
    per_run: list[dict[str, Any]] = []
    first_diff: dict[str, Any] | None = None
    for r in runs:
        if TO_TRACE not in r.verdicts or not r.doc.get("trajectories"):
            continue
        orig = r.verdicts[ORIGINAL]["sft"]["records"] if r.doc.get("trace") else []
        conv = r.verdicts[TO_TRACE]["sft"]["records"]
        if first_diff is None and orig:
            pairs = zip(_sft_sides(orig, "assistant"), _sft_sides(conv, "assistant"), strict=False)
            for a, b in pairs:
                if a != b:
                    first_diff = {"run_id": r.run_id, "original": a, "converted": b}
                    break
        per_run.append(
            {
                "run_id": r.run_id,
                "original": len(orig),
                "converted": len(conv),
                "assistant_equal": _sft_sides(orig, "assistant") == _sft_sides(conv, "assistant"),
                "user_equal": _sft_sides(orig, "user") == _sft_sides(conv, "user"),
            }
        )
    compared = [p for p in per_run if p["original"]]
    fig.sft = {
        "runs_with_original_records": len(compared),
        "records_original": sum(p["original"] for p in compared),
        "records_converted": sum(p["converted"] for p in compared),
        "runs_same_count": sum(1 for p in compared if p["original"] == p["converted"]),
        "runs_assistant_equal": sum(1 for p in compared if p["assistant_equal"]),
        "runs_user_equal": sum(1 for p in compared if p["user_equal"]),
        "runs_without_original_records": len(per_run) - len(compared),
        "records_converted_there": sum(p["converted"] for p in per_run if not p["original"]),
        "first_assistant_difference": first_diff,
        "per_run": per_run,
    }
    # 3. Drift findings stored at ingest.
    kinds: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    for r in runs:
        for f in (r.drift or {}).get("findings", []):
            kinds[f.get("kind")] += 1
            if len(examples) < 3:
                examples.append({"run_id": r.run_id, **f})
    fig.drift = {
        "comparable": sum(1 for r in runs if (r.drift or {}).get("comparable")),
        "runs_with_findings": sum(1 for r in runs if (r.drift or {}).get("findings")),
        "kinds": dict(kinds),
        "examples": examples,
    }
    # 4. Every cid synth-ai derives from a URL finds its run.
    lookups = [(r.run_id, x) for r in runs for x in r.cid_lookups]
    fig.cids = {
        "runs": sum(1 for r in runs if r.cid_lookups),
        "urls": sum(len(r.verdicts[ORIGINAL]["cids"]["urls"]) for r in runs),
        "cids": len(lookups),
        "found": sum(1 for _, x in lookups if x["found"]),
        "missing": [{"run_id": rid, **x} for rid, x in lookups if not x["found"]],
    }
    # 5. Empty parts returned in place of real ones.
    totals: dict[str, Counter[str]] = {TO_TRAJECTORIES: Counter(), TO_TRACE: Counter()}
    runs_hit: dict[str, set[str]] = {TO_TRAJECTORIES: set(), TO_TRACE: set()}
    runs_unreported: dict[str, set[str]] = {TO_TRAJECTORIES: set(), TO_TRACE: set()}
    for r in runs:
        for variant, counts in empty_parts(r).items():
            totals[variant].update(counts)
            if counts:
                runs_hit[variant].add(r.run_id)
            if any(k.startswith("unreported: ") for k in counts):
                runs_unreported[variant].add(r.run_id)
    fig.empty_parts = {
        v: {
            "runs": len(runs_hit[v]),
            "runs unreported": len(runs_unreported[v]),
            **dict(totals[v].most_common()),
        }
        for v in totals
    }
    # Served parts: stored bytes back, and served conversions against POST /v1/convert's
    # (a trace's created_at aside: the store's receipt time vs the request's).
    served_mismatch = []
    for r in runs:
        for part, variant in (("trajectories", TO_TRAJECTORIES), ("trace", TO_TRACE)):
            _status, served_from, data = r.served[part]
            conv = r.converted.get(variant)
            if served_from == "converted" and (
                conv is None or _sans_created_at(conv.get(part)) != _sans_created_at(data)
            ):
                served_mismatch.append(f"{r.run_id} {part}")
    fig.served = {
        "stored_equal": sum(1 for r in runs if r.stored_equal),
        "post_status": dict(Counter(r.post_status for r in runs)),
        "trajectories_source": dict(Counter(str(r.served["trajectories"][1]) for r in runs)),
        "trace_source": dict(Counter(str(r.served["trace"][1]) for r in runs)),
        "convert_status": {
            v: dict(Counter(r.convert_status.get(v) for r in runs))
            for v in (TO_TRAJECTORIES, TO_TRACE)
        },
        "served_conversion_differs_from_convert": served_mismatch,
    }
    return fig


def measure(
    source: str, runs: list[Run], http: httpx.Client, producer: Producer
) -> tuple[Figures, dict[str, str]]:
    """Fetch, judge and reduce one source's runs (already posted)."""
    started = time.monotonic()
    for run in runs:
        fetch(http, run)
    fetched = time.monotonic()
    versions = judge_all(producer, runs)
    judged = time.monotonic()
    for run in runs:
        lookup_cids(http, run)
    fig = reduce(source, runs)
    fig.seconds = {
        "fetch": round(fetched - started, 1),
        "judge": round(judged - fetched, 1),
        "total": round(time.monotonic() - started, 1),
    }
    return fig, versions


# --- the table ----------------------------------------------------------------------------


def _pct(n: int, of: int) -> str:
    return f"{n}/{of} ({100 * n / of:.0f}%)" if of else "0/0"


def table(figures: list[Figures]) -> str:
    """The figures of every source as a text table, then the grouped producer errors."""
    lines: list[str] = []
    names = [f.source for f in figures]
    rows: list[tuple[str, list[str]]] = [("runs", [str(f.runs) for f in figures])]
    rows.append(
        (
            "1. RL validator: trace->trajectories pass where original passes",
            [_pct(f.rl["converted_pass"], f.rl["original_pass"]) for f in figures],
        )
    )
    rows.append(
        (
            "2. SFT records (filter): original trace -> converted trace",
            [f"{f.sft['records_original']} -> {f.sft['records_converted']}" for f in figures],
        )
    )
    rows.append(
        (
            "   runs with same record count / assistant side equal",
            [
                f"{_pct(f.sft['runs_same_count'], f.sft['runs_with_original_records'])} / "
                f"{_pct(f.sft['runs_assistant_equal'], f.sft['runs_with_original_records'])}"
                for f in figures
            ],
        )
    )
    rows.append(
        (
            "   legacy-only runs: records from the converted trace",
            [
                f"{f.sft['records_converted_there']} in {f.sft['runs_without_original_records']}"
                for f in figures
            ],
        )
    )
    rows.append(
        (
            "3. drift: runs with findings / comparable",
            [
                f"{f.drift['runs_with_findings']}/{f.drift['comparable']} {f.drift['kinds']}"
                for f in figures
            ],
        )
    )
    rows.append(
        (
            "4. synth-ai cids found by GET /v1/correlations",
            [_pct(f.cids["found"], f.cids["cids"]) for f in figures],
        )
    )
    for variant in (TO_TRAJECTORIES, TO_TRACE):
        rows.append(
            (
                f"5. empty parts in place of real ones ({variant}): runs (unreported)",
                [
                    f"{f.empty_parts[variant]['runs']} "
                    f"({f.empty_parts[variant]['runs unreported']})"
                    for f in figures
                ],
            )
        )
    for judge in ("rollout_response", "rl", "trace_reader", "judge_payload", "sft"):
        for variant in VARIANTS:
            rows.append(
                (
                    f"{judge} [{variant}] pass",
                    [
                        _pct(f.judges[judge][variant]["pass"], f.judges[judge][variant]["of"])
                        for f in figures
                    ],
                )
            )
    width = max(len(r[0]) for r in rows)
    cols = [max(len(n), *(len(r[1][i]) for r in rows)) for i, n in enumerate(names)]
    lines.append(" | ".join([" " * width, *(n.ljust(c) for n, c in zip(names, cols, strict=True))]))
    for label, values in rows:
        cells = [v.ljust(c) for v, c in zip(values, cols, strict=True)]
        lines.append(" | ".join([label.ljust(width), *cells]))
    for f in figures:
        lines.append(f"\n[{f.source}] empty parts: {f.empty_parts}")
        lines.append(f"[{f.source}] RL issues of converted trajectories: {f.rl['issues']}")
        if f.sft["first_assistant_difference"]:
            lines.append(
                f"[{f.source}] SFT assistant side, first difference: "
                f"{f.sft['first_assistant_difference']}"
            )
        if f.drift["examples"]:
            lines.append(f"[{f.source}] drift findings, first ones: {f.drift['examples']}")
        if f.cids["missing"]:
            lines.append(f"[{f.source}] cids not found: {f.cids['missing'][:5]}")
        for judge, per_variant in f.judges.items():
            for variant, v in per_variant.items():
                for error, n in v["errors"].items():
                    lines.append(f"[{f.source}] {judge} [{variant}] x{n}: {error}")
    return "\n".join(lines)


def main() -> None:
    """Measure both sources against a fresh server and print the table."""
    import json
    import tempfile
    from pathlib import Path

    from tests.compat.harness import build_synth_venv
    from tests.compat.sources import crafter_runs, example_runs, post_runs
    from tests.reliability.harness import ServerProcess

    producer = Producer(build_synth_venv())
    tmp = Path(tempfile.mkdtemp(prefix="tracestore-compat-"))
    figures: list[Figures] = []
    with (
        ServerProcess(f"sqlite:///{tmp / 'store.db'}", tmp / "server.log") as server,
        httpx.Client(base_url=server.url, timeout=120) as http,
    ):
        examples = example_runs()
        post_runs(server.url, examples)
        figures.append(measure("examples", examples, http, producer)[0])
        crafter, _ = crafter_runs(producer, server.url)
        figures.append(measure("crafter", crafter, http, producer)[0])
    print(table(figures))
    out = tmp / "compat-baseline.json"
    out.write_text(json.dumps([f.as_dict() for f in figures], indent=2, default=str))
    print(f"\nfigures: {out}")


if __name__ == "__main__":
    main()
