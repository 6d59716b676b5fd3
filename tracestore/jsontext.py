"""JSON text helpers: serialization, repeated keys, exact values, the items of an array.

orjson parses nesting up to 1,024 levels but serializes only up to 254; a rollout with a
deeper (valid) value must not become a 500. Such values fall back to the standard library.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson

# The stdlib encoder recurses once per level; parsed documents can be 1,024 levels deep.
if sys.getrecursionlimit() < 4000:
    sys.setrecursionlimit(4000)


def dumps(value: Any, *, indent: bool = False) -> bytes:
    """JSON bytes of `value`, compact or indented by two spaces (orjson, or the stdlib for
    very deep values and integers past 64 bits, which orjson does not write)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else None)
    except orjson.JSONEncodeError:
        return json.dumps(
            value,
            ensure_ascii=False,
            indent=2 if indent else None,
            separators=(",", ": ") if indent else (",", ":"),
            allow_nan=False,
        ).encode()


_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    Decimal: "a number",
    type(None): "null",
}


def json_type(value: object) -> str:
    """What a parsed JSON value is, in JSON's words ("an array", "null"), for messages."""
    return _JSON_TYPES.get(type(value)) or (
        "an object" if isinstance(value, Mapping) else type(value).__name__
    )


def member(obj: object, key: str) -> Any:
    """`obj[key]` when `obj` is an object (a mapping), else None: reading parsed JSON that
    may hold anything where an object is expected."""
    # dict first, and None without the (several times slower) Mapping ABC check: prepare
    # reads thousands of members per rollout.
    if type(obj) is dict or (obj is not None and isinstance(obj, Mapping)):
        return obj.get(key)
    return None


# --- repeated keys --------------------------------------------------------------------------
#
# orjson keeps the last of repeated keys without a word, so the parsed value would differ
# from the bytes we store (a document whose run_id key appears twice would be filed under
# the last one while its bytes say the first). Counting colons finds repeats at C speed:
# every member of an object writes one colon outside strings, and re-serializing the
# parsed value keeps every string's colons but drops the members a repeat replaced. So
# the re-serialized text has fewer colons exactly when a key was repeated, unless the
# text spells a colon `\u003a` (re-serialized as `:`): then it is checked key by key.


def repeats_keys(text: bytes, value: Any) -> bool:
    """True when valid JSON `text`, parsed (by orjson) as `value`, repeats a key."""
    if not isinstance(value, dict | list):
        return False
    if b"\\u003" in text:  # perhaps an escaped colon: count no colons, look at the keys
        return first_repeated_key(text) is not None
    return text.count(b":") != dumps(value).count(b":")


class _Pairs(list[tuple[str, Any]]):
    """An object's members in written order, repeats kept (json's object_pairs_hook)."""


def first_repeated_key(text: bytes | str) -> tuple[tuple[str | int, ...], str] | None:
    """(path of the object, key) of the first repeated key in valid JSON `text`, or None."""
    # Numbers stay text: only keys matter here (and int() refuses over 4,300 digits).
    parsed = json.loads(text, object_pairs_hook=_Pairs, parse_int=str, parse_float=str)
    # Each stacked node carries a link (its parent's link, its key), not its path: a path
    # per value, as long as the value is deep, took ~1,400 bytes per byte of a deep body.
    # The path is spelled out only for the repeat.
    stack: list[tuple[_Link, Any]] = [(None, parsed)]
    while stack:
        link, node = stack.pop()
        if isinstance(node, _Pairs):
            seen: set[str] = set()
            for key, _ in node:
                if key in seen:
                    return _path(link), key
                seen.add(key)
            # Only objects and arrays (both lists here) can hold a key; empty ones none.
            stack.extend(((link, k), v) for k, v in reversed(node) if isinstance(v, list) and v)
        elif isinstance(node, list):
            stack.extend(
                ((link, i), v)
                for i, v in reversed(list(enumerate(node)))
                if isinstance(v, list) and v
            )
    return None


# A stacked node's place: None at the top, else (its parent's link, its key or index).
_Link = tuple[Any, str | int] | None


def _path(link: _Link) -> tuple[str | int, ...]:
    parts: list[str | int] = []
    while link is not None:
        link, part = link
        parts.append(part)
    return tuple(reversed(parts))


# --- exact values ---------------------------------------------------------------------------


class ExactNumber:
    """A JSON number as its exact decimal value (a float would round 30-digit integers and
    1e-400), equal only to another number: `1` and `1.0` match, `true` and `1` do not."""

    __slots__ = ("value",)

    def __init__(self, text: str) -> None:
        self.value = Decimal(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExactNumber) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"ExactNumber({str(self.value)!r})"


def loads_exact(text: bytes | str) -> Any:
    """Parse valid JSON with every number exact (ExactNumber), for comparing documents."""
    return json.loads(text, parse_int=ExactNumber, parse_float=ExactNumber)


# --- integers whole ---------------------------------------------------------------------------


class RoundedFloat(float):
    """A JSON number no double holds (`1e-400`, 30 significant digits), read as the nearest
    double; `text` is the number as written, so whoever writes the value can say so."""

    __slots__ = ("text",)

    text: str


def _fraction(text: str) -> float:
    value = float(text)
    # Written back as its shortest repr: is that still the number as written?
    if repr(value) == text or Decimal(repr(value)) == Decimal(text):
        return value
    rounded = RoundedFloat(value)
    rounded.text = text
    return rounded


def loads_whole(raw: bytes | str) -> Any:
    """Parse valid JSON (as `parse_json` accepted it) with every integer whole (orjson reads
    one past 64 bits as a float) and every fraction a double cannot hold as a RoundedFloat
    (orjson reads 1e-400 as 0.0 without a word). The standard library's parser, several
    times slower than orjson: for text `may_hold_inexact_numbers` says it may change."""
    return json.loads(raw, parse_float=_fraction)


# --- a member's own text ---------------------------------------------------------------------

# What orjson may not read back exactly: 18 significant digits or more (an integer past 64
# bits is read as a float; a double holds 17), an exponent of three digits (past a double's
# range: 1e-400 reads as 0.0). Looked for in a copy where digits and `.` are `0`, `e`/`E`
# are `e`, signs are `+` and anything else a space, with C-speed finds (a pattern over the
# text itself cost twice its parse); each candidate is then checked to be such a number
# token, not digits inside a string (ids, hashes).
_NUMBERISH = bytes(
    48 if 48 <= b <= 57 or b == 46 else 101 if b in b"eE" else 43 if b in b"+-" else 32
    for b in range(256)
)
_CANDIDATES = (b"0" * 18, b"e000", b"e+000")
_NUMBER_CHARS = frozenset(b"0123456789.eE+-")
_BEFORE_A_NUMBER = frozenset(b":,[ \t\n\r")
_NUMBER = re.compile(rb"-?(\d+)(?:\.(\d+))?(?:[eE][+-]?(\d+))?")
# A string literal (kept as it is), or whitespace outside one (dropped).
_STRING_OR_SPACE = re.compile(r'("(?:[^"\\]|\\.)*")|[ \t\n\r]+')


def may_hold_inexact_numbers(raw: bytes) -> bool:
    """Whether parsing `raw` with orjson may change a number (see _NUMBERISH): cheap, and
    conservative (18 significant digits a double happens to hold count too)."""
    shape = raw.translate(_NUMBERISH)
    for candidate in _CANDIDATES:
        found = shape.find(candidate)
        while found >= 0:
            at = end = found
            while at > 0 and raw[at - 1] in _NUMBER_CHARS:
                at -= 1
            while end < len(raw) and raw[end] in _NUMBER_CHARS:
                end += 1
            # Not after a delimiter: digits inside a string.
            if (at == 0 or raw[at - 1] in _BEFORE_A_NUMBER) and _inexact(raw[at:end]):
                return True
            found = shape.find(candidate, end)
    return False


def _inexact(token: bytes) -> bool:
    number = _NUMBER.fullmatch(token)
    if number is None:
        return False  # not a number token after all
    whole, fraction, exponent = number.groups()
    if exponent is not None and len(exponent.lstrip(b"0")) >= 3:
        return True
    if fraction is None and exponent is None:
        return len(whole.lstrip(b"0")) >= 20  # orjson reads 64-bit integers exactly
    return len((whole + (fraction or b"")).strip(b"0")) >= 18


def member_text(raw: bytes, path: tuple[str, ...]) -> bytes | None:
    """The compact JSON text of the member at `path` of the JSON object `raw`, with every
    number exactly as written (strings as written too); None when absent. For serving a
    stored part of a document whose numbers orjson would change (1e-400 read as 0.0)."""
    text = raw.decode("utf-8")
    start, end = 0, len(text)
    for key in path:
        found = _member_span(text, start, key)
        if found is None:
            return None
        start, end = found
    return _STRING_OR_SPACE.sub(lambda m: m.group(1) or "", text[start:end]).encode("utf-8")


def _member_span(text: str, at: int, key: str) -> tuple[int, int] | None:
    """Where the value of `key` in the object starting at `at` (after whitespace) lies."""
    at = _skip(text, at)
    if text[at : at + 1] != "{":
        return None
    at = _skip(text, at + 1)
    while text[at : at + 1] == '"':
        name, at = _DECODER.raw_decode(text, at)
        at = _skip(text, at)
        if text[at : at + 1] != ":":
            return None
        value_at = _skip(text, at + 1)
        _, end = _DECODER.raw_decode(text, value_at)
        if name == key:
            return value_at, end
        at = _skip(text, end)
        if text[at : at + 1] != ",":
            return None
        at = _skip(text, at + 1)
    return None


# --- the items of an array ------------------------------------------------------------------

_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, at: int) -> int:
    """The first position at or after `at` that is not JSON whitespace."""
    return _WHITESPACE.match(text, at).end()  # type: ignore[union-attr]  # `*` always matches


# Integers stay text: int() refuses more than 4,300 digits, which orjson reads.
_DECODER = json.JSONDecoder(parse_int=str)


class TooManyItems(Exception):
    """An array holds more elements than the caller takes (not a ValueError: the JSON may
    well be valid)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the array holds more than {limit} elements")
        self.limit = limit


def split_array(raw: bytes, *, max_items: int | None = None) -> list[bytes] | None:
    """The bytes of each element of a JSON array, exactly as written; None if `raw` is not
    an array. ValueError when the array is not valid JSON (its elements are checked only
    as far as finding where each ends: each is parsed properly on its own afterwards).
    TooManyItems as soon as an element past `max_items` is found, before it is sliced out.
    """
    text = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError

    at = _skip(text, 0)
    if text[at : at + 1] != "[":
        return None
    items: list[bytes] = []
    at = _skip(text, at + 1)
    if text[at : at + 1] != "]":
        while True:
            try:
                _, end = _DECODER.raw_decode(text, at)
            except RecursionError:
                raise ValueError(f"nesting too deep in the element at character {at}") from None
            if max_items is not None and len(items) >= max_items:
                # Millions of tiny elements (`{},{},...`) would cost ~40 bytes each as
                # slices: refuse before holding more than the caller takes.
                raise TooManyItems(max_items)
            # Strictly decoded text re-encodes to the very bytes it came from.
            items.append(text[at:end].encode("utf-8"))
            at = _skip(text, end)
            sep = text[at : at + 1]
            if sep == "]":
                break
            if sep != ",":
                raise ValueError(f"expected ',' or ']' at character {at}")
            at = _skip(text, at + 1)
    if _skip(text, at + 1) != len(text):
        raise ValueError(f"extra data after the array at character {_skip(text, at + 1)}")
    return items
