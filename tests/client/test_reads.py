"""The client's reads, sync and async, against a live server over the examples: a rollout
(parsed and as its bytes), its trace and trajectories (stored or converted), the runs of a
cid, and every run of a filter through the cursor."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine

from tests.conftest import Example, LiveServer
from tests.drift.helpers import created, ingest_examples
from tracestore.client import (
    AsyncTracestoreClient,
    RunFilters,
    TracestoreClient,
    TracestoreHTTPError,
)
from tracestore.settings import Settings


def _by_kind(examples: list[Example], kind: str) -> Example:
    return next(e for e in created(examples) if e.label["kind"] == kind)


def test_sync_reads(server: LiveServer, engine: Engine, examples: list[Example]) -> None:
    ingest_examples(engine, examples)
    crafter = _by_kind(examples, "crafter")
    trace_only = _by_kind(examples, "trace_only")
    legacy = _by_kind(examples, "legacy_only")
    with TracestoreClient(server.url) as client:
        run_id = crafter.label["run_id"]
        assert client.get_rollout(run_id) == crafter.doc
        assert client.get_rollout_bytes(run_id) == crafter.raw
        assert client.get_trace(run_id) == crafter.doc["trace"]
        assert client.get_trajectories(run_id) == crafter.doc["trajectories"]
        # Converted on read: a trace-only run's trajectories, a legacy-only run's trace.
        converted = client.get_trajectories(trace_only.label["run_id"])
        assert len(converted[0]["steps"]) == trace_only.label["n_steps"]
        assert client.get_trace(legacy.label["run_id"])["session_time_steps"]
        drift = client.get_drift(run_id)
        assert drift["run_id"] == run_id
        found = client.find_by_cid(crafter.label["correlation_id"])
        assert [r["run_id"] for r in found["runs"]] == [run_id]
        with pytest.raises(TracestoreHTTPError) as missing:
            client.get_trace("no-such-run")
        assert missing.value.status == 404
        assert missing.value.code == "not_found"
        with pytest.raises(TracestoreHTTPError):
            client.find_by_cid("trace_nobody")


def _all_pages(client: TracestoreClient, filters: RunFilters) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = client.list_runs(filters, limit=1000, cursor=cursor)
        ids += [r["run_id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids


def test_iter_runs_follows_the_cursor(
    server: LiveServer, engine: Engine, examples: list[Example]
) -> None:
    ingest_examples(engine, examples)
    made = created(examples)
    with TracestoreClient(server.url) as client:
        every = [r["run_id"] for r in client.iter_runs(page_size=7)]
        assert len(every) == len(set(every)) == len(made)
        assert every == _all_pages(client, RunFilters())
        drifting = [r["run_id"] for r in client.iter_runs({"has_drift": True}, page_size=2)]
        assert set(drifting) == {e.label["run_id"] for e in made if e.label["drift"]}
        full = list(client.iter_runs(RunFilters(trace_kind="full", has_trajectories=False)))
        assert {r["run_id"] for r in full} == {
            e.label["run_id"] for e in made if e.label["kind"] == "trace_only"
        }
        assert list(client.iter_runs(RunFilters(since="1d", env_id="no-such-env"))) == []
        with pytest.raises(TypeError):
            list(client.iter_runs({"env": "x"}))  # a misspelt filter, refused before sending
        with pytest.raises(TracestoreHTTPError) as bad:
            list(client.iter_runs(RunFilters(since="not a time")))
        assert bad.value.status == 422


def test_async_reads_match_the_sync_ones(
    server: LiveServer, engine: Engine, examples: list[Example]
) -> None:
    ingest_examples(engine, examples)
    crafter = _by_kind(examples, "crafter")
    run_id = crafter.label["run_id"]

    async def read() -> dict[str, Any]:
        async with AsyncTracestoreClient(server.url) as client:
            return {
                "rollout": await client.get_rollout(run_id),
                "bytes": await client.get_rollout_bytes(run_id),
                "trace": await client.get_trace(run_id),
                "trajectories": await client.get_trajectories(run_id),
                "cid": await client.find_by_cid(crafter.label["correlation_id"]),
                "runs": [r["run_id"] async for r in client.iter_runs(page_size=9)],
                "report": await client.drift_report(days="3650"),
                "info": await client.info(),
            }

    got = asyncio.run(read())
    with TracestoreClient(server.url) as client:
        assert got["rollout"] == client.get_rollout(run_id)
        assert got["bytes"] == crafter.raw
        assert got["trace"] == client.get_trace(run_id)
        assert got["trajectories"] == client.get_trajectories(run_id)
        assert got["cid"] == client.find_by_cid(crafter.label["correlation_id"])
        assert got["runs"] == [r["run_id"] for r in client.iter_runs()]
        assert got["info"] == client.info()
    assert got["info"]["limits"]["max_batch_items"] == Settings().max_batch_items
    assert got["report"]["summary"]["runs"] == len(created(examples))
    assert orjson.loads(got["bytes"]) == crafter.doc


def test_an_empty_run_id_is_refused_before_anything_is_sent() -> None:
    # "" made the list's address: a 307 with an empty message (exploratory QA).
    with TracestoreClient("http://127.0.0.1:9") as client:  # nothing listens: not reached
        for read in (client.get_rollout, client.get_trace, client.get_rollout_bytes):
            with pytest.raises(ValueError, match="run_id is empty"):
                read("")
