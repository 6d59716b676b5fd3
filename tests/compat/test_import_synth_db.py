"""Importing synth-ai's own trace database (issue 16), written by synth-ai's own tracer.

The producer's venv records sessions with SessionTracer into a SQLite file through
synth-ai's storage (tests/compat/synth_tracer.py, mode `fixture`: LM calls with tool
calls, several time steps, rewards and outcome rewards, a session with JSON message
content stored whole, runtime events, an empty session). tracestore imports that file;
what it serves is compared with what the tracer recorded, and synth-ai's own readers and
models judge the imported documents. Every test runs on each store backend (--db).
"""

from __future__ import annotations

import copy
import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import Engine

from tests.compat.harness import Producer
from tests.conftest import Database, LiveServer, row_counts, wipe
from tracestore.db.engine import create_engine
from tracestore.ingest.service import ingest_many
from tracestore.ingest.synth_db import IMPORT_KEY, Imported, SynthDatabase, iter_rollouts
from tracestore.settings import Settings

TRACESTORE = str(Path(sys.executable).parent / "tracestore")
SESSIONS = ("import-tools", "import-json", "import-runtime", "import-empty")
# The sessions SessionTracer wrote as it went: their time steps' completed_at never reached
# synth-ai's store (it stores a step when it starts and never updates it).
WRITTEN_AS_IT_WENT = ("import-tools", "import-runtime", "import-empty")


@pytest.fixture(scope="module")
def synth(producer: Producer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fixture database, written by synth-ai, and what its tracer recorded."""
    path = tmp_path_factory.mktemp("synth") / "traces.db"
    answer = producer.synth_tracer({"mode": "fixture", "db": str(path)})
    assert sorted(answer["sessions"]) == sorted(SESSIONS)
    return {"path": path, "recorded": answer["sessions"], "producer": answer["producer"]}


def _import(engine: Engine, path: Path) -> dict[str, str]:
    """Import every session in-process (the command's own path); run_id -> status."""
    with SynthDatabase(path) as db:
        built = [b for b in iter_rollouts(db, db.session_ids()) if isinstance(b, Imported)]
    results = ingest_many(engine, [(b.raw, b.doc) for b in built])
    return {r.run_id or "?": r.status for r in results}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TRACESTORE, *args], capture_output=True, text=True, timeout=300, check=False
    )


def _expected_trace(session_id: str, recorded: dict[str, Any]) -> dict[str, Any]:
    """The recorded trace with what synth-ai's store cannot give back as the import says."""
    trace: dict[str, Any] = copy.deepcopy(recorded["trace"])
    events = list(trace["event_history"])
    for step in trace["session_time_steps"]:
        events.extend(step["events"])
        if session_id in WRITTEN_AS_IT_WENT:
            step["completed_at"] = None  # loss entry `missing` (asserted below)
    for event in events:
        if event.get("cost_usd") is not None:
            # Whole cents, truncated (int(usd * 100)): loss entry `default` (asserted below).
            event["cost_usd"] = int(event["cost_usd"] * 100) / 100
    return trace


def test_served_traces_are_what_the_tracer_recorded(
    synth: dict[str, Any], engine: Engine, http: httpx.Client
) -> None:
    assert _import(engine, synth["path"]) == dict.fromkeys(SESSIONS, "created")
    for session_id, recorded in synth["recorded"].items():
        got = http.get(f"/v1/rollouts/{session_id}/trace")
        assert got.status_code == 200
        assert got.headers["x-tracestore-source"] == "stored"
        trace = got.json()
        # Rewards synth-ai keeps beside the trace come along under its read-back's names.
        trace.pop("event_rewards", None)
        trace.pop("outcome_rewards", None)
        experiment = trace.pop("experiment", None)
        assert trace.pop("experiment_id", None) == (
            "exp-1" if session_id == "import-runtime" else None
        )
        assert trace == _expected_trace(session_id, recorded), session_id
        if session_id == "import-runtime":
            assert experiment["name"] == "grid sweep"
            assert experiment["configuration"] == {"lr": 0.1}


def test_served_trajectories_match_the_recorded_steps(
    synth: dict[str, Any], engine: Engine, http: httpx.Client
) -> None:
    _import(engine, synth["path"])
    for session_id, recorded in synth["recorded"].items():
        got = http.get(f"/v1/rollouts/{session_id}/trajectories")
        if not recorded["steps"]:
            # No environment event: no step to serve (the empty session).
            assert got.status_code == 200, session_id
            assert got.json() == [], session_id
            continue
        assert got.headers["x-tracestore-source"] == "converted"
        (trajectory,) = got.json()
        steps = [
            {k: s[k] for k in ("reward", "done", "truncated", "obs", "tool_calls")}
            for s in trajectory["steps"]
        ]
        assert steps == recorded["steps"], session_id
        lm_calls = session_id in ("import-tools", "import-json")
        for n, step in enumerate(trajectory["steps"]):
            # What the RL trainer reads from each step: the LM call's usage and latency.
            meta = step["info"]["meta"]
            assert ("usage" in meta) is lm_calls
            if lm_calls:
                assert meta["usage"]["total_tokens"] == 110 + n
                assert meta["inference_ms"] == 40 + n
    served = http.get("/v1/rollouts/import-json/trajectories").json()[0]
    url = "https://infer.example/v1/chat/completions?cid=trace_import_json"
    assert served["inference_url"] == url
    assert served["trace_correlation_id"] == "trace_import_json"


def test_second_import_adds_nothing(
    synth: dict[str, Any], database: Database, engine: Engine
) -> None:
    first = _cli("import", "synth-db", str(synth["path"]), "--db", database.url)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "4 rollouts: 4 created, 0 duplicate, 0 conflict, 0 invalid" in first.stdout
    assert "4 sessions (15 events, 16 messages)" in first.stdout
    assert "sessions/s" in first.stdout
    assert "events/s" in first.stdout
    assert "cost_usd" in first.stdout  # the closing summary names the losses
    counts = row_counts(engine)
    assert counts["runs"] == 4
    assert counts["trace_events"] == 15
    assert counts["trace_messages"] == 16
    again = _cli("import", "synth-db", f"sqlite+aiosqlite:///{synth['path']}", "--db", database.url)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 rollouts: 0 created, 4 duplicate, 0 conflict, 0 invalid" in again.stdout
    assert row_counts(engine) == counts


def test_an_interrupted_import_is_finished_by_running_it_again(
    synth: dict[str, Any], database: Database, engine: Engine
) -> None:
    # An import stopped after its first batch: those sessions are stored, the rest are not.
    with SynthDatabase(synth["path"]) as db:
        first = [b for b in iter_rollouts(db, db.session_ids()[:2]) if isinstance(b, Imported)]
    ingest_many(engine, [(b.raw, b.doc) for b in first])
    done = _cli("import", "synth-db", str(synth["path"]), "--db", database.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 rollouts: 2 created, 2 duplicate, 0 conflict, 0 invalid" in done.stdout
    assert row_counts(engine)["runs"] == 4


def test_the_database_is_only_read(synth: dict[str, Any], engine: Engine) -> None:
    path: Path = synth["path"]
    before = path.read_bytes()
    _import(engine, path)
    assert path.read_bytes() == before
    assert not Path(f"{path}-journal").exists()


def test_imported_runs_are_first_class(
    synth: dict[str, Any], engine: Engine, http: httpx.Client
) -> None:
    _import(engine, synth["path"])
    # Drift: a trace-only run has one form, so it is checked and not comparable.
    drift = http.get("/v1/rollouts/import-tools/drift").json()
    assert drift["comparable"] is False
    assert drift["reason"] == "no_trajectories"
    summary = http.get("/v1/drift").json()
    assert summary["checked_runs"] == 4
    assert summary["comparable_runs"] == 0
    assert summary["not_comparable"] == {"no_trajectories": 4}
    # Look-ups: by cid (from the session metadata, and from a call record's URL), listings.
    for cid, run_id in (
        ("trace_import_tools", "import-tools"),
        ("trace_import_json", "import-json"),
    ):
        runs = http.get(f"/v1/correlations/{cid}").json()["runs"]
        assert [r["run_id"] for r in runs] == [run_id]
    listed = {r["run_id"]: r for r in http.get("/v1/rollouts?trace_kind=full").json()["items"]}
    assert set(listed) == set(SESSIONS)
    tools = listed["import-tools"]
    assert tools["n_steps"] == 3
    assert tools["step_source"] == "trace"
    assert tools["mean_return"] == 1.5
    assert tools["correlation_source"] == "top_level"
    assert listed["import-json"]["policy_ids"] == ["p-1"]
    # The metrics come from the rewards.
    doc = http.get("/v1/rollouts/import-tools").json()
    assert doc["trajectories"] == []
    assert doc["metrics"]["episode_returns"] == [1.5]
    assert doc["metrics"]["num_steps"] == 3
    assert doc["metrics"]["outcome_score"] == 2.0
    assert doc["metrics"]["details"]["event_reward_totals"] == {
        "sparse": 1.5,
        "achievement_delta": 3.0,
    }
    # The inspector: the run's page, and its panels as JSON (steps from the trace).
    page = http.get("/runs/import-tools")
    assert page.status_code == 200
    assert "import-tools" in page.text
    inspected = http.get("/v1/inspect/import-tools").json()
    assert inspected["rewards"]["trace"] == [0.5, 0.0, 1.0]
    assert inspected["header"]["step_source"] == "trace"
    # Reports (DuckDB): each imported run with a step is an episode, its trace's return.
    report = http.get("/v1/reports/returns", params={"format": "json"})
    assert report.status_code == 200, report.text
    rows = report.json()["rows"]
    assert sum(row["episodes"] for row in rows) == 3  # the empty session has no step
    by_policy = {row["policy_id"]: row for row in rows}
    assert by_policy["p-1"]["mean_return"] == 0.75  # import-json: 0.25 + 0.5
    assert by_policy["p-1"]["mean_length"] == 2.0


def test_the_loss_report_says_what_synth_ai_could_not_keep(
    synth: dict[str, Any], engine: Engine, http: httpx.Client
) -> None:
    _import(engine, synth["path"])

    def losses(run_id: str) -> tuple[bool, dict[str, tuple[str, int]]]:
        report = http.get(f"/v1/rollouts/{run_id}").json()[IMPORT_KEY]
        assert report["session_id"] == run_id
        assert report["importer_version"] == "1"
        return report["lossless"], {e["path"]: (e["kind"], e["count"]) for e in report["losses"]}

    lossless, tools = losses("import-tools")
    assert lossless is False
    assert tools["trace.event_history[*].cost_usd"] == ("default", 3)
    # Written as it went: the three tool-call messages' content slot is read from the JSON.
    assert tools["trace.markov_blanket_message_history[*].content"] == ("default", 3)
    assert tools["trace.session_time_steps[*].completed_at"] == ("missing", 3)
    lossless, stored_whole = losses("import-json")
    # Stored whole, synth-ai's store said which slot each message's content had.
    assert "trace.markov_blanket_message_history[*].content" not in stored_whole
    assert "trace.session_time_steps[*].completed_at" not in stored_whole
    assert stored_whole["trace.event_history[*].cost_usd"] == ("default", 2)
    lossless, runtime = losses("import-runtime")
    assert lossless is True
    assert set(runtime) == {"trace.session_time_steps[*].completed_at"}


def test_synth_ai_reads_the_imported_documents(
    synth: dict[str, Any], producer: Producer, engine: Engine, http: httpx.Client
) -> None:
    """synth-ai's models and trace readers take what tracestore stores and serves."""
    _import(engine, synth["path"])
    documents: dict[str, Any] = {}
    for session_id in SESSIONS:
        doc = http.get(f"/v1/rollouts/{session_id}").json()
        documents[f"{session_id}:stored"] = doc
        served = http.get(f"/v1/rollouts/{session_id}/trajectories").json()
        documents[f"{session_id}:served"] = {**doc, "trajectories": served}
    verdicts, _ = producer.judge(documents, ["rollout_response", "trace_reader", "judge_payload"])
    for ident, verdict in verdicts.items():
        assert verdict["rollout_response"]["ok"], (ident, verdict["rollout_response"])
        assert all(t["ok"] for t in verdict["rollout_response"]["trajectories"]), ident
        assert verdict["judge_payload"]["ok"], (ident, verdict["judge_payload"])
        reader = verdict["trace_reader"]
        assert reader["ok"], (ident, reader)
        recorded = synth["recorded"][ident.split(":")[0]]["trace"]
        assert reader["events"] == len(recorded["event_history"])
        assert reader["messages"] == len(recorded["markov_blanket_message_history"])
        assert reader["steps"] == len(recorded["session_time_steps"])


def test_synth_ai_read_back_is_accepted_by_ingest(
    synth: dict[str, Any], producer: Producer, http: httpx.Client
) -> None:
    """load_session_trace gives 0/1 for booleans: accepted, and kept as sent."""
    answer = producer.synth_tracer(
        {"mode": "readback", "db": str(synth["path"]), "session_ids": ["import-tools"]}
    )
    trace = answer["traces"]["import-tools"]
    assert [e["terminated"] for e in trace["event_history"]] == [None, 0, None, 0, None, 1]
    doc = {
        "run_id": "readback-1",
        "trajectories": [],
        "metrics": {"episode_returns": [1.5], "mean_return": 1.5, "num_steps": 3},
        "trace": trace,
    }
    raw = orjson.dumps(doc)
    posted = http.post("/v1/rollouts", content=raw, headers={"content-type": "application/json"})
    assert posted.status_code == 201, posted.text
    assert http.get("/v1/rollouts/readback-1").content == raw  # the 0/1 kept as received
    steps = http.get("/v1/rollouts/readback-1/trajectories").json()[0]["steps"]
    assert [(s["reward"], s["done"], s["truncated"]) for s in steps] == [
        (0.5, False, False),
        (0.0, False, False),
        (1.0, True, False),
    ]


def test_run_ids_from_a_map(synth: dict[str, Any], database: Database, engine: Engine) -> None:
    mapping = synth["path"].parent / "runs.csv"
    with mapping.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["session_id", "run_id"])
        writer.writerow(["import-tools", "rollout-0001"])
    done = _cli(
        "import", "synth-db", str(synth["path"]), "--db", database.url, "--map", str(mapping)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with create_engine(database.url).connect() as conn:
        from sqlalchemy import text

        run_ids = set(conn.execute(text("SELECT run_id FROM runs")).scalars())
    assert run_ids == {"rollout-0001", "import-json", "import-runtime", "import-empty"}
    # The same sessions under other run_ids are other rollouts: mapped again, duplicates.
    mapping_json = synth["path"].parent / "runs.json"
    mapping_json.write_text(json.dumps({"import-tools": "rollout-0001"}))
    again = _cli(
        "import", "synth-db", str(synth["path"]), "--db", database.url, "--map", str(mapping_json)
    )
    assert "0 created, 4 duplicate" in again.stdout, again.stdout + again.stderr


def test_import_into_a_running_server(synth: dict[str, Any], database: Database) -> None:
    engine = create_engine(database.url)
    wipe(engine)
    try:
        with LiveServer(Settings(database_url=database.url)) as live:
            done = _cli("import", "synth-db", str(synth["path"]), "--url", live.url)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "4 created" in done.stdout
            got = httpx.get(f"{live.url}/v1/rollouts/import-json/trace").json()
            assert got["session_id"] == "import-json"
    finally:
        wipe(engine)
        engine.dispose()


@pytest.fixture(scope="module")
def crafter(producer: Producer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The real grpo-crafter task app's rollouts, and the trace database its tracer wrote."""
    path = tmp_path_factory.mktemp("crafter") / "task_traces.db"
    out = producer.crafter_rollouts((0, 1), 3, None, trace_db=path)
    return {"path": path, "rollouts": {r["run_id"]: r for r in out["rollouts"]}}


def test_the_task_apps_own_database_imports(
    crafter: dict[str, Any], engine: Engine, http: httpx.Client
) -> None:
    """What the app's tracer stored serves the steps the app returned in its rollouts."""
    statuses = _import(engine, crafter["path"])
    assert statuses == dict.fromkeys(crafter["rollouts"], "created")
    for run_id, rollout in crafter["rollouts"].items():
        (returned,) = rollout["trajectories"]
        served = http.get(f"/v1/rollouts/{run_id}/trajectories").json()[0]
        assert len(served["steps"]) == len(returned["steps"]) == 3
        for ours, theirs in zip(served["steps"], returned["steps"], strict=True):
            assert ours["obs"] == theirs["obs"]
            assert ours["reward"] == float(theirs["reward"] or 0.0)
            assert ours["done"] is bool(theirs["done"])
            assert ours["truncated"] is bool(theirs["truncated"])
            # The calls the model made (its call record): the app's step keeps the actions
            # it ran, which may be fewer; the tool is the same.
            assert [c["tool_name"] for c in ours["tool_calls"]] == [
                c["tool_name"] for c in theirs["tool_calls"]
            ]
        report = http.get(f"/v1/rollouts/{run_id}").json()[IMPORT_KEY]
        kinds = {e["path"]: e["kind"] for e in report["losses"]}
        # The app records `policy_*` message types that synth-ai's store refuses (its CHECK
        # allows user/assistant/system/tool_use/tool_result): the session row counts them,
        # the table holds none, and the import says so.
        assert kinds["trace.markov_blanket_message_history"] == "lost"
