"""Each event and message placed once: the in-order reading gives the keyed search's answer.

`place_once` first tries the history as synth-ai's tracer writes it (the steps' items
first, in their order) and falls back to the keyed search (`_place_by_key`) when it is
not so. Both must place every item exactly as the keyed search alone would.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import json_values
from tracestore.wire.trace import _place_by_key, _place_in_order, place_once

# Items shaped like events and messages: the keyed search's key fields, often shared (so
# several history items are candidates for one step item), and a value that tells apart
# items with the same key.
items = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries({"step_id": st.sampled_from(["s0", "s1", None])}),
        "time_record": st.fixed_dictionaries({"event_time": st.sampled_from([1.0, 2, None])}),
        "system_instance_id": st.sampled_from(["env", "policy"]),
    },
    optional={"body": json_values},
)


@st.composite
def traces(draw: st.DrawFn) -> tuple[list[Any], list[list[Any]]]:
    """(history, per-step items): the history copies the steps' items (deep copies, as a
    parse gives), in order or not, some left out, others added."""
    per_step = draw(st.lists(st.lists(items, max_size=3), max_size=4))
    history = [copy.deepcopy(item) for step in per_step for item in step]
    shape = draw(st.sampled_from(["in order", "shuffled", "some left out", "extras"]))
    if shape == "shuffled":
        history = draw(st.permutations(history))
    elif shape == "some left out" and history:
        del history[draw(st.integers(0, len(history) - 1))]
    elif shape == "extras":
        history += draw(st.lists(items, max_size=3))
    return history, per_step


@given(traces())
def test_the_in_order_reading_places_as_the_keyed_search(
    trace: tuple[list[Any], list[list[Any]]],
) -> None:
    history, per_step = trace
    assert place_once(history, per_step) == _place_by_key(history, per_step)


def test_the_tracers_shape_is_read_in_order_and_any_other_by_key() -> None:
    steps = [[{"metadata": {"step_id": "a"}}, {"metadata": {"step_id": "b"}}]]
    in_order = [copy.deepcopy(item) for item in steps[0]] + [{"extra": 1}]
    placed = _place_in_order(in_order, steps)
    assert placed is not None
    assert [(p.step_position, p.position_in_step, p.history_position) for p in placed] == [
        (0, 0, 0),
        (0, 1, 1),
        (None, None, 2),
    ]
    assert _place_in_order(list(reversed(in_order)), steps) is None
    assert _place_in_order(in_order[:1], steps) is None  # a step item missing from history
