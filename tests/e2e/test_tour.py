"""The README's tour runs as written, against a live `tracestore serve`.

Its fenced bash blocks are split into commands and run in order by one bash process, from
a folder that holds what a fresh clone gives the tour (`examples/` and the `.venv` that
`./scripts/serve` sets up) and nothing else. Only the `URL=` line is changed, to point at
the test's server; every command must exit 0 and show what the README says it shows.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Example, _PgDatabases, new_database
from tests.reliability.harness import ServerProcess
from tracestore.db import migrate
from tracestore.db.engine import create_engine
from tracestore.ingest.parse import validate_rollout

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
VENV = Path(sys.executable).parent.parent
URL_LINE = re.compile(r"URL=http://127\.0\.0\.1:8000")
MARK = "@@tour"


def tour_blocks() -> list[str]:
    """The fenced bash blocks of the README's tour section."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## A five-minute tour\n", 1)[1].split("\n## ", 1)[0]
    return [str(b) for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def split_commands(block: str) -> list[str]:
    """A bash block's commands: comment lines dropped; continuations and quotes joined."""
    commands: list[str] = []
    pending = ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        commands.append(pending)
        pending = ""
    assert not pending, f"unfinished command in the README's tour: {pending!r}"
    return commands


def tour_commands() -> list[str]:
    """Every command of the tour, in order."""
    return [c for block in tour_blocks() for c in split_commands(block)]


@dataclass(frozen=True)
class Ran:
    """One command of the tour and what it did."""

    command: str
    status: int
    output: str


def run_tour(commands: list[str], cwd: Path, env: dict[str, str]) -> list[Ran]:
    """Run the commands in one bash (variables carry over), each one's status recorded."""
    script = ["set -o pipefail"]  # a failing curl inside a pipeline counts as a failure
    for i, command in enumerate(commands):
        script += [
            f"printf '\\n{MARK} begin {i}\\n'",
            command,
            f"printf '\\n{MARK} end {i} %d\\n' $?",
        ]
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )
    ran: list[Ran] = []
    for i, command in enumerate(commands):
        match = re.search(
            rf"\n{MARK} begin {i}\n(.*)\n{MARK} end {i} (\d+)\n", done.stdout, flags=re.S
        )
        assert match, f"command {i} did not finish: {command}\n{done.stdout[-3000:]}"
        ran.append(Ran(command, int(match.group(2)), match.group(1)))
    return ran


def test_the_tour_names_the_server_once_and_shows_a_minimal_rollout() -> None:
    commands = tour_commands()
    assert URL_LINE.fullmatch(commands[0]), "the tour starts by setting URL"
    # One variable: no other command names the server's address.
    assert not [c for c in commands[1:] if "8000" in c or "127.0.0.1" in c or "localhost" in c]
    (assignment,) = [c for c in commands if c.startswith("ROLLOUT=")]
    (word,) = shlex.split(assignment)
    rollout = json.loads(word.removeprefix("ROLLOUT="))
    assert validate_rollout(rollout) is rollout
    assert set(rollout) == {"run_id", "trajectories", "metrics"}, "only the required keys"


def _workdir(tmp_path: Path) -> Path:
    """What a fresh clone gives the tour once `./scripts/serve` has made its .venv."""
    work = tmp_path / "clone"
    work.mkdir()
    (work / ".venv").symlink_to(VENV, target_is_directory=True)
    (work / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    return work


def _expected(examples: list[Example]) -> list[tuple[str, list[list[str]]]]:
    """Per command (found by a piece of its text), what each of its runs must print."""
    first = examples[0].label
    statuses = [e.label["expect_status"] for e in examples]
    counts = {s: statuses.count(s) for s in ("created", "duplicate", "conflict")}
    return [
        ("$URL/health", [['"healthy":true']]),
        (
            "tracestore demo --url $URL",
            [
                [
                    f"{len(examples)} rollouts: {counts['created']} created, "
                    f"{counts['duplicate']} duplicate, {counts['conflict']} conflict, 0 invalid"
                ]
            ],
        ),
        (
            '--data-binary "$ROLLOUT"',
            [['"status":"created"', "} 201"], ['"status":"duplicate"', "} 200"]],
        ),
        ("cmp -", [["same"]]),
        ("/v1/rollouts/hello-1/trace", [['"session_id":"hello-1"', '"reward":1.0']]),
        (
            "head -n 1 examples/rollouts.jsonl",
            [['"status":"duplicate"', f'"correlation_id":"{first["correlation_id"]}"', "} 200"]],
        ),
        ("/v1/correlations/", [[f'"run_id":"{first["run_id"]}"']]),
        ("/trajectories", [["200 OK", "x-tracestore-source: converted"]]),
        (
            "/v1/rollouts/batch",
            [
                [
                    '"summary": {',
                    f'"total": {len(examples)}',
                    '"created": 0',
                    f'"duplicate": {len(examples) - counts["conflict"]}',
                    f'"conflict": {counts["conflict"]}',
                ]
            ],
        ),
        ("trace_kind=full&limit=2", [['"trace_kind":"full"', '"next_cursor":']]),
        ("tracestore show", [[f'"run_id": "{first["run_id"]}"']]),
        ("tracestore cid", [[first["run_id"], first["correlation_source"]]]),
        ("tracestore drift", [["drift rate", "reward_mismatch"]]),
        ("tracestore report returns", [["mean_return"]]),
    ]


def test_the_readme_tour_runs_as_written(
    backend: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    pg_databases: _PgDatabases | None,
    examples: list[Example],
) -> None:
    work = _workdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESTORE_")}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "200"  # a terminal wide enough for the tables' run ids
    if backend == "sqlite":
        # As in the README: the server and the CLI share ./tracestore.db.
        db_url = f"sqlite:///{work / 'tracestore.db'}"
    else:
        db_url = new_database(backend, "tour", tmp_path_factory, pg_databases).url
        engine = create_engine(db_url)
        migrate.upgrade(engine)  # PostgreSQL is migrated as a release step, not by serve
        engine.dispose()
        env["TRACESTORE_DATABASE_URL"] = db_url

    commands = tour_commands()
    assert URL_LINE.fullmatch(commands[0])
    with ServerProcess(db_url, tmp_path / "server.log", log_level="info") as server:
        commands[0] = f"URL={server.url}"
        ran = run_tour(commands, work, env)
        log = server.log_text()

    failed = [r for r in ran if r.status != 0]
    assert not failed, "\n\n".join(f"{r.command}\n-> exit {r.status}\n{r.output}" for r in failed)
    for piece, runs in _expected(examples):
        matching = [r for r in ran if piece in r.command]
        assert len(matching) == len(runs), f"{piece!r}: {len(matching)} commands in the tour"
        for r, wanted in zip(matching, runs, strict=True):
            for text in wanted:  # case apart: HTTP header names are case-insensitive
                assert text.lower() in r.output.lower(), (
                    f"{r.command}\nshould print {text!r}, printed:\n{r.output}"
                )
    # The run the tour reads as trajectories is one whose producer sent none.
    (read,) = [r.command for r in ran if "/trajectories" in r.command]
    trace_only = {e.label["run_id"] for e in examples if e.doc["trajectories"] == []}
    run_id = re.search(r"/v1/rollouts/([^/\s]+)/trajectories", read)
    assert run_id is not None, read
    assert run_id[1] in trace_only, read
    # The statuses the README's comments promise, as the server answered them.
    assert '"POST /v1/rollouts HTTP/1.1" 201' in log
    assert '"POST /v1/rollouts/batch HTTP/1.1" 207' in log
    # The tour reads and writes nothing beside the clone but its store.
    leftovers = {p.name for p in work.iterdir()} - {".venv", "examples"}
    # (-writer: the lock file tracestore's SQLite writers queue on, db/engine.py.)
    store_files = {
        "tracestore.db",
        "tracestore.db-wal",
        "tracestore.db-shm",
        "tracestore.db-writer",
    }
    assert leftovers <= store_files
