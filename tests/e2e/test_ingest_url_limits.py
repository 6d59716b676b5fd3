"""`tracestore ingest --url` within the server's limits (a real subprocess, a live server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Database, Example, LiveServer, wipe
from tests.e2e.test_cli import run
from tracestore.db.engine import create_engine
from tracestore.settings import Settings


@pytest.fixture
def live(database: Database, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """A live server over an empty store, with the test's limits (`indirect` settings)."""
    engine = create_engine(database.url)
    wipe(engine)
    try:
        with LiveServer(Settings(database_url=database.url, **request.param)) as server:
            yield server
    finally:
        wipe(engine)
        engine.dispose()


def _created(examples: list[Example], smaller_than: int) -> list[Example]:
    """Distinct examples the store creates, each under `smaller_than` bytes."""
    seen: set[str] = set()
    picked = []
    for ex in examples:
        run_id = ex.label["run_id"]
        fits = len(ex.raw) < smaller_than
        if ex.label["expect_status"] == "created" and fits and run_id not in seen:
            seen.add(run_id)
            picked.append(ex)
    return picked


def _stored(url: str, examples: list[Example]) -> list[str]:
    return [
        ex.label["run_id"]
        for ex in examples
        if httpx.get(f"{url}/v1/rollouts/{ex.label['run_id']}").status_code == 200
    ]


@pytest.mark.parametrize("live", [{"max_body_bytes": 20_000}], indirect=True)
def test_batches_fit_the_servers_body_limit_and_a_rollout_past_it_is_named(
    live: LiveServer, examples: list[Example], tmp_path: Path
) -> None:
    # The old bounds (64 rollouts / 8 MiB) made one body of all of these: the server
    # refused it whole (413), though it takes each of them alone, and nothing was stored.
    small = _created(examples, 20_000)
    big = next(ex for ex in examples if len(ex.raw) > 20_000)
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b"\n".join([*(ex.raw for ex in small), big.raw]))
    assert path.stat().st_size > 5 * 20_000

    done = run("ingest", str(path), "--url", live.url)

    assert done.returncode == 2, done.stdout + done.stderr  # the big one was refused
    n = len(small)
    assert f"{n + 1} rollouts: {n} created, 0 duplicate, 0 conflict, 0 invalid, 1 refused" in (
        done.stdout
    ), done.stdout
    assert f"refused: {path}:{n + 1}" in done.stdout, done.stdout
    assert f"{len(big.raw)} bytes, past the limit of 20000 a request" in done.stdout
    assert _stored(live.url, small) == [ex.label["run_id"] for ex in small]
    assert _stored(live.url, [big]) == []


@pytest.mark.parametrize("live", [{"max_batch_items": 3}], indirect=True)
def test_batches_hold_no_more_rollouts_than_the_server_takes(
    live: LiveServer, examples: list[Example], tmp_path: Path
) -> None:
    small = _created(examples, 20_000)[:10]
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b"\n".join(ex.raw for ex in small))

    done = run("ingest", str(path), "--url", live.url)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "10 rollouts: 10 created" in done.stdout, done.stdout
    assert len(_stored(live.url, small)) == 10


# One of these small rollouts alone is estimated well under this once parsed (~17 bytes
# a byte), so a batch of all of them is refused (413) and a few together are not.
@pytest.mark.parametrize("live", [{"max_parsed_bytes": 120_000}], indirect=True)
def test_a_batch_refused_as_too_large_is_sent_again_in_halves(
    live: LiveServer, examples: list[Example], tmp_path: Path
) -> None:
    small = _created(examples, 2_000)
    assert len(small) >= 8
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b"\n".join(ex.raw for ex in small))
    # The premise: the server refuses them together, and takes one of them alone.
    together = httpx.post(
        f"{live.url}/v1/rollouts/batch",
        content=path.read_bytes(),
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert together.status_code == 413, together.text

    done = run("ingest", str(path), "--url", live.url)

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(small)} rollouts: {len(small)} created" in done.stdout, done.stdout
    assert _stored(live.url, small) == [ex.label["run_id"] for ex in small]


@pytest.mark.parametrize("live", [{"api_keys": ["w:right"]}], indirect=True)
def test_a_command_stopped_part_way_still_says_what_it_did(
    live: LiveServer, examples: list[Example], tmp_path: Path
) -> None:
    # The unparseable first line is counted before the server refuses the first batch
    # (a wrong key; /info, read first, needs none): the summary says so, and that the
    # rest was not sent.
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b"\n".join([b"{not json", examples[0].raw]))

    done = run("ingest", str(path), "--url", live.url, "--api-key", "wrong")

    assert done.returncode == 2
    assert done.stderr.startswith("error: the server refused the batch: 401"), done.stderr
    assert "1 rollout: 0 created, 0 duplicate, 0 conflict, 1 invalid" in done.stdout
    assert "the rollouts after these were not sent" in done.stdout
