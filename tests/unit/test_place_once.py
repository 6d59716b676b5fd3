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
# several history items are candidates for one step item), some of them objects and lists
# (keys that cannot be hashed as they are), and a value that tells apart items with the
# same key.
step_ids = st.sampled_from(["s0", "s1", None, {"turn": 1, "agent": "a"}, [1, "x"]])
items = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries({"step_id": step_ids}),
        "time_record": st.fixed_dictionaries({"event_time": st.sampled_from([1.0, 2, None])}),
        "system_instance_id": st.sampled_from(["env", "policy"]),
    },
    optional={"body": json_values},
)


def respelled(value: Any) -> Any:
    """An equal copy written differently: objects' keys in reverse order, integers as
    floats (as another producer, or a read-back, may write the same value)."""
    if isinstance(value, dict):
        return {k: respelled(value[k]) for k in reversed(value)}
    if isinstance(value, list):
        return [respelled(v) for v in value]
    if type(value) is int and abs(value) < 2**53:
        return float(value)
    return value


@st.composite
def traces(draw: st.DrawFn) -> tuple[list[Any], list[list[Any]]]:
    """(history, per-step items): the history copies the steps' items (deep copies, as a
    parse gives), in order or not, some left out, others added."""
    per_step = draw(st.lists(st.lists(items, max_size=3), max_size=4))
    spell = respelled if draw(st.booleans()) else copy.deepcopy
    history = [spell(item) for step in per_step for item in step]
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


def test_equal_items_pair_whatever_the_order_of_the_history() -> None:
    # Step ids written as objects in another key order: equal items, whose keys the keyed
    # search once compared by repr (so they paired in one history order and not another).
    def event(order: int, reward: float) -> dict[str, Any]:
        step_id = {"turn": 1, "agent": "a"} if order else {"agent": "a", "turn": 1}
        return {"metadata": {"step_id": step_id}, "reward": reward}

    steps = [[event(1, 1.0), event(1, 2.0)]]
    for history in ([event(0, 1.0), event(0, 2.0)], [event(0, 2.0), event(0, 1.0)]):
        placed = place_once(history, steps)
        assert len(placed) == 2  # each step item paired with its copy
        assert [p.history_position for p in placed] == [history.index(p.item) for p in placed]
