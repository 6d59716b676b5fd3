"""GET /v1/rollouts (filters, keyset cursor) and summaries."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.conftest import Example

Param = str | int | float | bool | None  # a query parameter's value, as httpx takes it


@pytest.fixture
def loaded(http: httpx.Client, examples: list[Example]) -> list[Example]:
    created = []
    for ex in examples:
        if http.post("/v1/rollouts", content=ex.raw).status_code == 201:
            created.append(ex)
    return created


def _all_pages(http: httpx.Client, **params: Param) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    cursor = None
    while True:
        query = dict(params, **({"cursor": cursor} if cursor else {}))
        page = http.get("/v1/rollouts", params=query)
        assert page.status_code == 200, page.text
        body = page.json()
        items.extend(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return items


def test_pages_cover_every_run_once_newest_first(http: httpx.Client, loaded: list[Example]) -> None:
    items = _all_pages(http, limit=7)
    assert [i["run_id"] for i in items] == [ex.label["run_id"] for ex in reversed(loaded)]


def test_summary_fields(http: httpx.Client, loaded: list[Example]) -> None:
    ex = next(e for e in loaded if e.label["kind"] == "crafter")
    item = next(i for i in _all_pages(http, limit=1000) if i["run_id"] == ex.label["run_id"])
    traj = ex.doc["trajectories"][0]
    assert item["correlation_id"] == ex.label["correlation_id"]
    assert item["correlation_source"] == ex.label["correlation_source"]
    assert item["trace_kind"] == "full"
    assert item["n_trajectories"] == 1
    assert item["n_steps"] == ex.label["n_steps"]
    assert item["env_ids"] == [traj["env_id"]]
    assert item["policy_ids"] == [traj["policy_id"]]
    assert item["mean_return"] == ex.doc["metrics"]["mean_return"]
    assert item["drift_kinds"] == []
    assert datetime.fromisoformat(str(item["received_at"])).tzinfo is not None


def test_filters(http: httpx.Client, loaded: list[Example]) -> None:
    def ids(**params: Param) -> set[object]:
        return {i["run_id"] for i in _all_pages(http, limit=1000, **params)}

    def expected(pred: Callable[[Example], bool]) -> set[str]:
        return {ex.label["run_id"] for ex in loaded if pred(ex)}

    assert ids(trace_kind="summary") == expected(lambda e: e.label["trace_kind"] == "summary")
    assert ids(has_trajectories=False) == expected(lambda e: not e.doc["trajectories"])
    assert ids(has_trajectories=True) == expected(lambda e: bool(e.doc["trajectories"]))
    env = loaded[1].doc["trajectories"][0]["env_id"]
    assert ids(env_id=env) == expected(
        lambda e: any(t["env_id"] == env for t in e.doc["trajectories"])
    )
    policy = loaded[1].doc["trajectories"][0]["policy_id"]
    assert ids(policy_id=policy) == expected(
        lambda e: any(t["policy_id"] == policy for t in e.doc["trajectories"])
    )
    now = datetime.now(UTC)
    assert ids(since=(now - timedelta(hours=1)).isoformat()) == expected(lambda e: True)
    assert ids(until=(now - timedelta(hours=1)).isoformat()) == set()
    assert ids(since=(now + timedelta(hours=1)).isoformat()) == set()


@pytest.mark.parametrize(
    "params",
    [{"limit": 0}, {"limit": 1001}, {"cursor": "not-a-cursor"}, {"since": "yesterday"}],
)
def test_bad_parameters_are_422(http: httpx.Client, params: dict[str, Param]) -> None:
    response = http.get("/v1/rollouts", params=params)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
