"""JSON text helpers: repeated keys found exactly, array items sliced as written, exact values."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracestore.jsontext import (
    first_repeated_key,
    loads_exact,
    may_hold_inexact_numbers,
    member_text,
    repeats_keys,
    split_array,
)

# Keys short and few, so that repeats happen; characters that trip naive scanners.
key_text = st.text(st.sampled_from(["a", "b", ":", '"', "\\", " ", "é", "\x00", "/"]), max_size=3)
spaces = st.sampled_from(["", " ", "\n", "\t ", "\r\n"])


class Obj(list[tuple[str, Any]]):
    """An object as written: its members in order, repeats allowed."""


leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | key_text
)
trees = st.recursive(
    leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.lists(st.tuples(key_text, inner), max_size=3).map(Obj)
    ),
    max_leaves=10,
)


def _string(text: str, draw: st.DrawFn) -> str:
    out = []
    for ch in text:
        style = draw(st.integers(0, 2))
        if ch in '"\\' or ch < " ":
            out.append(json.dumps(ch)[1:-1] if style else f"\\u{ord(ch):04x}")
        elif style == 0:
            out.append(f"\\u{ord(ch):04X}")  # any character may be escaped, ':' included
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _write(value: Any, draw: st.DrawFn) -> str:
    sp = draw(spaces)
    if isinstance(value, Obj):
        members = [
            f"{sp}{_string(k, draw)}{draw(spaces)}:{draw(spaces)}{_write(v, draw)}"
            for k, v in value
        ]
        return "{" + ",".join(members) + sp + "}"
    if isinstance(value, list):
        return "[" + ",".join(sp + _write(v, draw) for v in value) + sp + "]"
    if isinstance(value, str):
        return _string(value, draw)
    return json.dumps(value)


def _repeats(value: Any) -> bool:
    if isinstance(value, Obj):
        keys = [k for k, _ in value]
        return len(keys) != len(set(keys)) or any(_repeats(v) for _, v in value)
    if isinstance(value, list):
        return any(_repeats(v) for v in value)
    return False


@st.composite
def written(draw: st.DrawFn) -> tuple[Any, bytes]:
    value = draw(trees)
    return value, _write(value, draw).encode()


@settings(max_examples=400, deadline=None)
@given(case=written())
def test_repeated_keys_are_found_exactly(case: tuple[Any, bytes]) -> None:
    value, text = case
    parsed = orjson.loads(text)
    assert repeats_keys(text, parsed) == _repeats(value)
    assert (first_repeated_key(text) is not None) == _repeats(value)


def test_the_first_repeated_key_and_where() -> None:
    assert first_repeated_key(b'{"a":{"b":[0,{"c":1,"c":2}]},"a":1}') == ((), "a")
    assert first_repeated_key(b'{"x":{"b":[0,{"c":1,"c":2}]}}') == (("x", "b", 1), "c")
    assert first_repeated_key(b'{"\\u003a":1,":":2}') == ((), ":")
    assert first_repeated_key(b'[{"a":1},{"a":1}]') is None


@settings(max_examples=200, deadline=None)
@given(items=st.lists(written(), min_size=1, max_size=4), sep=spaces, end=spaces)
def test_array_items_come_back_as_written(
    items: list[tuple[Any, bytes]], sep: str, end: str
) -> None:
    texts = [text for _, text in items]
    body = sep + "[" + sep + (sep + "," + sep).join(t.decode() for t in texts) + "]" + end
    assert split_array(body.encode()) == texts


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (b"[]", []),
        (b" [ ] ", []),
        (b"{}", None),
        (b"42", None),
        (b"", None),
        (b'[1,"]",{"a":"[,]"}]', [b"1", b'"]"', b'{"a":"[,]"}']),
        (b"[" + b"9" * 5000 + b"]", [b"9" * 5000]),  # past int()'s digit limit
    ],
)
def test_split_array_edges(body: bytes, want: list[bytes] | None) -> None:
    assert split_array(body) == want


@pytest.mark.parametrize(
    "body", [b"[1,]", b"[,1]", b"[1 2]", b"[1]]", b"[1", b"[\xff]", b"[" * 5000 + b"]" * 5000]
)
def test_split_array_refuses_what_is_not_an_array(body: bytes) -> None:
    with pytest.raises(ValueError, match=r"."):  # any reason: the caller says invalid_json
        split_array(body)


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (b"123456789012345678901234567891", b"123456789012345678901234567892", False),
        (b"1e-400", b"0", False),
        (b"true", b"1", False),
        (b"false", b"0", False),
        (b"1", b"1.0", True),
        (b"1E2", b"100", True),
        (b'{"a":[1,{"b":2.50}]}', b'{"a":[1.0,{"b":2.5}]}', True),
        (b'"1"', b"1", False),
    ],
)
def test_exact_values(a: bytes, b: bytes, equal: bool) -> None:
    assert (loads_exact(a) == loads_exact(b)) is equal


def test_a_member_s_text_keeps_every_number_and_string_as_written() -> None:
    raw = (
        b'{ "a" : 1, "s": "x \\" }  {", "t" : { "n" : [ 123456789012345678901234567 , 1e-400 ,'
        b' -0.0, 1E+400 ] , "u": "a  b\\\\" } , "z": null }'
    )
    assert member_text(raw, ("t",)) == (
        b'{"n":[123456789012345678901234567,1e-400,-0.0,1E+400],"u":"a  b\\\\"}'
    )
    assert member_text(raw, ("t", "n")) == b"[123456789012345678901234567,1e-400,-0.0,1E+400]"
    assert member_text(raw, ("s",)) == b'"x \\" }  {"'
    assert member_text(raw, ("t", "missing")) is None
    assert member_text(raw, ("a", "deeper")) is None  # not an object
    assert may_hold_inexact_numbers(raw)
    assert not may_hold_inexact_numbers(b'{"a": 1.5, "b": 12345678901234567, "c": 1e-30}')


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.sampled_from(['"', "\\", " ", "\n", "é", "a", "{", "}", ":", ","]), max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.text(st.sampled_from(["a", "b", '"', " "]), max_size=2), inner, max_size=3
        )
    ),
    max_leaves=12,
)


@given(
    st.dictionaries(st.text(st.sampled_from(["k", "l", '"']), max_size=2), json_values, min_size=1),
    st.sampled_from([None, 0, 2]),
)
def test_a_member_s_text_is_the_member(obj: dict[str, object], indent: int | None) -> None:
    raw = json.dumps(obj, indent=indent, ensure_ascii=False).encode()
    for key, value in obj.items():
        text = member_text(raw, (key,))
        assert text is not None
        assert json.loads(text) == value
        assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize(
    ("raw", "inexact"),
    [
        (b'{"a":12345678901234567890123}', True),  # past 64 bits
        (b'{"a":18446744073709551615}', True),  # 20 digits: counted, though orjson holds it
        (b'{"a":123456789012345678}', False),  # 64 bits: orjson reads it exactly
        (b'{"a": 1e-400}', True),
        (b'{"a":\n -1E+400}', True),
        (b'{"a":1e-0400}', True),
        (b"[1.5, 1234567890.123456789]", True),  # 19 significant digits across the point
        (b'{"a":0.1000000000000000055511151231257827}', True),
        (b'{"a":0.30000000000000004}', False),  # 17 significant digits: a double's own
        (b'{"a":1.000000000000000000}', False),  # trailing zeros are no digits of its value
        (b'{"h":"ab1e857", "id":"123456789012345678901"}', False),  # inside strings
        (b"12345678901234567890123", True),
    ],
)
def test_numbers_orjson_may_change_are_found(raw: bytes, inexact: bool) -> None:
    assert may_hold_inexact_numbers(raw) is inexact
