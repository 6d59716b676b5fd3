"""Auth beyond tests/api/test_auth.py: every documented route, logs, compare, key rotation.

- Every /v1 route the served OpenAPI schema lists refuses (401, error shape) without a
  key and with a wrong one, and so do the HTML report and /metrics; the other routes
  outside /v1 (/health above all) stay open.
- No key, valid or not, appears in the server's log at any uvicorn log level (trace
  included) nor in any answer.
- The key check uses hmac.compare_digest against every configured key (no early exit).
- Keys are read from the configuration at start. Rotating them is a restart with a new
  key set (old+new, then new only); a test streams rollouts across both restarts, the
  second one a SIGKILL, and finds every acknowledged rollout stored, byte for byte.
"""

from __future__ import annotations

import hmac
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.reliability.harness import (
    FIGURES,
    RolloutFactory,
    ServerProcess,
    count_response,
    is_error_shape,
    run_id_of,
    stored_documents,
)
from tracestore.api import deps
from tracestore.client import TracestoreClient, TracestoreHTTPError
from tracestore.db.engine import create_engine
from tracestore.settings import Settings

# Outside /v1, what needs a key when keys are set; /health, /info and the docs stay open.
KEYED_OUTSIDE_V1 = ("/reports/drift", "/metrics")


def _key(label: str) -> str:
    return f"{label}-{secrets.token_hex(16)}"


def _routes(url: str) -> list[tuple[str, str]]:
    """(method, concrete path) of every operation the server documents."""
    schema = httpx.get(url + "/openapi.json", timeout=30).json()
    return [
        (method.upper(), re.sub(r"\{[^}]+\}", "some-id", path))
        for path, operations in schema["paths"].items()
        for method in operations
    ]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server with two keys, logging at trace level (the most verbose)."""
    tmp = tmp_path_factory.mktemp("auth")
    keys = [_key("first"), _key("second")]
    env = {"TRACESTORE_API_KEYS": ",".join(keys)}
    server = ServerProcess(
        f"sqlite:///{tmp / 'store.db'}", tmp / "server.log", env=env, log_level="trace"
    )
    with server:
        yield server, keys


def test_every_documented_v1_route_refuses_without_a_valid_key(keyed: Any) -> None:
    server, keys = keyed
    routes = _routes(server.url)
    v1 = [r for r in routes if r[1].startswith("/v1/")]
    assert len(v1) >= 8, v1
    wrong = _key("wrong")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for method, path in v1:
            for headers in ({}, {"X-API-Key": wrong}, {"Authorization": f"Bearer {wrong}"}):
                response = http.request(method, path, headers=headers, content=b"{}")
                count_response("auth", response)
                assert response.status_code == 401, (method, path, headers, response.text)
                assert is_error_shape(response.json())
                assert response.json()["error"]["code"] == "unauthorized"
                assert wrong not in response.text
            # A valid key gets past auth (to whatever the route then says).
            response = http.request(method, path, headers={"X-API-Key": keys[1]}, content=b"{}")
            assert response.status_code != 401, (method, path)
        for method, path in routes:
            if not path.startswith("/v1/") and method == "GET":
                response = http.get(path)
                if path in KEYED_OUTSIDE_V1:  # CONTRACT: pages with store data, /metrics
                    assert response.status_code == 401, (path, response.text[:200])
                    assert http.get(path, headers={"X-API-Key": keys[0]}).status_code == 200
                else:
                    assert response.status_code != 401, (path, response.text[:200])
        assert http.get("/health").status_code == 200
    FIGURES.add("auth", v1_routes_checked=len(v1))


def test_no_key_appears_in_the_server_log(keyed: Any) -> None:
    server, keys = keyed
    wrong = _key("wrong")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for key in [*keys, wrong]:
            for headers in ({"X-API-Key": key}, {"Authorization": f"Bearer {key}"}):
                http.get("/v1/rollouts", headers=headers)
                http.post("/v1/rollouts", headers=headers, content=b"{not json")
                http.get("/v1/rollouts/nope", headers=headers)
    # Every request's lines must have reached the file before it is read: a fixed pause
    # could read it early under load and check only some of them.
    sent = 2 * len([*keys, wrong])
    deadline = time.monotonic() + 30
    while True:
        log = server.log_text()
        if log.count("GET /v1/rollouts/nope") >= sent or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert log.count("GET /v1/rollouts/nope") >= sent, "the server should log every request"
    for key in [*keys, wrong]:
        assert key not in log
        assert key.split("-", 1)[1] not in log  # not even the random part


def test_the_key_check_compares_every_key_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    # deps imports hmac as a module: patching the module's function is what it calls.
    monkeypatch.setattr(hmac, "compare_digest", compare)
    keys = ["k1", "k2", "k3"]
    assert deps.key_is_valid("k1", keys)
    # The first key matched, and the other two were still compared: how long the check
    # takes does not say which key (or whether an early one) matched.
    assert [b for _, b in calls] == [b"k1", b"k2", b"k3"]
    calls.clear()
    assert not deps.key_is_valid("nope", keys)
    assert len(calls) == 3
    # What the auth dependency calls: named keys, the same way.
    calls.clear()
    named = Settings(api_keys=["a:k1", "k2", "c:k3"]).api_clients()
    assert deps.identify("k1", named) == "a"
    # Every configured key, the named entries' whole texts among them.
    assert [b for _, b in calls] == [b"k1", b"a:k1", b"k2", b"k3", b"c:k3"]


class _Stream:
    """A producer streaming rollouts with whichever key it holds now."""

    def __init__(self, url: str, key: str, factory: RolloutFactory) -> None:
        self.url = url
        self.key = key
        self.factory = factory
        self.acked: dict[str, bytes] = {}
        self.refused: list[str] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _client(self, key: str) -> TracestoreClient:
        # Ride out the restarts: quick retries, bounded in time.
        return TracestoreClient(
            self.url,
            api_key=key,
            max_retries=1000,
            backoff=0.05,
            max_backoff=0.3,
            max_retry_time=60,
        )

    def _run(self) -> None:
        key = self.key
        client = self._client(key)
        try:
            while not self.stop.is_set():
                if self.key != key:
                    client.close()
                    key = self.key
                    client = self._client(key)
                raw = self.factory.make()
                try:
                    body = client.post_rollout(raw)
                except TracestoreHTTPError as exc:
                    # A retired key is surfaced at once, never retried.
                    (self.refused if exc.status == 401 else self.errors).append(str(exc))
                    continue
                except httpx.TransportError as exc:
                    self.errors.append(str(exc))
                    return
                if body["status"] not in ("created", "duplicate"):
                    self.errors.append(str(body))
                self.acked[run_id_of(raw)] = raw
                time.sleep(0.01)
        finally:
            client.close()

    def wait_for(self, n: int) -> None:
        target = len(self.acked) + n
        deadline = time.monotonic() + 60
        while len(self.acked) < target:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, "the stream stalled"
            time.sleep(0.02)


def test_rotating_keys_by_restart_loses_no_acknowledged_rollout(tmp_path: Path) -> None:
    # Keys live in the API process, not in the store: one database stands for both (the
    # crash suite covers restarts on each).
    backend = "sqlite"
    old, new = _key("old"), _key("new")
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    server = ServerProcess(db_url, tmp_path / "server.log", env={"TRACESTORE_API_KEYS": old})
    stream = _Stream(server.url, old, RolloutFactory(f"rotate-{backend}", max_bytes=60_000))
    server.start()
    try:
        stream.thread.start()
        stream.wait_for(5)
        # Step 1: add the new key (graceful restart: requests in flight finish first).
        server.stop()
        server.env = {"TRACESTORE_API_KEYS": f"{old},{new}"}
        server.start()
        stream.wait_for(5)
        stream.key = new  # producers move to the new key while both work
        stream.wait_for(5)
        # Step 2: retire the old key (this time the old process is killed mid-stream).
        server.kill()
        server.env = {"TRACESTORE_API_KEYS": new}
        server.start()
        stream.wait_for(5)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            retired = http.get("/v1/rollouts", headers={"X-API-Key": old})
            assert retired.status_code == 401
            assert http.get("/v1/rollouts", headers={"X-API-Key": new}).status_code == 200
        stream.stop.set()
        stream.thread.join(timeout=60)
        assert not stream.errors, stream.errors
        assert not stream.refused, "no producer held a retired key"
        engine = create_engine(db_url)
        documents = stored_documents(engine)
        engine.dispose()
        # Every acknowledged rollout is there, byte for byte, across both restarts.
        assert {r: documents.get(r) for r in stream.acked} == stream.acked
        FIGURES.add(
            f"auth/{backend}",
            key_rotations=2,
            acknowledged=len(stream.acked),
            verified=len(stream.acked),
        )
    finally:
        stream.stop.set()
        server.stop()


def test_a_retired_key_is_surfaced_not_retried(keyed: Any) -> None:
    server, _keys = keyed
    attempts: list[int] = []
    hooks = {"response": [lambda r: attempts.append(r.status_code)]}
    client = TracestoreClient(
        server.url, api_key=_key("retired"), max_retries=5, backoff=0.01, event_hooks=hooks
    )
    with client, pytest.raises(TracestoreHTTPError) as refused:
        client.post_rollout(RolloutFactory("retired").make())
    assert refused.value.status == 401
    assert refused.value.code == "unauthorized"
    assert attempts == [401]
