"""Portable column types: JSON (JSONB on PostgreSQL), NUL-safe text, UTC datetimes."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import JSON, DateTime, Dialect, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

from tracestore.jsontext import dumps

# PostgreSQL's text and jsonb cannot hold U+0000. Typed columns are a projection for
# queries (the lossless copy is the stored raw document), so on PostgreSQL a NUL becomes
# U+2400 SYMBOL FOR NULL there: visible, and not confusable with an empty string.
NUL_STANDIN = "\u2400"
# A `\u0000` escape in serialized JSON that is not itself an escaped backslash.
_JSON_NUL = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")


def json_dumps(value: Any) -> str:
    """Serialize JSON for SQLite columns (orjson: fast, and exact for floats)."""
    return dumps(value).decode()


def json_dumps_pg(value: Any) -> str:
    """Serialize JSON for PostgreSQL jsonb, replacing NUL characters that jsonb refuses."""
    raw = dumps(value)
    if b"\\u0000" in raw:
        raw = _JSON_NUL.sub(lambda m: m.group(1) + b"\\u2400", raw)
    return raw.decode()


# Twenty digits in a row: an integer that may be past 64 bits (2**64 has 20 digits).
_LONG_NUMBER = re.compile(r"\d{20}")
_LONG_NUMBER_BYTES = re.compile(rb"\d{20}")


def json_loads(value: str | bytes | int | float) -> Any:
    """Parse JSON read back from a column.

    SQLite gives a JSON column NUMERIC affinity, so a bare JSON number (`"obs": 3`) is
    stored as a number and comes back as one: it is already the value.
    """
    if isinstance(value, int | float):
        return value
    long_number = (
        _LONG_NUMBER.search(value) if isinstance(value, str) else _LONG_NUMBER_BYTES.search(value)
    )
    if long_number is not None:
        # orjson reads an integer past 64 bits as a float; the stdlib keeps it exact.
        # Twenty digits in a row are rare (here or in a string), so the fast path stays.
        return json.loads(value)
    return orjson.loads(value)


class JSONValue(TypeDecorator[Any]):
    """JSON on SQLite, JSONB on PostgreSQL (serialized by the engine's json_serializer)."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        """Pick JSONB on PostgreSQL."""
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB(none_as_null=True))
        return dialect.type_descriptor(JSON(none_as_null=True))


class SafeText(TypeDecorator[str]):
    """Text that survives PostgreSQL: NUL characters become U+2400 there."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        """Replace NUL on PostgreSQL."""
        if value is not None and dialect.name == "postgresql" and "\x00" in value:
            return value.replace("\x00", NUL_STANDIN)
        return value


def pg_safe(value: str) -> str:
    """Map a string to its stored form on PostgreSQL (for look-up parameters)."""
    return value.replace("\x00", NUL_STANDIN)


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime; naive values are refused rather than guessed."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Refuse naive datetimes and store UTC."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: tracestore stores aware UTC datetimes only")
        value = value.astimezone(UTC)
        # SQLite has no time zone type: store naive UTC text, re-attach UTC on read.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Return aware UTC datetimes on every database."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
