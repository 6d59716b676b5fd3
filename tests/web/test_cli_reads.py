"""`tracestore show|cid|runs|drift` over the API (`--url`, TRACESTORE_URL) against a real
server, the same answers as `--db`; cid takes a pasted URL; ids are never cut."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson

from tests.conftest import Example
from tests.drift.helpers import created
from tests.reliability.harness import ServerProcess
from tests.web.conftest import SHARED_CID_RUN, Store

TRACESTORE = str(Path(sys.executable).with_name("tracestore"))


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRACESTORE_")}
    clean.pop("COLUMNS", None)
    return subprocess.run(
        [TRACESTORE, *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=300,
        check=False,
    )


def test_show_over_the_api_prints_the_bytes_received(
    served: ServerProcess, store: Store, examples: list[Example]
) -> None:
    ex = created(examples)[3]
    for args in (["--url", served.url], ["--db", store.db.url]):
        shown = run("show", ex.label["run_id"], *args, "--json")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.rstrip("\n").encode() == ex.raw
    # TRACESTORE_URL names the server when neither option is given.
    by_env = run("show", ex.label["run_id"], "--raw", TRACESTORE_URL=served.url)
    assert by_env.returncode == 0, by_env.stderr
    assert orjson.loads(by_env.stdout) == ex.doc
    missing = run("show", "no-such-run", "--url", served.url)
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1
    assert "no rollout with run_id 'no-such-run'" in missing.stderr
    both = run("show", "x", "--url", served.url, "--db", store.db.url)
    assert both.returncode == 2
    assert "not both" in both.stderr
    down = run("show", "x", "--url", "http://127.0.0.1:1")
    assert down.returncode == 2
    assert "cannot reach http://127.0.0.1:1" in down.stderr


def test_cid_takes_a_pasted_url_and_answers_like_the_database(
    served: ServerProcess, store: Store, examples: list[Example]
) -> None:
    malformed = next(e for e in created(examples) if e.label.get("url_style") == "malformed")
    url = malformed.doc["trajectories"][0]["inference_url"]
    cid = malformed.label["correlation_id"]
    answers = []
    for value in (cid, url, f"POST {url} 200", cid + "/v1/chat/completions"):
        for args in (["--url", served.url], ["--db", store.db.url]):
            listed = run("cid", value, *args, "--json")
            assert listed.returncode == 0, (value, listed.stderr)
            body = json.loads(listed.stdout)
            answers.append([r["run_id"] for r in body["runs"]])
    assert answers == [[malformed.label["run_id"]]] * len(answers)
    shared = run("cid", store.shared_cid, "--url", served.url, "--json")
    assert {r["run_id"] for r in json.loads(shared.stdout)["runs"]} == {
        SHARED_CID_RUN,
        "run-1001-00003-626fda73",
    }


def test_wide_tables_keep_every_id_whole(served: ServerProcess, store: Store) -> None:
    narrow = run("cid", store.shared_cid, "--url", served.url, COLUMNS="60")
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    # One block per run, a line per field: each id whole on its line.
    assert any(line.split() == ["run_id", SHARED_CID_RUN] for line in lines)
    assert any(line.split() == ["cid", store.shared_cid] for line in lines)
    wide = run("cid", store.shared_cid, "--url", served.url, COLUMNS="400")
    assert SHARED_CID_RUN in wide.stdout
    assert "┃ run_id" in wide.stdout  # a table when it fits


def test_runs_lists_with_filters_and_pages(
    served: ServerProcess, store: Store, examples: list[Example]
) -> None:
    made = created(examples)
    drifting = {e.label["run_id"] for e in made if e.label["drift"]} | {store.long_run_id}
    for args in (["--url", served.url], ["--db", store.db.url]):
        page = run("runs", "--has-drift", "--limit", "2", *args, "--json")
        assert page.returncode == 0, page.stderr
        first = json.loads(page.stdout)
        assert len(first["items"]) == 2
        assert first["next_cursor"]
        every = run("runs", "--has-drift", "--limit", "3", "--all", *args, "--json")
        assert {r["run_id"] for r in json.loads(every.stdout)["items"]} == drifting
        trace_only = run("runs", "--no-trajectories", "--trace-kind", "full", *args, "--json")
        assert {r["run_id"] for r in json.loads(trace_only.stdout)["items"]} == {
            e.label["run_id"] for e in made if e.label["kind"] == "trace_only"
        }
    table = run("runs", "--limit", "2", "--url", served.url)
    assert table.returncode == 0, table.stderr
    assert "more: --cursor" in table.stdout
    bad = run("runs", "--since", "soonish", "--url", served.url)
    assert bad.returncode == 2


def test_drift_over_the_api_is_the_same_report(served: ServerProcess, store: Store) -> None:
    remote = run("drift", "--url", served.url, "--json", "--days", "3650")
    local = run("drift", "--db", store.db.url, "--format", "json", "--days", "3650")
    assert remote.returncode == local.returncode == 0, remote.stderr + local.stderr
    a, b = json.loads(remote.stdout), json.loads(local.stdout)
    for body in (a, b):
        # Each side's clock made its window.
        body.pop("generated_at")
        body["status"].pop("window")
        body["summary"].pop("filters")
    assert a["summary"] == b["summary"]
    assert a["worst_runs"] == b["worst_runs"]
    gate = run("drift", "--url", served.url, "--fail-above", "0.01")
    assert gate.returncode == 1
    refused = run("drift", "--url", served.url, "--recompute")
    assert refused.returncode == 2
    assert "--db" in refused.stderr
