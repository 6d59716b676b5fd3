"""Drift over real HTTP on both databases: routes, legacy-read counting, /metrics."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select

from tests.conftest import Database, Example, LiveServer, row_counts
from tests.drift.helpers import created, label_figures
from tracestore.api import observability
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

# One named key, one bare key (named by its place: key-2).
KEYS = ["reader-one:reader-key-one", "reader-key-two"]
NAMES = {"reader-one": "reader-key-one", "key-2": "reader-key-two"}
SECRET = list(NAMES.values())


def _key_hashes(key: str) -> list[str]:
    # What /metrics used to show (an 8-hex sha256 prefix): enough to confirm a guessed key.
    return [hashlib.sha256(key.encode()).hexdigest()[:8]]


@pytest.fixture
def locked(database: Database, engine: Engine) -> Iterator[LiveServer]:
    """A server requiring API keys, with its own (fresh) read counters."""
    with LiveServer(Settings(database_url=database.url, api_keys=KEYS)) as live:
        yield live


def test_legacy_reads_are_counted_per_key_and_day(
    locked: LiveServer, engine: Engine, examples: list[Example]
) -> None:
    one, two = ({"X-API-Key": k} for k in SECRET)
    with httpx.Client(base_url=locked.url, timeout=60) as client:
        _post_all_keyed(client, examples, one)
        crafter = next(e for e in created(examples) if e.label["kind"] == "crafter")
        run = crafter.label["run_id"]
        for _ in range(2):
            assert client.get(f"/v1/rollouts/{run}", headers=one).status_code == 200
        assert client.get(f"/v1/rollouts/{run}/trajectories", headers=one).status_code == 200
        bearer = {"Authorization": f"Bearer {SECRET[1]}"}
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
    readers = {
        (r["client"], r["route"]): r["reads"]
        for r in phase3["figures"]["readers"]
        if r["client"] in NAMES
    }
    assert readers == {
        ("reader-one", "rollout"): 2,
        ("reader-one", "trajectories"): 1,
        ("key-2", "trajectories"): 1,
    }
    assert phase3["figures"]["legacy_reads"] >= 4
    with read_session(engine) as session:
        stored = " ".join(session.scalars(select(LegacyRead.client)))
    for key in SECRET:  # names only, never a key nor a hash of one
        assert key not in stored
        assert not any(h in stored for h in _key_hashes(key))


def _post_all_keyed(client: httpx.Client, examples: list[Example], key: dict[str, str]) -> None:
    body = b"\n".join(e.raw for e in examples)
    response = client.post("/v1/rollouts/batch", content=body, headers={**NDJSON, **key})
    assert response.status_code == 207, response.text


def _reads_of(engine: Engine, client: str) -> list[tuple[str, str, int]]:
    with read_session(engine) as session:
        rows = session.scalars(select(LegacyRead).where(LegacyRead.client == client))
        return [(r.client, r.route, r.reads) for r in rows]


def test_reads_are_flushed_at_shutdown(
    database: Database, engine: Engine, examples: list[Example], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No periodic flush while the server runs: only its shutdown can write the reads.
    monkeypatch.setattr(observability, "FLUSH_SECONDS", 3600.0)
    ex = next(e for e in created(examples) if e.doc.get("trajectories"))
    key = "shutdown-test-key"
    headers = {"X-API-Key": key}
    settings = Settings(database_url=database.url, api_keys=[f"at-shutdown:{key}"])
    with LiveServer(settings) as live:
        posted = httpx.post(f"{live.url}/v1/rollouts", content=ex.raw, headers=headers)
        assert posted.status_code == 201
        for _ in range(3):
            got = httpx.get(f"{live.url}/v1/rollouts/{ex.label['run_id']}", headers=headers)
            assert got.status_code == 200
        # Counted in the server's memory, not yet in the store.
        assert _reads_of(engine, "at-shutdown") == []
    assert _reads_of(engine, "at-shutdown") == [("at-shutdown", "rollout", 3)]


def test_report_and_metrics_need_a_key_when_keys_are_set(
    locked: LiveServer, database: Database
) -> None:
    # CONTRACT: with keys set, every HTML page with store data and /metrics need one.
    for path in ("/v1/drift", "/v1/migration/status", "/v1/rollouts/x/drift", "/reports/drift"):
        for headers in ({}, {"X-API-Key": "wrong"}):
            response = httpx.get(locked.url + path, headers=headers)
            assert response.status_code == 401, path
            assert response.json()["error"]["code"] == "unauthorized"
            # A browser asks for the key (Basic auth's password) instead of showing a 401.
            assert "Basic" in response.headers["www-authenticate"]
    assert httpx.get(locked.url + "/metrics").status_code == 401
    key = {"X-API-Key": SECRET[0]}
    assert httpx.get(locked.url + "/reports/drift", headers=key).status_code == 200
    assert httpx.get(locked.url + "/metrics", headers=key).status_code == 200
    browser = httpx.get(locked.url + "/reports/drift", auth=("anyone", SECRET[1]))
    assert browser.status_code == 200
    assert "text/html" in browser.headers["content-type"]
    assert httpx.get(locked.url + "/reports/drift", auth=("x", "wrong")).status_code == 401
    # Scrapers without a key: an explicit opt-in for /metrics only.
    scraped = Settings(database_url=database.url, api_keys=KEYS, metrics_public=True)
    with LiveServer(scraped) as live:
        assert httpx.get(live.url + "/metrics").status_code == 200
        assert httpx.get(live.url + "/reports/drift").status_code == 401
    for path in ("/health", "/info", "/docs", "/openapi.json"):
        assert httpx.get(locked.url + path).status_code == 200, path


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


# --- who a legacy read is counted under (issue 13, issue 18 item 8) -------------------------


def _phase3(
    client: httpx.Client, reads: int = 0, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Phase 3 of the status, once it shows `reads` reads (counted or not).

    The server counts a read after sending its response, so the next request may be
    answered first: ask again for a moment.
    """
    deadline = time.monotonic() + 10
    while True:
        status = client.get("/v1/migration/status", headers=headers).json()
        phase: dict[str, Any] = status["phases"][2]
        figures = phase["figures"]
        seen = figures["legacy_reads"] + figures["unattributed_reads"]
        if seen >= reads or time.monotonic() > deadline:
            return phase
        time.sleep(0.05)


def _legacy_and_trace_only(examples: list[Example]) -> tuple[str, str]:
    legacy = next(e for e in created(examples) if e.label["kind"] == "legacy_only")
    trace_only = next(e for e in created(examples) if e.label["kind"] == "trace_only")
    return legacy.label["run_id"], trace_only.label["run_id"]


def test_a_persons_look_at_a_run_does_not_hold_phase_3(
    database: Database, engine: Engine, examples: list[Example]
) -> None:
    legacy, trace_only = _legacy_and_trace_only(examples)
    with (
        LiveServer(Settings(database_url=database.url)) as live,
        httpx.Client(base_url=live.url, timeout=60) as client,
    ):
        _post_all(client, examples)
        # A person: curl without a label, then a browser tab (even one carrying a label).
        assert client.get(f"/v1/rollouts/{legacy}").status_code == 200
        browser = {"Sec-Fetch-Mode": "navigate", "X-Tracestore-Client": "trainer-a"}
        assert client.get(f"/v1/rollouts/{legacy}/trajectories", headers=browser).is_success
        # A run without trajectories: reading it whole reads no legacy trajectories.
        labelled = {"X-Tracestore-Client": "trainer-b"}
        assert client.get(f"/v1/rollouts/{trace_only}", headers=labelled).status_code == 200
        phase = _phase3(client, reads=2)
        assert phase["verdict"] == "ready", phase
        assert phase["figures"]["legacy_reads"] == 0
        # Listed, not counted (other tests' servers may add anonymous reads meanwhile).
        assert phase["figures"]["unattributed_reads"] >= 2
        assert {r["client"] for r in phase["figures"]["readers"]} == {"anonymous"}
        assert all(not r["counted"] for r in phase["figures"]["readers"])
        # A client consuming trajectories, labelled: that holds the migration.
        labelled_a = {"X-Tracestore-Client": "trainer-a"}
        assert client.get(f"/v1/rollouts/{legacy}/trajectories", headers=labelled_a).is_success
        assert client.get(f"/v1/rollouts/{legacy}", headers=labelled_a).is_success
        phase = _phase3(client, reads=4)
    assert phase["verdict"] == "not_ready"
    counted = {
        (r["client"], r["route"]): r["reads"] for r in phase["figures"]["readers"] if r["counted"]
    }
    assert counted == {("trainer-a", "trajectories"): 1, ("trainer-a", "rollout"): 1}
    assert phase["figures"]["legacy_reads"] == 2


def test_reader_labels_stay_bounded_and_hold_no_key_material(
    database: Database, engine: Engine, examples: list[Example]
) -> None:
    legacy, _ = _legacy_and_trace_only(examples)
    junk = [f"junk-key-{i:04d}" for i in range(300)]
    labels = [f"trainer-{i:02d}" for i in range(40)]
    with (
        LiveServer(Settings(database_url=database.url)) as live,
        httpx.Client(base_url=live.url, timeout=60) as client,
    ):
        _post_all(client, examples)
        path = f"/v1/rollouts/{legacy}/trajectories"
        for key in junk:  # open mode: keys authenticate nothing, and are never shown
            assert client.get(path, headers={"X-API-Key": key}).status_code == 200
        for label in [*labels, "not a label!", "anonymous"]:
            assert client.get(path, headers={"X-Tracestore-Client": label}).status_code == 200
        readers = _phase3(client, reads=len(junk) + len(labels) + 2)["figures"]["readers"]
        text = client.get("/metrics").text
    clients = set(re.findall(r'^tracestore_legacy_reads_total\{client="([^"]*)"', text, re.M))
    accepted = set(labels[:32])
    assert clients == {"unknown-key", "other", *accepted}
    assert _sample(text, "tracestore_legacy_reads_total", client="unknown-key") == len(junk)
    # 8 labels past the limit, one malformed, one reserved.
    assert _sample(text, "tracestore_legacy_reads_total", client="other") == 10
    for key in junk:
        assert key not in text
        assert not any(h in text for h in _key_hashes(key))
    assert {r["client"] for r in readers} == {"unknown-key", "other", *accepted}


def test_metrics_name_a_configured_key_never_show_it(
    locked: LiveServer, engine: Engine, examples: list[Example]
) -> None:
    legacy, _ = _legacy_and_trace_only(examples)
    headers = {"X-API-Key": SECRET[0]}
    with httpx.Client(base_url=locked.url, timeout=60) as client:
        _post_all_keyed(client, examples, headers)
        # A label does not override the key's name.
        labelled = {**headers, "X-Tracestore-Client": "someone-else"}
        assert client.get(f"/v1/rollouts/{legacy}/trajectories", headers=labelled).is_success
        # The read is counted once its response is sent: wait for it.
        _phase3(client, reads=1, headers=headers)
        text = client.get("/metrics", headers=headers).text
    assert _sample(text, "tracestore_legacy_reads_total", client="reader-one") == 1
    assert "someone-else" not in text
    for key in SECRET:
        assert key not in text
        assert not any(h in text for h in _key_hashes(key))


def test_drift_takes_the_run_lists_filters(http: Any, examples: list[Example]) -> None:
    # GET /v1/drift filters runs as GET /v1/rollouts does (one dependency), has_drift too.
    for ex in examples:
        http.post("/v1/rollouts", content=ex.raw)
    drifting = http.get("/v1/drift", params={"has_drift": "true"})
    assert drifting.status_code == 200, drifting.text
    clean = http.get("/v1/drift", params={"has_drift": "false"}).json()
    body = drifting.json()
    assert body["runs"] == body["runs_with_drift"] > 0
    assert clean["runs_with_drift"] == 0
    assert body["runs"] + clean["runs"] == http.get("/v1/drift").json()["runs"]
    listed = http.get("/v1/rollouts", params={"has_drift": "true", "limit": 1000}).json()
    assert len(listed["items"]) == body["runs"]
