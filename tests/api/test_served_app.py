"""The app `tracestore serve` runs (api/server.py `served_app`): its heap is frozen once
started, so the collector's full passes skip what lives as long as the worker; an app
built by `create_app` alone (tests, embedding) leaves the collector as it found it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Database
from tracestore.api.app import create_app
from tracestore.api.server import APP, served_app
from tracestore.settings import Settings


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Nothing frozen before the test, and nothing left frozen after it."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_serve_runs_the_served_app() -> None:
    assert f"{served_app.__module__}:{served_app.__name__}" == APP


def test_the_served_app_freezes_its_heap_once_started(
    database: Database, monkeypatch: pytest.MonkeyPatch, unfrozen: None
) -> None:
    monkeypatch.setenv("TRACESTORE_DATABASE_URL", database.url)
    app = served_app()
    assert gc.get_freeze_count() == 0  # built, not started
    with TestClient(app) as client:
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # the modules, the app, its engines: all of it
        assert client.get("/health").status_code == 200
    # Its settings came from the environment, as a worker's do.
    assert app.state.tracestore.settings.database_url == database.url


def test_an_app_built_alone_freezes_nothing(database: Database, unfrozen: None) -> None:
    with TestClient(create_app(Settings(database_url=database.url))) as client:
        assert client.get("/health").status_code == 200
        assert gc.get_freeze_count() == 0
