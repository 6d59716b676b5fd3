"""TRACESTORE_API_KEYS: every /v1 route needs a key; /health stays open."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import Engine

from tests.conftest import Database, Example, LiveServer, row_counts
from tracestore.api.deps import identify, key_is_valid
from tracestore.settings import Settings

KEYS = ["key-one", "key-two"]


@pytest.fixture(scope="module")
def locked(database: Database) -> Iterator[LiveServer]:
    with LiveServer(Settings(database_url=database.url, api_keys=KEYS)) as live:
        yield live


V1_ROUTES = [
    ("GET", "/v1/rollouts"),
    ("GET", "/v1/rollouts/some-run"),
    ("GET", "/v1/correlations/some-cid"),
    ("POST", "/v1/rollouts"),
    ("POST", "/v1/rollouts/batch"),
]


@pytest.mark.parametrize(("method", "path"), V1_ROUTES)
@pytest.mark.parametrize("headers", [{}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer no"}])
def test_v1_refuses_without_a_valid_key(
    locked: LiveServer, engine: Engine, method: str, path: str, headers: dict[str, str]
) -> None:
    response = httpx.request(method, locked.url + path, headers=headers, content=b"{}")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert set(row_counts(engine).values()) == {0}


def test_health_stays_open(locked: LiveServer) -> None:
    assert httpx.get(locked.url + "/health").status_code == 200


@pytest.mark.parametrize("headers", [{"X-API-Key": "key-one"}, {"Authorization": "Bearer key-two"}])
def test_valid_keys_pass(
    locked: LiveServer, engine: Engine, examples: list[Example], headers: dict[str, str]
) -> None:
    response = httpx.post(locked.url + "/v1/rollouts", content=examples[0].raw, headers=headers)
    assert response.status_code == 201
    assert httpx.get(locked.url + "/v1/rollouts", headers=headers).status_code == 200


def test_key_check() -> None:
    assert key_is_valid("b", ["a", "b"])
    assert not key_is_valid("c", ["a", "b"])
    assert not key_is_valid("", ["a"])
    assert not key_is_valid("a", [])


def test_keys_come_from_a_comma_separated_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACESTORE_API_KEYS", " k1, k2 ,,")
    assert Settings().api_keys == ["k1", "k2"]
    monkeypatch.delenv("TRACESTORE_API_KEYS")
    assert Settings().api_keys == []


def test_keys_may_be_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # `name:key` names a key; a bare key keeps working, named by its place in the list.
    monkeypatch.setenv("TRACESTORE_API_KEYS", "trainer-a:s3cret, plainkey ,eval.b:k:with:colons")
    clients = Settings().api_clients()
    assert [(c.name, c.key) for c in clients if not c.whole] == [
        ("trainer-a", "s3cret"),
        ("key-2", "plainkey"),
        ("eval.b", "k:with:colons"),
    ]
    assert identify("plainkey", clients) == "key-2"
    assert identify("k:with:colons", clients) == "eval.b"
    # The whole entry is a key as well, as a bare key is (named by its place): the
    # contract's keys are comma-separated text, and one holding a colon was refused (401)
    # once named keys came.
    assert identify("trainer-a:s3cret", clients) == "key-1"
    assert identify("eval.b:k:with:colons", clients) == "key-3"
    assert identify("trainer-a", clients) is None
    assert identify("nope", clients) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("anonymous:k1", "reserved"),
        ("other:k1", "reserved"),
        ("a:", "empty"),
        ("a:k1,b:k1", "same key"),
        ("a:k1,a:k2", "same name"),
        # One entry's whole text is another's key: one presented text, two keys.
        ("a:k1,b:a:k1", "same key"),
        # A name that is another entry's place: its whole text's name.
        ("key-2:k1,b:k2", "same name"),
        (" , ", "holds no key"),
        (",", "holds no key"),
    ],
)
def test_bad_key_lists_are_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    monkeypatch.setenv("TRACESTORE_API_KEYS", value)
    with pytest.raises(ValidationError, match=problem):
        Settings()


def test_named_keys_authenticate(database: Database, engine: Engine) -> None:
    keys = ["ci:named-secret", "bare-secret"]
    with LiveServer(Settings(database_url=database.url, api_keys=keys)) as live:
        for key in ("named-secret", "bare-secret"):
            response = httpx.get(live.url + "/v1/rollouts", headers={"X-API-Key": key})
            assert response.status_code == 200
        # The whole entry too: a key holding a colon, as the contract's keys may.
        response = httpx.get(live.url + "/v1/rollouts", headers={"X-API-Key": "ci:named-secret"})
        assert response.status_code == 200
        for wrong in ("ci", "named", "ci:named", "named-secret:ci"):
            response = httpx.get(live.url + "/v1/rollouts", headers={"X-API-Key": wrong})
            assert response.status_code == 401
