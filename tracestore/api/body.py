"""Request bodies: size limit enforced while streaming, gzip decoded with a bound."""

from __future__ import annotations

import zlib

from starlette.requests import Request

from tracestore.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType


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


async def read_body(request: Request, limit: int) -> bytes:
    """Read the body, gunzipping `Content-Encoding: gzip`, refusing more than `limit` bytes.

    The limit applies to the decoded bytes and is checked as chunks arrive, so neither an
    oversized upload nor a gzip bomb is ever held whole in memory.
    """
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip", "x-gzip", ""):
        raise UnsupportedMediaType(
            f"Content-Encoding {encoding!r} is not supported (use gzip or none)"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    if encoding in ("gzip", "x-gzip"):
        # wbits 16+MAX_WBITS: gzip header and trailer.
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        async for chunk in request.stream():
            data = chunk
            while data:
                try:
                    out = inflater.decompress(data, limit - size + 1)
                except zlib.error as exc:
                    raise InvalidRequest(f"the gzip body is corrupt: {exc}") from None
                size += len(out)
                if size > limit:
                    raise _too_large(limit)
                parts.append(out)
                data = inflater.unconsumed_tail
                if inflater.eof and inflater.unused_data:
                    # Concatenated gzip members (allowed by RFC 1952): start the next one.
                    data = inflater.unused_data + data
                    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        if not inflater.eof:
            raise InvalidRequest("the gzip body is truncated")
        return b"".join(parts)
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
    return b"".join(parts)
