"""Drift over real HTTP on both databases: routes, legacy-read counting, /metrics."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select

from tests.conftest import Database, Example, LiveServer, row_counts
from tests.drift.helpers import created, label_figures
from tracestore.db.uow import read_session
from tracestore.models.drift import LegacyRead
from tracestore.settings import Settings

NDJSON = {"Content-Type": "application/x-ndjson"}


def _post_all(client: httpx.Client, examples: list[Example]) -> None:
    body = b"\n".join(e.raw for e in examples)
    response = client.post("/v1/rollouts/batch", content=body, headers=NDJSON)
    assert response.status_code == 207, response.text


def test_drift_summary_and_findings_equal_labels(http: Any, examples: list[Example]) -> None:
    _post_all(http, examples)
    expected = label_figures(examples)
    body = http.get("/v1/drift", params={"limit": 3}).json()
    for key in ("runs", "comparable_runs", "comparable_runs_with_drift", "runs_with_drift"):
        assert body[key] == expected[key], key
    assert body["drift_rate"] == pytest.approx(expected["drift_rate"])
    assert body["not_comparable"] == expected["not_comparable"]
    assert {k: v["runs"] for k, v in body["by_kind"].items() if v["runs"]} == expected["kinds"]
    # Page through every finding: each run's kinds are its label's.
    found: dict[str, set[str]] = {}
    page = body["findings"]
    pages = 1
    while True:
        assert len(page["items"]) <= 3
        for item in page["items"]:
            found.setdefault(item["run_id"], set()).add(item["kind"])
        if page["next_cursor"] is None:
            break
        page = http.get("/v1/drift", params={"limit": 3, "cursor": page["next_cursor"]}).json()
        page = page["findings"]
        pages += 1
    labelled = {e.label["run_id"]: set(e.label["drift"]) for e in created(examples)}
    assert found == {r: k for r, k in labelled.items() if k}
    assert pages == -(-sum(len(k) for k in labelled.values()) // 3)


def test_drift_filters(http: Any, examples: list[Example]) -> None:
    _post_all(http, examples)
    rewards = http.get("/v1/drift", params={"kind": "reward_mismatch"}).json()
    reward_runs = {
        e.label["run_id"] for e in created(examples) if "reward_mismatch" in e.label["drift"]
    }
    assert rewards["comparable_runs_with_drift"] == len(reward_runs)
    assert {i["run_id"] for i in rewards["findings"]["items"]} == reward_runs
    assert {i["kind"] for i in rewards["findings"]["items"]} == {"reward_mismatch"}
    drifted = next(e for e in created(examples) if e.label["drift"])
    env = drifted.doc["trajectories"][0]["env_id"]
    by_env = http.get("/v1/drift", params={"env_id": env}).json()
    assert (by_env["comparable_runs"], by_env["comparable_runs_with_drift"]) == (1, 1)
    assert by_env["by_env"] == [
        {"env_id": env, "comparable_runs": 1, "runs_with_drift": 1, "drift_rate": 1.0}
    ]
    later = http.get("/v1/drift", params={"since": "2999-01-01T00:00:00Z"}).json()
    assert (later["runs"], later["drift_rate"], later["findings"]["items"]) == (0, None, [])


@pytest.mark.parametrize(
    ("params", "path"),
    [({"kind": "nonsense"}, None), ({"cursor": "not-a-cursor"}, None), ({"limit": 0}, "limit")],
)
def test_drift_refuses_bad_parameters(http: Any, params: dict[str, Any], path: str | None) -> None:
    response = http.get("/v1/drift", params=params)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    if path:
        assert path in error["message"]


def test_run_drift_route(http: Any, examples: list[Example]) -> None:
    _post_all(http, examples)
    ex = next(e for e in created(examples) if e.label["drift"] == ["done_mismatch"])
    body = http.get(f"/v1/rollouts/{ex.label['run_id']}/drift").json()
    assert body["stored"] is True
    assert body["comparable"] is True
    assert [f["kind"] for f in body["findings"]] == ["done_mismatch"]
    finding = body["findings"][0]
    step = ex.doc["trajectories"][finding["trajectory_index"]]["steps"][finding["step_index"]]
    assert finding["expected"] == str(step["done"]).lower()
    assert finding["actual"] == str(not step["done"]).lower()
    missing = http.get("/v1/rollouts/no-such-run/drift")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_migration_status_route(http: Any, examples: list[Example]) -> None:
    _post_all(http, examples)
    expected = label_figures(examples)
    body = http.get("/v1/migration/status").json()
    phases = {p["phase"]: p for p in body["phases"]}
    assert set(phases) == {1, 2, 3}
    assert phases[1]["figures"]["usable_trace_runs"] == expected["usable_trace_runs"]
    assert phases[1]["figures"]["reproducing_runs"] == expected["reproducing_runs"]
    assert phases[1]["figures"]["dual_serialized_runs"] == expected["dual_serialized_runs"]
    assert phases[2]["figures"]["drift_rate"] == pytest.approx(expected["drift_rate"])
    assert [phases[n]["verdict"] for n in (1, 2)] == ["not_ready", "not_ready"]
    # A generous budget lets phase 2 pass; phase 1's gates do not move with it enough.
    lenient = http.get("/v1/migration/status", params={"budget": 0.5}).json()
    assert lenient["phases"][1]["verdict"] == "ready"
    assert lenient["phases"][1]["figures"]["budget"] == 0.5
    empty = http.get(
        "/v1/migration/status",
        params={"since": "2999-01-01T00:00:00Z", "until": "2999-01-02T00:00:00Z"},
    )
    assert [p["verdict"] for p in empty.json()["phases"]][:2] == [
        "insufficient_data",
        "insufficient_data",
    ]
    backwards = http.get(
        "/v1/migration/status", params={"since": "2026-01-02T00:00:00Z", "until": "2026-01-01"}
    )
    assert backwards.status_code == 422


# --- legacy reads and auth ----------------------------------------------------------------

KEYS = ["reader-key-one", "reader-key-two"]


def _label(key: str) -> str:
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:8]


@pytest.fixture
def locked(database: Database, engine: Engine) -> Iterator[LiveServer]:
    """A server requiring API keys, with its own (fresh) read counters."""
    with LiveServer(Settings(database_url=database.url, api_keys=KEYS)) as live:
        yield live


def test_legacy_reads_are_counted_per_key_and_day(
    locked: LiveServer, engine: Engine, examples: list[Example]
) -> None:
    one, two = ({"X-API-Key": k} for k in KEYS)
    with httpx.Client(base_url=locked.url, timeout=60) as client:
        _post_all_keyed(client, examples, one)
        crafter = next(e for e in created(examples) if e.label["kind"] == "crafter")
        run = crafter.label["run_id"]
        for _ in range(2):
            assert client.get(f"/v1/rollouts/{run}", headers=one).status_code == 200
        assert client.get(f"/v1/rollouts/{run}/trajectories", headers=one).status_code == 200
        bearer = {"Authorization": f"Bearer {KEYS[1]}"}
        assert client.get(f"/v1/rollouts/{run}/trajectories", headers=bearer).status_code == 200
        # Not counted: a failed read, a refused key, other routes.
        assert client.get("/v1/rollouts/no-such-run", headers=one).status_code == 404
        assert client.get(f"/v1/rollouts/{run}", headers={"X-API-Key": "wrong"}).status_code == 401
        assert client.get(f"/v1/rollouts/{run}/trace", headers=two).status_code == 200
        assert client.get(f"/v1/rollouts/{run}/drift", headers=two).status_code == 200
        status = client.get("/v1/migration/status", headers=two).json()
    phase3 = status["phases"][2]
    assert phase3["verdict"] == "not_ready"
    # Only this server's keys: other tests' servers may flush anonymous reads meanwhile.
    mine = {_label(k) for k in KEYS}
    readers = {
        (r["client"], r["route"]): r["reads"]
        for r in phase3["figures"]["readers"]
        if r["client"] in mine
    }
    assert readers == {
        (_label(KEYS[0]), "rollout"): 2,
        (_label(KEYS[0]), "trajectories"): 1,
        (_label(KEYS[1]), "trajectories"): 1,
    }
    assert phase3["figures"]["legacy_reads"] >= 4
    with read_session(engine) as session:
        stored = " ".join(session.scalars(select(LegacyRead.client)))
    assert not any(key in stored for key in KEYS)  # labels only, never a key


def _post_all_keyed(client: httpx.Client, examples: list[Example], key: dict[str, str]) -> None:
    body = b"\n".join(e.raw for e in examples)
    response = client.post("/v1/rollouts/batch", content=body, headers={**NDJSON, **key})
    assert response.status_code == 207, response.text


def test_reads_are_flushed_at_shutdown(
    database: Database, engine: Engine, examples: list[Example]
) -> None:
    ex = created(examples)[0]
    key = "shutdown-test-key"
    headers = {"X-API-Key": key}
    with LiveServer(Settings(database_url=database.url, api_keys=[key])) as live:
        posted = httpx.post(f"{live.url}/v1/rollouts", content=ex.raw, headers=headers)
        assert posted.status_code == 201
        for _ in range(3):
            got = httpx.get(f"{live.url}/v1/rollouts/{ex.label['run_id']}", headers=headers)
            assert got.status_code == 200
    # No status request flushed them: the shutdown did.
    with read_session(engine) as session:
        rows = [
            (r.client, r.route, r.reads)
            for r in session.scalars(select(LegacyRead).where(LegacyRead.client == _label(key)))
        ]
    assert rows == [(_label(key), "rollout", 3)]


def test_report_and_metrics_need_no_key_but_v1_drift_does(locked: LiveServer) -> None:
    for path in ("/v1/drift", "/v1/migration/status", "/v1/rollouts/x/drift"):
        response = httpx.get(locked.url + path)
        assert response.status_code == 401, path
        assert response.json()["error"]["code"] == "unauthorized"
    assert httpx.get(locked.url + "/reports/drift").status_code == 200
    assert httpx.get(locked.url + "/metrics").status_code == 200


# --- /metrics -----------------------------------------------------------------------------


def _sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match:
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(match.group(2))
    raise AssertionError(f"no sample {name} {labels}")


def test_metrics(database: Database, engine: Engine, examples: list[Example]) -> None:
    half = len(examples) // 2
    settings = Settings(database_url=database.url)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        # The first half one by one (outcome from the status code), the rest as a batch.
        for ex in examples[:half]:
            client.post("/v1/rollouts", content=ex.raw)
        _post_all(client, examples[half:])
        assert client.post("/v1/rollouts", content=b"{nope").status_code == 400
        run = created(examples)[0].label["run_id"]
        assert client.get(f"/v1/rollouts/{run}").status_code == 200
        text = client.get("/metrics").text
    expect = {
        s: sum(e.label["expect_status"] == s for e in examples)
        for s in ("created", "duplicate", "conflict")
    }
    for status, n in expect.items():
        assert _sample(text, "tracestore_ingest_rollouts_total", status=status) == n, status
    assert _sample(text, "tracestore_ingest_rollouts_total", status="invalid") == 1
    figures = label_figures(examples)
    for kind in ("reward_mismatch", "done_mismatch", "step_count_mismatch"):
        assert _sample(text, "tracestore_drift_findings", kind=kind) == figures["kinds"].get(
            kind, 0
        )
    assert _sample(text, "tracestore_drift_runs", state="comparable") == figures["comparable_runs"]
    # Latencies are labelled by route template: run ids never become label values.
    assert (
        _sample(
            text,
            "tracestore_http_request_duration_seconds_count",
            method="GET",
            route="/v1/rollouts/{run_id}",
            status="200",
        )
        == 1
    )
    assert run not in text
    assert _sample(text, "tracestore_legacy_reads_total", client="anonymous", route="rollout") == 1
    assert row_counts(engine)["runs"] == figures["runs"]


def test_budget_comes_from_settings(
    database: Database, engine: Engine, examples: list[Example]
) -> None:
    settings = Settings(database_url=database.url, drift_budget=0.5)
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        _post_all(client, examples)
        phase2 = client.get("/v1/migration/status").json()["phases"][1]
    assert phase2["figures"]["budget"] == 0.5
    assert phase2["verdict"] == "ready"
