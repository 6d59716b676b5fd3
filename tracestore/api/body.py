"""Request bodies: size limit enforced while streaming, gzip decoded with a bound, and the
items of a batch counted before they are held.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.types import Message

from tracestore.api.headers import first_headers
from tracestore.errors import InvalidJSON, PayloadTooLarge, UnsupportedMediaType
from tracestore.ingest.parse import split_batch_array
from tracestore.jsontext import TooManyItems, split_array


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body exceeds the limit of {limit} bytes (after decompression)", limit=limit
    )


_CONTENT_TYPE = frozenset((b"content-type",))


def media_type(request: Request) -> str:
    """The request's Content-Type without parameters, lower-cased ('' when absent)."""
    value = first_headers(request.scope, _CONTENT_TYPE).get(b"content-type", b"")
    return value.decode("latin-1").split(";", 1)[0].strip().lower()


JSON_TYPES = ("", "application/json", "text/json")
NDJSON_TYPES = (
    "application/x-ndjson",
    "application/ndjson",
    "application/jsonl",
    "application/jsonlines",
    "application/x-jsonlines",
)


def is_json(mt: str) -> bool:
    """True for JSON media types (and for none: clients that send no Content-Type)."""
    return mt in JSON_TYPES or (mt.startswith("application/") and mt.endswith("+json"))


def require_json(request: Request, hint: str = "") -> None:
    """Refuse (415) a body whose Content-Type is not JSON."""
    mt = media_type(request)
    if not is_json(mt):
        raise UnsupportedMediaType(f"Content-Type {mt!r} is not JSON; send application/json{hint}")


# Decoded bytes handed on at a time.
_STEP = 64 * 1024

# --- the parsed-size estimate ---------------------------------------------------------------
#
# What a body costs a worker at the peak of its ingest, counted at C speed as it streams in,
# so that a body cheap on the wire but huge once parsed (a gzip of millions of `{}` inside
# one rollout took a worker to 2 GB) is refused before anything is parsed. Measured on
# CPython 3.11 (64-bit, pymalloc rounding to 16 bytes) with orjson 3.13, which parses into
# a yyjson document (a copy of the text and 16 bytes per value) and then builds the Python
# objects from it: both are alive at the end of the parse. Then, with the parsed value and
# the body still held, the store compresses the body and hands it to the driver: ~5 copies
# of the compressed body on PostgreSQL (COPY's text form writes bytea as hex, and the
# driver and libpq each buffer it), 2-3 on SQLite; random printable text compresses only
# to 0.82 of its size. The peak is whichever is larger: for a server measured with
# bench/hostile_memory.py, up to 7.2 bytes a byte of random text on PostgreSQL. Each figure
# is an upper bound of what it stands for (the shapes that come closest are measured by
# bench/hostile_memory.py and tests/reliability/test_request_limits.py):
#
# - every byte: 8 (the body held by the route; a string's character; then yyjson's copy,
#   or the compressed body's stored copies); whitespace 4 (never a character but a
#   string's spaces, and random whitespace compresses to a quarter at most);
# - `"`: 32 (a string is 64 bytes + its characters: a 16-byte-rounded 49-byte header; a key
#   too, since orjson's key cache keeps at most 2,048 and any hostile body can make every
#   key new; an escaped quote counts too);
# - `,`: 24 (the next value's 16 bytes in the document, its 8-byte slot in a list);
# - `:`: 60 (the member's value in the document, 16, and its share of the dict's key
#   table: at most 44 bytes a member once the table has outgrown its first 128 bytes);
# - `{`: 180 (16 in the document, the dict's 64, its first key's 16 in the document, and
#   the first key table, 128 bytes, less the 44 its first member already paid);
# - `[`: 120 (16 in the document, the list's 64, its item array rounded up, 16, its first
#   slot, 8, and its first value in the document, 16);
# - a number (a digit or `-` after `,`, `:` or `[`, whitespace aside): 32, an int or float
#   object (small ints are shared, bools and null too: never more);
# - strings wider than ASCII, for every byte of the body since one character widens a whole
#   string and the estimate cannot tell which bytes are in it: any non-ASCII byte or `\u`
#   escape +1 (the UTF-8 copy CPython keeps once the string is serialized again); a
#   character past U+00FF +2 in all (two bytes a character), past U+FFFF +4 (four); each
#   counted from the body's first byte once seen.
#
# A real rollout (bench/corpus.py) is estimated at ~18 bytes a byte against the ~7 it
# takes: its keys repeat (orjson shares them), its text compresses well and holds commas
# and colons. Empty objects, 3 bytes each: estimated 76 a byte for the 31 they take; an
# incompressible string (ASCII or wide) comes closest, at ~0.9 of its estimate.
_PER_BYTE = 8
_PER_SPACE = 4
_PER_CHAR = ((b'"', 32), (b",", 24), (b":", 60), (b"{", 180), (b"[", 120))
_NUMBER = 32
# Digits and `-` become `0`, the separators a value follows become `,`; whitespace goes:
# then `,0` marks the start of every number outside strings (and some inside).
_VALUE_CLASSES = bytes.maketrans(b"0123456789-,:[", b"00000000000,,,")
_JSON_SPACE = b" \t\n\r"
_BELOW = {n: bytes(range(n)) for n in (0xC4, 0xF0)}
_LATIN1, _UCS2, _UCS4 = 1, 2, 5  # extra bytes per body byte, as above
_ESCAPE = b"\\u"
_ESCAPE_UCS2 = re.compile(rb"\\u(?!00)")  # a character past U+00FF
_ESCAPE_UCS4 = re.compile(rb"\\u[dD][89abAB]")  # half of a surrogate pair: past U+FFFF
# No byte can be charged more than this (a `{`, or a number's first digit, in the widest
# strings): a body of fewer than max_parsed_bytes / this many bytes cannot pass the limit.
MAX_PER_BYTE = _PER_BYTE + max(cost for _, cost in _PER_CHAR) + _NUMBER + _UCS4


class ParsedSize:
    """The estimated peak memory of a body's ingest (above), fed its bytes as they arrive."""

    def __init__(self) -> None:
        self.total = 0
        self._seen = 0  # bytes fed so far
        self._width = 0  # extra bytes per byte for strings wider than ASCII
        self._last = b""  # the last value class of the bytes so far (a number may follow)
        self._tail = b""  # their last 6 bytes (an escape may go on)

    def feed(self, data: bytes) -> int:
        """Count `data`, the next bytes of the body; the estimate so far."""
        spaceless = data.translate(_VALUE_CLASSES, _JSON_SPACE)
        cost = len(data) * _PER_BYTE - (len(data) - len(spaceless)) * (_PER_BYTE - _PER_SPACE)
        for char, char_cost in _PER_CHAR:
            cost += data.count(char) * char_cost
        classes = self._last + spaceless
        cost += classes.count(b",0") * _NUMBER
        self._last = classes[-1:]
        self._seen += len(data)
        width = self._width_of(data)
        if width > self._width:  # every string seen so far may be that wide too
            cost += (width - self._width) * (self._seen - len(data))
            self._width = width
        cost += self._width * len(data)
        self.total += cost
        return self.total

    def _width_of(self, data: bytes) -> int:
        if self._width == _UCS4:
            return _UCS4
        width = 0
        if not data.isascii():
            width = _LATIN1
            if wide := data.translate(None, _BELOW[0xC4]):
                width = _UCS4 if wide.translate(None, _BELOW[0xF0]) else _UCS2
        # An escape may begin in the bytes before: look at their end and this start too.
        seam = self._tail + data[:6]
        self._tail = (self._tail + data[-6:])[-6:]
        for text in (data, seam):
            if _ESCAPE in text:
                width = max(width, _LATIN1)
                if _ESCAPE_UCS4.search(text):
                    return _UCS4
                if _ESCAPE_UCS2.search(text):
                    width = max(width, _UCS2)
        return width


def parsed_estimate(data: bytes) -> int:
    """The estimated peak memory of ingesting `data` (an upper bound; see ParsedSize)."""
    return ParsedSize().feed(data)


def whole_body_cost(body: bytes, max_parsed: int | None) -> int:
    """What ingesting `body`, arrived whole, may cost at its peak: its upper bound, or its
    estimate when the bound is past `max_parsed`; 413 when the estimate is too."""
    cost = len(body) * MAX_PER_BYTE
    if max_parsed is not None and cost > max_parsed:
        cost = parsed_estimate(body)
        if cost > max_parsed:
            raise _too_large_parsed(max_parsed)
    return cost


def _max_parsed(request: Request) -> int | None:
    state = getattr(request.app.state, "tracestore", None)
    return None if state is None else int(state.settings.max_parsed_bytes)


def _too_large_parsed(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body would take more than {limit} bytes of memory once parsed "
        "(estimated from its objects, arrays, strings and numbers as it arrived); send "
        "fewer, larger values or split it",
        limit=limit,
    )


class Charge:
    """What ingesting a body may cost at its peak, known once the body has been read: the
    estimate when it was counted, else its upper bound (size x MAX_PER_BYTE)."""

    def __init__(self) -> None:
        self.bytes = 0


_BODY_HEAD = frozenset((b"content-encoding", b"content-length"))


def _encoding(request: Request, limit: int) -> str:
    """The body's Content-Encoding, once the head says the body may be read: 415 for an
    encoding other than gzip, 413 for a declared length past `limit`."""
    head = first_headers(request.scope, _BODY_HEAD)
    raw = head.get(b"content-encoding")
    text = "" if raw is None else raw.decode("latin-1")
    # A list of codings in the order applied (RFC 9110); identity is no coding at all, so
    # `identity, gzip` is gzip. One gzip is what is read.
    codings = [c for c in (part.strip().lower() for part in text.split(",")) if c]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        encoding = "identity"
    elif len(codings) == 1 and codings[0] in ("gzip", "x-gzip"):
        encoding = codings[0]
    else:
        raise UnsupportedMediaType(
            f"Content-Encoding {text.strip()!r} is not supported (use gzip or none)"
        )
    declared = head.get(b"content-length", b"")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    return encoding


async def _received(request: Request, first: Message | None) -> AsyncIterator[bytes]:
    """The body's pieces as the server hands them on (`first`: one already received)."""
    message = first if first is not None else await request.receive()
    while True:
        if message["type"] == "http.request":
            body: bytes = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                return
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()
        message = await request.receive()


async def _decoded(
    request: Request,
    limit: int,
    charge: Charge | None = None,
    *,
    encoding: str | None = None,
    first: Message | None = None,
) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive, gunzipped when `Content-Encoding: gzip`; 413 past
    `limit` decoded bytes or the parsed-size limit, 400 for a corrupt or truncated gzip.
    `charge`, when given, is set to the body's charge once it has all arrived."""
    encoding = _encoding(request, limit) if encoding is None else encoding
    max_parsed = _max_parsed(request)
    parsed = ParsedSize()
    # Counting costs a worker 10-25% of its CPU on 108 KB rollouts, and no body smaller
    # than max_parsed / MAX_PER_BYTE (~1.8 MiB by default) can pass the limit: bytes are
    # counted only once the body is past that, from its first byte.
    uncounted: list[bytes] | None = [] if max_parsed is not None else None
    size = 0
    async for chunk in _gunzipped(_received(request, first), limit, encoding):
        if max_parsed is not None:
            size += len(chunk)
            if uncounted is not None and size * MAX_PER_BYTE <= max_parsed:
                uncounted.append(chunk)
            else:
                for earlier in uncounted or ():
                    parsed.feed(earlier)
                uncounted = None
                if parsed.feed(chunk) > max_parsed:
                    raise _too_large_parsed(max_parsed)
        yield chunk
    if charge is not None:
        charge.bytes = size * MAX_PER_BYTE if uncounted is not None else parsed.total


async def _gunzipped(
    pieces: AsyncIterator[bytes], limit: int, encoding: str
) -> AsyncIterator[bytes]:
    size = 0
    if encoding in ("gzip", "x-gzip"):
        # wbits 16+MAX_WBITS: gzip header and trailer.
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        async for chunk in pieces:
            data = chunk
            while data:
                try:
                    # At most _STEP decoded bytes at a time: 64 KB of gzip can decode to
                    # 64 MiB, and the caller may refuse the body long before its end.
                    out = inflater.decompress(data, min(_STEP, limit - size + 1))
                except zlib.error as exc:
                    raise InvalidJSON(f"the gzip body is corrupt: {exc}") from None
                size += len(out)
                if size > limit:
                    raise _too_large(limit)
                yield out
                data = inflater.unconsumed_tail
                if inflater.eof and inflater.unused_data:
                    # Concatenated gzip members (allowed by RFC 1952): start the next one.
                    data = inflater.unused_data + data
                    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        if not inflater.eof:
            # Malformed like a body that is not JSON: 400, as the OpenAPI text of 400 says.
            raise InvalidJSON("the gzip body is truncated")
        return
    async for chunk in pieces:
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        yield chunk


async def read_body(request: Request, limit: int, charge: Charge | None = None) -> bytes:
    """Read the body, gunzipping `Content-Encoding: gzip`, refusing more than `limit` bytes.

    The limit applies to the decoded bytes and is checked as chunks arrive, so neither an
    oversized upload nor a gzip bomb is ever held whole in memory. `charge` (when given)
    is set to what ingesting the body may cost.
    """
    encoding = _encoding(request, limit)
    first = await request.receive()
    if (
        first["type"] == "http.request"
        and not first.get("more_body", False)
        and encoding in ("identity", "")
    ):
        # The whole body in one piece, as small posts come: the checks of _decoded without
        # its generators, which cost more than a small rollout's own reading.
        body: bytes = first.get("body", b"")
        if len(body) > limit:
            raise _too_large(limit)
        cost = whole_body_cost(body, _max_parsed(request))
        if charge is not None:
            charge.bytes = cost
        return body
    pieces = _decoded(request, limit, charge, encoding=encoding, first=first)
    return b"".join([chunk async for chunk in pieces])


def _too_many(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"a batch holds at most {limit} rollouts", limit=limit)


# A line holding something besides whitespace (bytes.strip()'s set; \r is made \n first),
# from its first byte to its end. Possessive and anchored at line starts: linear even on
# megabytes of blanks.
_ITEM_LINE = re.compile(rb"(?m)^[ \t\x0b\x0c]*+[^ \t\n\x0b\x0c][^\n]*")
_BLANK = b" \t\n\r\x0b\x0c"


class _NdjsonItems:
    """The items of an NDJSON body (its non-blank lines, as sent), found as it streams in."""

    def __init__(self, max_items: int) -> None:
        self.items: list[bytes] = []
        self._max = max_items
        self._open: list[bytes] = []  # the pieces of the line still open

    def _add(self, line: bytes) -> None:
        if len(self.items) >= self._max:
            raise _too_many(self._max)
        self.items.append(line)

    def feed(self, data: bytes) -> None:
        """Take the next decoded bytes of the body."""
        if b"\r" in data:
            # Lines end at \r too (as bytes.splitlines() ends them); a line never holds one.
            data = data.replace(b"\r", b"\n")
        last = data.rfind(b"\n")
        if last < 0:
            self._open.append(data)
            return
        start = 0
        if self._open:
            first = data.find(b"\n")
            line = b"".join([*self._open, data[:first]])
            self._open = []
            if line.strip(_BLANK):
                self._add(line)
            start = first + 1
        if data.translate(None, _BLANK):  # whitespace only: no line to look for
            for match in _ITEM_LINE.finditer(data, start, last):
                self._add(match.group())
        if last + 1 < len(data):
            self._open.append(data[last + 1 :])

    def finish(self) -> list[bytes]:
        """The items, once the body has ended."""
        line = b"".join(self._open)
        self._open = []
        if line.strip(_BLANK):
            self._add(line)
        return self.items


async def read_ndjson_items(
    request: Request, limit: int, max_items: int, charge: Charge | None = None
) -> list[bytes]:
    """The items of an NDJSON batch body (its non-blank lines, each as sent).

    Counted as the decoded body streams in: past `max_items` the batch is refused (413)
    at once, before the rest is read, and blank lines are never held. `charge` (when
    given) is set to what ingesting the body may cost.
    """
    items = _NdjsonItems(max_items)
    async for chunk in _decoded(request, limit, charge):
        items.feed(chunk)
    return items.finish()


def array_items(raw: bytes, max_items: int) -> list[bytes]:
    """The items of a JSON-array batch body, each as sent; 413 past `max_items`, found
    before more than `max_items` are sliced out."""
    try:
        items = split_array(raw, max_items=max_items)
    except TooManyItems:
        raise _too_many(max_items) from None
    except ValueError:
        items = None
    if items is None:
        # Not valid JSON, or not an array: ingest's own split says which (400 or 422).
        # It stops at the same place, before `max_items` items, so it holds no more.
        items = split_batch_array(raw)
    return items
