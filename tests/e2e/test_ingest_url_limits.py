"""`tracestore ingest --url` within the server's limits (a real subprocess, a live server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import Database, Example, LiveServer, minimal_rollout, wipe
from tests.e2e.test_cli import run
from tracestore.cli.ingest import BATCH_BYTES, _batches
from tracestore.db.engine import create_engine
from tracestore.ingest.files import FileItem
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
    assert f"{len(big.raw)} bytes, past the server's limit of 20000 a request" in done.stdout
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


def _big_rollout(run_id: str) -> bytes:
    """A valid rollout past the 8 MiB a batch aims at, well within the 64 MiB body limit."""
    raw = orjson.dumps(minimal_rollout(run_id, notes="x" * (BATCH_BYTES + 1024 * 1024)))
    assert BATCH_BYTES < len(raw) < Settings().max_body_bytes
    return raw


@pytest.mark.parametrize("live", [{}], indirect=True)
@pytest.mark.parametrize("where", ["--url", "--db"])
def test_a_rollout_past_the_batch_size_goes_alone_not_refused(
    live: LiveServer, database: Database, tmp_path: Path, where: str
) -> None:
    # The batch size (8 MiB) was taken for the body limit: a 9 MiB rollout the server
    # takes (its limit is 64 MiB) was counted refused and never sent, with --db too.
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"\n".join([_big_rollout("big-1"), orjson.dumps(minimal_rollout("s-1"))]))
    target = live.url if where == "--url" else database.url
    done = run("ingest", str(path), where, target)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 rollouts: 2 created" in done.stdout, done.stdout
    assert httpx.get(f"{live.url}/v1/rollouts/big-1").status_code == 200


def test_batches_bound_their_bytes_and_count_and_refuse_only_past_the_item_limit() -> None:
    def item(n: int, i: int) -> FileItem:
        return FileItem(b"x" * n, {}, f"f:{i}")

    sizes = [10, 10, 30, 5, 100, 10, 10, 10]
    refused: list[str] = []

    def record(it: FileItem, status: str, reason: str | None) -> None:
        refused.append(f"{status} {it.where}")

    items = [item(n, i) for i, n in enumerate(sizes)]
    got = [[len(x.raw) for x in b] for b in _batches(iter(items), record, 3, 32, 64)]
    # 10+1+10 = 21 fits 32, +1+30 does not; 30 alone; 5: 30+1+5 > 32; 100 past 64: refused;
    # then three of 10 would be 32 bytes: the count (3) ends the batch first.
    assert got == [[10, 10], [30], [5, 10, 10], [10]]
    assert refused == ["refused f:4"]
    refused.clear()
    # Without an item limit (--db), a large item goes in a batch of its own.
    big = [item(10, 0), item(BATCH_BYTES + 1, 1), item(10, 2)]
    got = [[len(x.raw) for x in b] for b in _batches(iter(big), record)]
    assert got == [[10], [BATCH_BYTES + 1], [10]]
    assert refused == []
