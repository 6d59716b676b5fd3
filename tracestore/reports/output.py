"""Report and query results as JSON, CSV, Parquet, or plain rows for a terminal table."""

from __future__ import annotations

import csv
import io
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

from tracestore.jsontext import dumps
from tracestore.reports.runner import Result

FORMATS = ("table", "csv", "json", "parquet")


def plain(value: Any) -> Any:
    """A JSON-ready value: dates and times as ISO text, exact integers stay integers."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        # HUGEINT sums and DECIMAL literals: integral ones as integers, others as floats.
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def tuples(table: pa.Table) -> list[tuple[Any, ...]]:
    """Every row as a tuple of Python values (column-wise: duplicate names are kept)."""
    return list(zip(*(column.to_pylist() for column in table.columns), strict=True))


def rows(table: pa.Table) -> list[dict[str, Any]]:
    """Every row as a dict of JSON-ready values."""
    names = table.column_names
    return [{name: plain(v) for name, v in zip(names, row, strict=True)} for row in tuples(table)]


def _non_finite(values: Any) -> int:
    """How many of an Arrow array's floats, at any depth of lists, maps and structs, are
    infinite or NaN."""
    if isinstance(values, pa.ChunkedArray):
        return sum(_non_finite(chunk) for chunk in values.chunks)
    kind = values.type
    if pa.types.is_floating(kind):
        return int(pc.sum(pc.invert(pc.is_finite(values))).as_py() or 0)
    if pa.types.is_struct(kind):
        return sum(_non_finite(field) for field in values.flatten())
    if pa.types.is_map(kind):
        # Its values as a list array of the same offsets (Arrow flattens no map).
        values = pa.ListArray.from_arrays(values.offsets, values.items)
    # flatten() honours a slice's offset (a list's .values would not).
    if pa.types.is_nested(kind) and hasattr(values, "flatten"):
        return _non_finite(values.flatten())
    return 0


def non_finite_notices(table: pa.Table) -> list[str]:
    """A notice for each column holding infinities or NaN, which JSON writes as null."""
    notices = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        n = _non_finite(column)
        if n:
            notices.append(
                f"column {name!r}: {n} value{'s' if n > 1 else ''} infinite or NaN, which "
                "JSON cannot hold: written as null (CSV and Parquet keep them)"
            )
    return notices


def document(result: Result) -> dict[str, Any]:
    """The JSON document of a result: what it is, its columns and types, its rows."""
    out: dict[str, Any] = {}
    if result.report is not None:
        out["report"] = result.report.name
        out["description"] = result.report.description
    if result.filters is not None:
        out["parameters"] = result.filters.as_dict()
    out["source"] = result.source
    out["columns"] = [
        {"name": n, "type": t} for n, t in zip(result.columns, result.types, strict=True)
    ]
    out["rows"] = rows(result.table)
    # orjson writes a non-finite float as null: say so rather than lose it without a word.
    out["notices"] = [*result.notices, *non_finite_notices(result.table)]
    return out


def to_json(result: Result) -> bytes:
    """The result as one JSON document."""
    # jsontext's: a HUGEINT past 64 bits, which orjson does not write, comes out exactly.
    return dumps(document(result), indent=True) + b"\n"


def _cell(value: Any) -> str:
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def to_csv(result: Result) -> str:
    """The result as CSV with a header row (NULL is an empty field)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(result.columns)
    for row in tuples(result.table):
        writer.writerow([_cell(v) for v in row])
    return buffer.getvalue()


def to_parquet(result: Result) -> bytes:
    """The result as Parquet bytes (zstd)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # no type stubs

    sink = io.BytesIO()
    pq.write_table(result.table, sink, compression="zstd")
    return sink.getvalue()


def write_parquet(result: Result, path: Path) -> None:
    """Write the result's rows to a Parquet file."""
    path.write_bytes(to_parquet(result))


def text_cells(result: Result) -> list[list[str]]:
    """Rows as display text for a terminal table (NULL shown as an empty cell)."""
    return [[_cell(v) for v in row] for row in tuples(result.table)]
