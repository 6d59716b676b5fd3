"""Every domain error has its HTTP status in api/errors.py's table: none falls to a 500.

A TracestoreError subclass without an entry (its own or an ancestor's) reaches a client as
a 500, as if the server had failed. The classes are found by importing every module of
the package and walking `__subclasses__`, so an error defined anywhere is covered.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import tracestore
from tracestore.api.errors import STATUS, error_response, status_of
from tracestore.errors import TracestoreError


def _error_classes() -> list[type[TracestoreError]]:
    for module in pkgutil.walk_packages(tracestore.__path__, "tracestore."):
        importlib.import_module(module.name)
    found: list[type[TracestoreError]] = []
    todo: list[type[TracestoreError]] = [TracestoreError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    return sorted(found, key=_name)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


ERRORS = _error_classes()
# Errors with no status of their own: none. (An entry here marks its test xfail, strict.)
_UNMAPPED: dict[str, str] = {}


def test_the_walk_finds_errors_defined_outside_errors_py() -> None:
    names = {_name(cls) for cls in ERRORS}
    # Defined outside errors.py: else the guard below would pass by seeing too little.
    assert {
        "tracestore.ingest.files.UnreadableFile",
        "tracestore.ingest.synth_db.SynthDatabaseError",
        "tracestore.reports.connection.AnalyticsError",
    } <= names
    assert "tracestore.errors.EmptyBatch" in names  # and a subclass of a subclass


@pytest.mark.parametrize(
    "cls",
    [
        pytest.param(
            cls,
            id=_name(cls),
            marks=[pytest.mark.xfail(strict=True, reason=_UNMAPPED[_name(cls)])]
            if _name(cls) in _UNMAPPED
            else [],
        )
        for cls in ERRORS
    ],
)
def test_every_error_class_maps_to_a_status(cls: type[TracestoreError]) -> None:
    entries = [c for c in cls.__mro__ if c in STATUS]
    assert entries, f"{_name(cls)} has no entry in tracestore.api.errors.STATUS: a 500"
    assert STATUS[entries[0]] in range(400, 600)
    error = cls("a message", detail=1)
    response = error_response(error)
    assert response.status_code == status_of(error) == STATUS[entries[0]]
    assert cls.code != TracestoreError.code, "each error says which it is"
    assert bytes(response.body).startswith(b'{"error":{"code":"' + cls.code.encode() + b'"')
