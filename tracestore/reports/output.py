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
    out["notices"] = result.notices
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
