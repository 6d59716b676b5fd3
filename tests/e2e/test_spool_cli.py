"""`tracestore spool status|replay PATH` (and the client-only `python -m tracestore_client
spool ...`) as a user runs them, against a live server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import Database, LiveServer, free_port, minimal_rollout
from tracestore.client import Spool, TracestoreClient
from tracestore.settings import Settings

TRACESTORE = shutil.which("tracestore", path=str(Path(sys.executable).parent)) or "tracestore"
CLIENT_CLI = [sys.executable, "-m", "tracestore_client"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRACESTORE_")}
    return subprocess.run(
        [TRACESTORE, *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=300,
        check=False,
    )


def _spool_while_down(path: Path, docs: list[bytes]) -> None:
    """Post `docs` to a port nothing listens on: they go to the spool at `path`."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    with TracestoreClient(nowhere, spool=path, max_retries=0) as client:
        for doc in docs:
            assert client.post_rollout(doc)["status"] == "spooled"


def _status(path: Path) -> dict[str, object]:
    done = run("spool", "status", str(path), "--json")
    assert done.returncode == 0, done.stderr
    status: dict[str, object] = json.loads(done.stdout)
    return status


def _error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # errors are one line on stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_status_and_replay_of_a_spool(
    server: LiveServer, http: httpx.Client, tmp_path: Path
) -> None:
    spool = tmp_path / "app.spool"
    good = [orjson.dumps(minimal_rollout(f"cli-{i}")) for i in range(2)]
    invalid = orjson.dumps({"run_id": "cli-invalid"})  # spooled, refused at the replay
    _spool_while_down(spool, [good[0], invalid, good[1]])

    shown = run("spool", "status", str(spool))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].startswith(f"spool {spool}: 3 rollouts waiting (")
    assert "first: cli-0  last: cli-1" in shown.stdout
    status = _status(spool)
    assert (status["pending"], status["first_run_id"], status["last_run_id"]) == (
        3,
        "cli-0",
        "cli-1",
    )
    assert (status["rejected"], status["damaged"], status["replaying"]) == (0, 0, False)
    assert status["pending_bytes"] == spool.stat().st_size
    # The client-only install's command prints the same.
    alone = subprocess.run(
        [*CLIENT_CLI, "spool", "status", str(spool)], capture_output=True, text=True, check=False
    )
    assert (alone.returncode, alone.stdout) == (0, shown.stdout)

    # The server is down: nothing moves, the command says so and fails.
    down = run("spool", "replay", str(spool), "--url", f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 2
    assert "3 rollouts stay spooled" in _error_line(down)
    assert _status(spool)["pending"] == 3
    # --verbose shows the client's log: each retry, then the same error line.
    nowhere = f"http://127.0.0.1:{free_port()}"
    verbose = run("spool", "replay", str(spool), "--url", nowhere, "--verbose")
    assert verbose.returncode == 2
    logged = verbose.stderr.strip().splitlines()
    assert logged[0] == f"tracestore spool {spool}: replaying 3 rollouts"
    assert "POST /v1/rollouts/batch: attempt 1 failed (ConnectError" in logged[1]
    assert logged[-1].startswith("error: cannot deliver to")

    done = run("spool", "replay", str(spool), "--url", server.url)
    assert done.returncode == 2  # one rollout was refused for good: an input error
    assert f"spool {spool}: 2 delivered, 1 rejected, 0 still spooled" in done.stdout
    assert "rejected: cli-invalid: invalid_rollout" in done.stdout
    assert "1 rollouts were refused for good" in _error_line(done)
    for raw in good:
        run_id = orjson.loads(raw)["run_id"]
        assert http.get(f"/v1/rollouts/{run_id}").content == raw
    assert http.get("/v1/rollouts/cli-invalid").status_code == 404
    status = _status(spool)
    assert (status["pending"], status["rejected"]) == (0, 1)
    assert "invalid_rollout" in str(status["last_rejection"])

    again = run("spool", "replay", str(spool), "--url", server.url)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"spool {spool}: nothing to replay"


def test_replay_with_a_refused_key_keeps_the_spool(database: Database, tmp_path: Path) -> None:
    spool = tmp_path / "keyed.spool"
    raw = orjson.dumps(minimal_rollout("cli-keyed"))
    _spool_while_down(spool, [raw])
    settings = Settings(database_url=database.url, api_keys=["k-right"])
    with LiveServer(settings) as live:
        refused = run("spool", "replay", str(spool), "--url", live.url, "--api-key", "k-wrong")
        assert refused.returncode == 2
        assert "401 unauthorized" in _error_line(refused)
        assert _status(spool)["pending"] == 1
        # The key from the environment, as a task app's host has it.
        done = run(
            "spool",
            "replay",
            str(spool),
            env={"TRACESTORE_URL": live.url, "TRACESTORE_API_KEY": "k-right"},
        )
        assert done.returncode == 0, done.stderr
        assert "1 delivered, 0 rejected, 0 still spooled" in done.stdout
        got = httpx.get(f"{live.url}/v1/rollouts/cli-keyed", headers={"X-API-Key": "k-right"})
        assert got.content == raw


@pytest.mark.parametrize("verb", ["status", "replay"])
def test_a_path_that_is_no_spool_is_one_error_line(verb: str, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "app.spool"
    done = run("spool", verb, str(missing))
    assert done.returncode == 2
    assert f"no spool at {missing}" in _error_line(done)
    assert not missing.parent.exists()  # looking created nothing
    alone = subprocess.run(
        [*CLIENT_CLI, "spool", verb, str(missing)], capture_output=True, text=True, check=False
    )
    assert (alone.returncode, alone.stderr) == (2, done.stderr)


@pytest.mark.parametrize("verb", ["status", "replay"])
def test_a_file_of_rollouts_given_as_a_spool_is_refused_and_left_alone(
    verb: str, tmp_path: Path
) -> None:
    # `replay` renamed a JSONL file of rollouts to `.replaying`, read it as one damaged
    # record and said "0 delivered", exit 0; a replay that reached the server then removed
    # it. Now the file is refused as no spool, and nothing is renamed or made beside it.
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_bytes(orjson.dumps(minimal_rollout("not-spooled")) + b"\n")
    before = rollouts.read_bytes()
    nowhere = f"http://127.0.0.1:{free_port()}"
    args = ["spool", verb, str(rollouts), *(["--url", nowhere] if verb == "replay" else [])]
    done = run(*args)
    assert done.returncode == 2, done.stderr
    assert "is not a tracestore spool" in _error_line(done)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollouts.jsonl"]
    assert rollouts.read_bytes() == before


def test_an_interrupted_replay_and_a_torn_write_are_shown_then_delivered(
    server: LiveServer, http: httpx.Client, tmp_path: Path
) -> None:
    path = tmp_path / "crashed.spool"
    raws = [orjson.dumps(minimal_rollout(f"crash-{i}")) for i in range(3)]
    _spool_while_down(path, raws[:2])
    with Spool(path).replay_session() as session:  # a replay that dies after taking
        assert session is not None
        assert session.take() == raws[:2]
    _spool_while_down(path, raws[2:])  # the producer goes on meanwhile
    with open(path, "ab") as handle:
        handle.write(b"TSR1 999 0badc0de\n{")  # and then dies mid-append
    status = _status(path)
    assert (status["pending"], status["replaying"], status["damaged"]) == (3, True, 1)
    assert (status["first_run_id"], status["last_run_id"]) == ("crash-0", "crash-2")
    shown = run("spool", "status", str(path))
    assert "crashed.spool.replaying exists: a replay is running or was interrupted" in shown.stdout
    assert "damaged records skipped: 1" in shown.stdout

    done = run("spool", "replay", str(path), "--url", server.url)
    assert done.returncode == 0, done.stderr
    assert "3 delivered, 0 rejected, 0 still spooled, 1 damaged records skipped" in done.stdout
    for raw in raws:
        assert http.get(f"/v1/rollouts/{orjson.loads(raw)['run_id']}").content == raw
    assert (_status(path)["pending"], _status(path)["replaying"]) == (0, False)
