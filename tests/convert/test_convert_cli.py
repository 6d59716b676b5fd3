"""`tracestore convert`: files in, converted files out, through the real console script."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLES, Example

TRACESTORE = str(Path(sys.executable).parent / "tracestore")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TRACESTORE, *args], capture_output=True, text=True, check=False)


def test_to_trace_then_back_gives_the_trajectories(tmp_path: Path, examples: list[Example]) -> None:
    traced = tmp_path / "traced.jsonl.gz"
    losses = tmp_path / "losses.jsonl"
    done = _run(
        "convert",
        "to-trace",
        str(EXAMPLES / "rollouts.jsonl"),
        "-o",
        str(traced),
        "--losses",
        str(losses),
        "--replace",
    )
    assert done.returncode == 0, done.stderr
    # Trace-only rollouts have no steps to make a trace of: their own trace is kept.
    with_steps = [ex for ex in examples if any(t["steps"] for t in ex.doc["trajectories"])]
    assert f"{len(with_steps)} converted" in done.stderr
    assert f"{len(examples) - len(with_steps)} kept as sent" in done.stderr
    lines = gzip.decompress(traced.read_bytes()).splitlines()
    assert len(lines) == len(examples) == len(losses.read_text().splitlines())
    back = tmp_path / "back.jsonl"
    done = _run("convert", "to-trajectories", str(traced), "-o", str(back), "--replace")
    assert done.returncode == 0, done.stderr
    for ex, line in zip(examples, back.read_text().splitlines(), strict=True):
        if ex.doc["trajectories"]:
            # The round-trip law through files: every legacy field comes back exactly.
            assert json.loads(line)["trajectories"] == ex.doc["trajectories"], ex.label["run_id"]


def test_to_stdout_and_invalid_lines(tmp_path: Path, examples: list[Example]) -> None:
    source = tmp_path / "mixed.jsonl"
    source.write_bytes(examples[0].raw + b"\nnot json\n" + b'{"run_id": ""}\n')
    done = _run("convert", "to-trace", str(source))
    assert done.returncode == 2
    out = done.stdout.splitlines()
    assert len(out) == 1
    assert json.loads(out[0])["run_id"] == examples[0].label["run_id"]
    # The example has a trace: kept as sent, and the summary says how to replace it.
    assert "0 converted" in done.stderr
    assert "1 kept as sent" in done.stderr
    assert "--replace" in done.stderr
    assert "2 invalid" in done.stderr
    assert f"{source}:2" in done.stderr


def test_by_default_only_missing_parts_are_filled(tmp_path: Path, examples: list[Example]) -> None:
    out = tmp_path / "out.jsonl"
    done = _run("convert", "to-trace", str(EXAMPLES / "rollouts.jsonl"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    missing = [ex for ex in examples if ex.doc.get("trace") in (None, {})]
    assert missing
    assert f"{len(missing)} converted" in done.stderr
    assert f"{len(examples) - len(missing)} kept as sent" in done.stderr
    for ex, line in zip(examples, out.read_text().splitlines(), strict=True):
        written = json.loads(line)
        if ex in missing:
            assert written["trace"]["session_time_steps"], ex.label["run_id"]
            assert written["trace"]["created_at"] is not None  # the file's time
        else:
            assert written == ex.doc  # what the producer sent, untouched


def test_help() -> None:
    for args in (["convert", "--help"], ["convert", "to-trace", "--help"], ["backfill", "--help"]):
        done = _run(*args)
        assert done.returncode == 0
        assert "Usage" in done.stdout


def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path: Path) -> None:
    # `-o` the input file opened it for writing, emptying it, before a line was read: the
    # 66 examples were gone and the command said "0 converted", exit 0.
    source = tmp_path / "r.jsonl"
    source.write_bytes((EXAMPLES / "rollouts.jsonl").read_bytes())
    before = source.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(source)
    for options, named in (
        (["-o", str(source)], "-o"),
        (["-o", str(tmp_path / "link.jsonl")], "-o"),  # the same file by another name
        (["-o", str(tmp_path / "x.jsonl"), "--losses", str(source)], "--losses"),
    ):
        done = _run("convert", "to-trace", str(source), *options)
        assert done.returncode == 2, (options, done.stderr)
        assert done.stderr.startswith(f"error: {named} "), done.stderr
        assert "is the input file" in done.stderr
        assert source.read_bytes() == before
    both = tmp_path / "both.jsonl"
    done = _run("convert", "to-trace", str(source), "-o", str(both), "--losses", str(both))
    assert done.returncode == 2
    assert "name the same file" in done.stderr
    assert not both.exists()
