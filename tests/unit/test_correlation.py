"""cid resolution (SPEC §4): order, URL forms, malformed URLs, conflicts."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import load_examples
from tracestore.correlation import cid_from_url, cid_in_text, resolve_correlation


@pytest.mark.parametrize(
    ("url", "cid"),
    [
        ("https://h/v1/chat/completions?cid=trace_abc", "trace_abc"),
        ("https://h/v1/chat/completions?model=q&cid=trace_abc&x=1", "trace_abc"),
        ("https://h/v1/chat?trace_correlation_id=trace_t", "trace_t"),
        ("https://h/v1/chat?trace=trace_p", "trace_p"),
        ("https://h?cid=trace_abc/v1/chat/completions", "trace_abc"),  # malformed, repaired
        ("https://h/v1/chat?cid=&trace=trace_p", "trace_p"),  # empty is not an id
        ("https://h/v1/chat?cid=%20%20", None),  # whitespace is not an id
        ("https://h/v1/chat", None),
        ("", None),
        (None, None),
        ("http://[::1?cid=smoke-1", "smoke-1"),  # urlsplit refuses the netloc
    ],
)
def test_cid_from_url(url: str | None, cid: str | None) -> None:
    assert cid_from_url(url) == cid


def _doc(**parts: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"run_id": "r", "trajectories": [], "metrics": {}}
    base.update(parts)
    return base


def test_resolution_order_and_sources() -> None:
    traj: dict[str, Any] = {
        "inference_url": "https://h?cid=c4",
        "trace_correlation_id": "c3",
        "steps": [],
    }
    doc = _doc(
        trace_correlation_id="c1",
        pipeline_metadata={"trace_correlation_id": "c2", "inference_url": "https://h?cid=c5"},
        trajectories=[traj],
    )
    assert (resolve_correlation(doc).correlation_id, resolve_correlation(doc).source) == (
        "c1",
        "top_level",
    )
    doc["trace_correlation_id"] = None
    assert resolve_correlation(doc).source == "pipeline_metadata"
    doc["pipeline_metadata"].pop("trace_correlation_id")
    assert resolve_correlation(doc).source == "trajectory"
    traj.pop("trace_correlation_id")
    res = resolve_correlation(doc)
    assert (res.correlation_id, res.source) == ("c4", "inference_url")
    traj["inference_url"] = ""
    assert resolve_correlation(doc).source == "pipeline_metadata_url"
    doc["pipeline_metadata"] = {}
    traj["steps"] = [{"info": {"meta": {"inference_url": "https://h?cid=c6"}}}]
    res = resolve_correlation(doc)
    assert (res.correlation_id, res.source) == ("c6", "step_inference_url")
    traj["steps"] = []
    assert resolve_correlation(doc).correlation_id is None


def test_trajectory_cids_and_conflict() -> None:
    doc = _doc(
        pipeline_metadata={"trace_correlation_id": "a"},
        trajectories=[
            {"trace_correlation_id": "a", "inference_url": "https://h?cid=a", "steps": []},
            {"inference_url": "https://h?cid=b", "steps": []},
            {"inference_url": None, "steps": []},
        ],
    )
    res = resolve_correlation(doc)
    assert res.trajectory_cids == [("a", "trajectory"), ("b", "inference_url"), (None, None)]
    assert res.conflict
    assert res.distinct_cids == ["a", "b"]


def test_same_cid_everywhere_is_no_conflict() -> None:
    doc = _doc(
        trace_correlation_id="a",
        trajectories=[{"trace_correlation_id": "a", "inference_url": "https://h?cid=a"}],
    )
    assert not resolve_correlation(doc).conflict


def test_examples_match_their_labels() -> None:
    checked = 0
    for ex in load_examples():
        if ex.label["kind"] in ("retry", "conflict"):
            continue
        res = resolve_correlation(ex.doc)
        assert (res.correlation_id, res.source) == (
            ex.label["correlation_id"],
            ex.label["correlation_source"],
        ), ex.label["run_id"]
        checked += 1
    assert checked == 60


def test_lookup_forms_read_an_sdk_logged_id_as_tracestore_stores_it() -> None:
    from tracestore.correlation import lookup_forms

    assert lookup_forms("trace_x") == ["trace_x"]
    assert lookup_forms("trace_x/v1/chat/completions") == [
        "trace_x/v1/chat/completions",
        "trace_x",
    ]
    # Nothing usable before the '/': only the id itself.
    assert lookup_forms("/v1/chat") == ["/v1/chat"]
    assert lookup_forms(" /x") == [" /x"]


@pytest.mark.parametrize(
    "text",
    [
        "https://h/v1/chat/completions?cid=trace_8e3b 200 OK",
        'INFO:     127.0.0.1:51234 - "POST /v1/chat/completions?cid=trace_8e3b HTTP/1.1" 200 OK',
        "{'inference_url': 'https://h/v1/chat/completions?cid=trace_8e3b', 'x': 1}",
        'HTTP Request: POST http://h:8000/v1/chat/completions?cid=trace_8e3b "HTTP/1.1 200 OK"',
        "  https://h/v1/chat/completions?cid=trace_8e3b  ",
        "https://h?cid=trace_8e3b/v1/chat/completions 200",  # the malformed form, in a line
    ],
)
def test_the_cid_in_a_log_line_stops_where_its_url_does(text: str) -> None:
    # A well-formed URL followed by more words gave 'trace_8e3b 200 OK' (the whole line was
    # read as one URL first); uvicorn's and httpx's access lines put words after it.
    assert cid_in_text(text) == "trace_8e3b"
