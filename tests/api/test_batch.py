"""POST /v1/rollouts/batch: JSON arrays and NDJSON, each rollout standing alone."""

from __future__ import annotations

import gzip
from typing import Any

import httpx
import orjson
from sqlalchemy import Engine

from tests.conftest import Example, row_counts


def test_ndjson_batch_of_all_examples(http: httpx.Client, examples: list[Example]) -> None:
    body = b"\n".join(ex.raw for ex in examples) + b"\n"
    response = http.post(
        "/v1/rollouts/batch", content=body, headers={"Content-Type": "application/x-ndjson"}
    )
    assert response.status_code == 207
    result = response.json()
    statuses = [r["status"] for r in result["results"]]
    assert statuses == [ex.label["expect_status"] for ex in examples]
    assert [r["index"] for r in result["results"]] == list(range(len(examples)))
    expected_http = {"created": 201, "duplicate": 200, "conflict": 409}
    assert [r["http_status"] for r in result["results"]] == [expected_http[s] for s in statuses]
    summary = result["summary"]
    assert summary == {
        "total": len(examples),
        "created": statuses.count("created"),
        "duplicate": statuses.count("duplicate"),
        "conflict": statuses.count("conflict"),
        "invalid": 0,
    }


def test_json_array_with_bad_items_stands_alone(
    http: httpx.Client, engine: Engine, examples: list[Example]
) -> None:
    good = examples[0].doc
    items: list[Any] = [good, {"run_id": ""}, 42, good]
    response = http.post("/v1/rollouts/batch", content=orjson.dumps(items))
    assert response.status_code == 207
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["created", "invalid", "invalid", "duplicate"]
    assert [r["http_status"] for r in results] == [201, 422, 422, 200]
    assert results[1]["error"]["code"] == "invalid_rollout"
    assert row_counts(engine)["runs"] == 1
    assert orjson.loads(http.get(f"/v1/rollouts/{good['run_id']}").content) == good


def test_ndjson_with_a_broken_line(http: httpx.Client, examples: list[Example]) -> None:
    body = examples[0].raw + b"\n{not json\n" + examples[2].raw
    response = http.post(
        "/v1/rollouts/batch",
        content=gzip.compress(body),
        headers={"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"},
    )
    assert response.status_code == 207
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["created", "invalid", "created"]
    assert results[1]["error"]["code"] == "invalid_json"
    assert results[1]["http_status"] == 400


def test_batch_that_is_not_an_array(http: httpx.Client, engine: Engine) -> None:
    response = http.post("/v1/rollouts/batch", content=b'{"run_id": "x"}')
    assert response.status_code == 422
    assert "array" in response.json()["error"]["message"]
    assert http.post("/v1/rollouts/batch", content=b"[").status_code == 400
    assert set(row_counts(engine).values()) == {0}
