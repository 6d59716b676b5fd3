"""Request bodies: size limit enforced while streaming, gzip decoded with a bound, and the
items of a batch counted before they are held.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import AsyncIterator

from starlette.requests import Request

from tracestore.errors import InvalidJSON, PayloadTooLarge, UnsupportedMediaType
from tracestore.ingest.parse import split_batch_array
from tracestore.jsontext import TooManyItems, split_array


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body exceeds the limit of {limit} bytes (after decompression)", limit=limit
    )


def media_type(request: Request) -> str:
    """The request's Content-Type without parameters, lower-cased ('' when absent)."""
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


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
# What a byte of JSON costs once parsed (CPython, 64-bit), roughly and on the high side: an
# object or array 64 bytes, a string ~56 (28 per quote), a float 24 (per '.'), an element's
# slot 8. Real rollouts come to 4-6 bytes per byte; `{},{},...` to 24. Counted at C speed
# as the body streams in, so a body cheap on the wire but huge once parsed (a gzip of
# millions of `{}` inside one rollout took a worker to 2 GB) is refused before parsing.
_PARSED_COST = ((b"{", 64), (b"[", 64), (b'"', 28), (b".", 24), (b",", 8))


def parsed_estimate(data: bytes) -> int:
    """Roughly how many bytes of memory `data` takes once parsed (an upper estimate)."""
    return sum(data.count(char) * cost for char, cost in _PARSED_COST)


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


async def _decoded(request: Request, limit: int) -> AsyncIterator[bytes]:
    """The body's bytes as they arrive, gunzipped when `Content-Encoding: gzip`; 413 past
    `limit` decoded bytes or the parsed-size limit, 400 for a corrupt or truncated gzip."""
    max_parsed = _max_parsed(request)
    parsed = 0
    async for chunk in _gunzipped(request, limit):
        if max_parsed is not None:
            parsed += parsed_estimate(chunk)
            if parsed > max_parsed:
                raise _too_large_parsed(max_parsed)
        yield chunk


async def _gunzipped(request: Request, limit: int) -> AsyncIterator[bytes]:
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip", "x-gzip", ""):
        raise UnsupportedMediaType(
            f"Content-Encoding {encoding!r} is not supported (use gzip or none)"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    size = 0
    if encoding in ("gzip", "x-gzip"):
        # wbits 16+MAX_WBITS: gzip header and trailer.
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        async for chunk in request.stream():
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
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        yield chunk


async def read_body(request: Request, limit: int) -> bytes:
    """Read the body, gunzipping `Content-Encoding: gzip`, refusing more than `limit` bytes.

    The limit applies to the decoded bytes and is checked as chunks arrive, so neither an
    oversized upload nor a gzip bomb is ever held whole in memory.
    """
    return b"".join([chunk async for chunk in _decoded(request, limit)])


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


async def read_ndjson_items(request: Request, limit: int, max_items: int) -> list[bytes]:
    """The items of an NDJSON batch body (its non-blank lines, each as sent).

    Counted as the decoded body streams in: past `max_items` the batch is refused (413)
    at once, before the rest is read, and blank lines are never held.
    """
    items = _NdjsonItems(max_items)
    async for chunk in _decoded(request, limit):
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
