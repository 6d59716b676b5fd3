"""The house rule: imports point down the layers, and packages import each other in no circle.

Read from the code's own import statements (lazy ones inside functions included), so a
new arrow that runs back up fails here, with the file and the line.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tracestore"

# Each unit (a top-level module or package of tracestore) and its floor: a unit may import
# units on its own floor or below, never above. Pure cores are the ground floor.
FLOORS: dict[str, int] = {
    # entry points
    "api": 5,
    "cli": 5,
    # services
    "ingest": 4,
    "drift": 4,
    "inspect": 4,
    "reports": 4,
    "backfill": 4,
    "retention": 4,
    "metrics": 4,
    # storage
    "store": 3,
    "models": 2,
    "db": 1,
    # pure cores and shared words
    "convert": 0,
    "wire": 0,
    "correlation": 0,
    "toolcalls": 0,
    "jsontext": 0,
    "timewindow": 0,
    "durations": 0,
    "envvars": 0,
    "vocabulary": 0,
    "errors": 0,
    "orphans": 0,
    "settings": 0,
    "client": 0,
    "__init__": 0,  # tracestore/__init__.py: the version
}


def _unit(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported unit) for every import of another tracestore unit in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "tracestore":  # from tracestore import X
                names = [f"tracestore.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "tracestore" and len(parts) > 1:
                # `from tracestore import __version__`: the package's face, the ground floor.
                found.append((node.lineno, "__init__" if parts[1].startswith("__") else parts[1]))
    return found


def _edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == PACKAGE:
            continue
        unit = _unit(path)
        for line, target in _imports(path):
            if target != unit:
                edges[(unit, target)].append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return edges


def test_every_unit_has_a_floor() -> None:
    units = {
        _unit(p) for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE or p.name != "__init__.py"
    }
    assert units - set(FLOORS) == set(), "give each new unit a floor in FLOORS"


def test_no_import_runs_back_up_the_layers() -> None:
    upward = [
        f"{where}: {source} (floor {FLOORS[source]}) imports {target} (floor {FLOORS[target]})"
        for (source, target), places in _edges().items()
        if FLOORS[target] > FLOORS[source]
        for where in places
    ]
    assert upward == []


def test_units_import_each_other_in_no_circle() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in _edges():
        graph[source].add(target)
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt > path[0]:  # each cycle once, from its smallest unit
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert cycles == []


def test_the_checks_see_an_upward_import() -> None:
    # The rule itself can fail: a store module importing ingest would be caught.
    sample = PACKAGE / "store" / "runs.py"
    assert any(target == "correlation" for _, target in _imports(sample))
    assert FLOORS["ingest"] > FLOORS["store"]
