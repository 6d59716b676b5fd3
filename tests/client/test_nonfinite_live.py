"""Against a live server: a rollout with NaN or Infinity is refused before any request.

Nothing reaches the server or the spool, a batch with one bad rollout sends none of
them, and the same client then posts finite rollouts as usual (the request counter works).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import LiveServer, minimal_rollout
from tracestore.client import AsyncTracestoreClient, NonFiniteNumberError, TracestoreClient


def _counting(requests: list[str]) -> dict[str, list[Any]]:
    return {"request": [lambda request: requests.append(request.url.path)]}


def _async_counting(requests: list[str]) -> dict[str, list[Any]]:
    async def count(request: httpx.Request) -> None:
        requests.append(request.url.path)

    return {"request": [count]}


def test_the_sync_client_refuses_nan_before_sending_or_spooling(
    server: LiveServer, http: httpx.Client, tmp_path: Path
) -> None:
    requests: list[str] = []
    spool = tmp_path / "nan.spool"
    with TracestoreClient(server.url, spool=spool, event_hooks=_counting(requests)) as client:
        with pytest.raises(
            NonFiniteNumberError, match=r"NaN at \$\.trajectories\[0\]\.steps\[0\]\.reward"
        ):
            client.post_rollout(minimal_rollout("sync-nan", reward=math.nan))
        bad = orjson.dumps(minimal_rollout("sync-inf")).replace(b"1.0]", b"Infinity]")
        with pytest.raises(NonFiniteNumberError, match="Infinity"):
            client.post_rollout(bad)
        with pytest.raises(NonFiniteNumberError, match=r"'batch-inf' \(item 1 of the batch\)"):
            client.post_batch(
                [minimal_rollout("batch-ok"), minimal_rollout("batch-inf", reward=-math.inf)]
            )
        assert requests == []
        assert client.post_rollout(minimal_rollout("sync-fine"))["status"] == "created"
    assert requests == ["/v1/rollouts"]
    assert not spool.exists()
    for run_id in ("sync-nan", "sync-inf", "batch-ok", "batch-inf"):
        assert http.get(f"/v1/rollouts/{run_id}").status_code == 404, run_id


def test_the_async_client_refuses_nan_before_sending_or_spooling(
    server: LiveServer, http: httpx.Client, tmp_path: Path
) -> None:
    requests: list[str] = []
    spool = tmp_path / "nan.spool"

    async def scenario() -> None:
        async with AsyncTracestoreClient(
            server.url, spool=spool, event_hooks=_async_counting(requests)
        ) as client:
            with pytest.raises(NonFiniteNumberError, match="NaN at"):
                await client.post_rollout(minimal_rollout("async-nan", reward=math.nan))
            with pytest.raises(NonFiniteNumberError, match=r"item 0 of the batch"):
                await client.post_batch([minimal_rollout("async-batch", reward=math.inf)])
            assert requests == []
            body = await client.post_batch([minimal_rollout("async-fine")])
            assert body["summary"]["created"] == 1

    asyncio.run(scenario())
    assert requests == ["/v1/rollouts/batch"]
    assert not spool.exists()
    assert http.get("/v1/rollouts/async-nan").status_code == 404
    assert http.get("/v1/rollouts/async-batch").status_code == 404
