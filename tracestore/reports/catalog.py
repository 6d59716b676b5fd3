"""The named reports: `.sql` files shipped in `tracestore/reports/sql/`, read at run time.

A report is one DuckDB SELECT in `sql/NAME.sql` whose first lines are comments:

    -- description: One line shown by `tracestore report --list` and GET /v1/reports.
    -- requires: drift_checks, drift_findings    (optional)

It reads the views every source provides (see `views.sql`) and may use the parameters
`$since`, `$until` and `$env`, which the runner binds as DuckDB prepared parameters (NULL
when not given). `requires` names tables whose absence (an old snapshot, an old schema)
makes the report empty; the runner then says so instead of returning silent zeros.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from tracestore.errors import NotFound

# The parameters a report may use; each is a `--since`/`--until`/`--env` option and query
# parameter of GET /v1/reports/{name}.
PARAMETERS = ("since", "until", "env")
# At most 64 characters: a longer name is no report, and looking it up as a file name could
# pass the file system's limit (OSError: a 500 found by tests/reliability/test_query_fuzz.py).
NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_HEADER = re.compile(r"^--\s*(?P<key>[a-z_]+)\s*:\s*(?P<value>.*?)\s*$")
# `$name` outside JSON paths (`'$.key'` has no word character after the `$`).
_PARAMETER = re.compile(r"\$([A-Za-z_]\w*)")


@dataclass(frozen=True, slots=True)
class Report:
    """One named report: its SQL and what its header declares."""

    name: str
    description: str
    sql: str
    parameters: tuple[str, ...]
    requires: tuple[str, ...]


def sql_dir() -> Traversable:
    """The directory of report files inside the installed package."""
    return resources.files("tracestore.reports").joinpath("sql")


def views_sql() -> str:
    """The SQL of the friendly views (run_facts, step_facts, ...) every source gets."""
    return resources.files("tracestore.reports").joinpath("views.sql").read_text("utf-8")


def parse_report(name: str, sql: str) -> Report:
    """Read a report's header and parameters; a malformed report is a packaging bug."""
    header: dict[str, str] = {}
    for line in sql.splitlines():
        if not line.strip():
            continue
        match = _HEADER.match(line.strip())
        if match is None:
            break
        header[match["key"]] = match["value"]
    description = header.get("description", "").strip()
    if not description:
        raise ValueError(f"report {name}: the first line must be '-- description: ...'")
    used = tuple(dict.fromkeys(_PARAMETER.findall(sql)))
    unknown = [p for p in used if p not in PARAMETERS]
    if unknown:
        raise ValueError(
            f"report {name}: unknown parameter(s) {', '.join('$' + p for p in unknown)}; "
            f"reports may use {', '.join('$' + p for p in PARAMETERS)}"
        )
    requires = tuple(t.strip() for t in header.get("requires", "").split(",") if t.strip())
    return Report(name, description, sql, used, requires)


def list_reports() -> list[Report]:
    """Every report shipped with the package, by name."""
    reports = []
    for entry in sql_dir().iterdir():
        stem, dot, ext = entry.name.rpartition(".")
        if dot and ext == "sql" and NAME.match(stem):
            reports.append(parse_report(stem, entry.read_text("utf-8")))
    return sorted(reports, key=lambda r: r.name)


def get_report(name: str) -> Report:
    """The report called `name`, or NotFound listing the ones that exist."""
    if NAME.match(name):
        entry = sql_dir().joinpath(f"{name}.sql")
        if entry.is_file():
            return parse_report(name, entry.read_text("utf-8"))
    known = ", ".join(r.name for r in list_reports())
    raise NotFound(f"no report named {name!r}; reports: {known}", report=name)
