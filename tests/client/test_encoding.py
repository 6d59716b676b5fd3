"""What the client sends for a rollout: NaN and Infinity refused with where they are."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import uuid
from typing import Any

import orjson
import pytest

from tests.conftest import load_examples, minimal_rollout
from tracestore.client import NonFiniteNumberError, encode_rollout


def _with(path: list[str | int], value: float) -> dict[str, Any]:
    doc = minimal_rollout("nan-run")
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "where", "token"),
    [
        (
            ["trajectories", 0, "steps", 0, "reward"],
            math.nan,
            "$.trajectories[0].steps[0].reward",
            "NaN",
        ),
        (["metrics", "mean_return"], math.inf, "$.metrics.mean_return", "Infinity"),
        (["metrics", "episode_returns", 0], -math.inf, "$.metrics.episode_returns[0]", "-Infinity"),
        (["trajectories", 0, "steps", 0, "obs"], math.nan, "$.trajectories[0].steps[0].obs", "NaN"),
        (["metrics", "odd key"], math.nan, '$.metrics["odd key"]', "NaN"),
    ],
)
def test_a_non_finite_number_anywhere_is_refused_with_its_path(
    path: list[str | int], value: float, where: str, token: str
) -> None:
    doc = _with(path, value)
    with pytest.raises(NonFiniteNumberError) as refused:
        encode_rollout(doc)
    error = refused.value
    assert isinstance(error, ValueError)  # callers catching ValueError catch it too
    assert (error.path, error.value, error.run_id, error.index) == (where, token, "nan-run", None)
    assert f"{token} at {where}" in str(error)
    assert "'nan-run'" in str(error)
    assert "nothing was sent" in str(error)


def test_the_first_non_finite_number_in_document_order_is_named() -> None:
    doc = minimal_rollout("order")
    doc["metrics"]["mean_return"] = math.inf
    doc["trajectories"][0]["steps"][0]["reward"] = math.nan
    with pytest.raises(NonFiniteNumberError) as refused:
        encode_rollout(doc)
    assert refused.value.path == "$.trajectories[0].steps[0].reward"


def test_bytes_are_checked_too_and_otherwise_sent_as_given() -> None:
    raw = b'{"run_id": "raw-nan", "metrics": {"mean_return": NaN}}'
    with pytest.raises(NonFiniteNumberError) as refused:
        encode_rollout(raw, index=3)
    assert (refused.value.path, refused.value.index) == ("$.metrics.mean_return", 3)
    assert "(item 3 of the batch)" in str(refused.value)
    # The tokens inside strings are text, not numbers: these bytes go out untouched.
    fine = b'{"run_id": "NaN-Infinity",  "note": "NaN or Infinity"}'
    assert encode_rollout(fine) is fine
    # Not JSON at all: sent as given, for the server to refuse (400 invalid_json).
    assert encode_rollout(b"{NaN") == b"{NaN"


def test_a_finite_document_encodes_to_the_same_json_value() -> None:
    for example in load_examples():
        assert json.loads(encode_rollout(example.doc)) == example.doc, example.line


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Step:
    reward: float
    at: datetime.datetime


def test_types_the_previous_encoder_wrote_are_written_the_same_way() -> None:
    # orjson (the client's encoder before) wrote these natively; a task app passing them
    # must see the same JSON now.
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=datetime.UTC)
    doc = {
        "run_id": "typed",
        "when": when,
        "naive": datetime.datetime(2026, 1, 2, 3, 4, 5),
        "day": datetime.date(2026, 1, 2),
        "id": uuid.UUID(int=7),
        "colour": Colour.RED,
        "step": Step(0.5, datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)),
        "text": "ünïcödé ✓",
    }
    assert json.loads(encode_rollout(doc)) == orjson.loads(orjson.dumps(doc))
    with pytest.raises(NonFiniteNumberError) as refused:
        encode_rollout({"run_id": "typed", "step": Step(math.nan, when)})
    assert refused.value.path == "$.step.reward"


def test_other_encoding_failures_keep_their_own_error() -> None:
    with pytest.raises(TypeError):
        encode_rollout({"run_id": "x", "value": object()})
    looped: dict[str, Any] = {"run_id": "loop"}
    looped["self"] = looped
    with pytest.raises(ValueError, match="Circular") as refused:
        encode_rollout(looped)
    assert not isinstance(refused.value, NonFiniteNumberError)
