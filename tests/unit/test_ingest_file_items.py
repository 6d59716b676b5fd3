"""Rollout files: the items of a JSON array are kept as the file spells them (issue 13),
and a repeated key refuses its own document only (issue 18)."""

from __future__ import annotations

from pathlib import Path

from tracestore.errors import InvalidJSON, InvalidRollout
from tracestore.ingest.files import iter_file

SPACED = b'{ "run_id" : "a", "x": [123456789012345678901234567891, 1e-400, 1.50] }'
REPEATED = b'{"run_id": "b", "x": {"k": 1, "k": 2}}'
PLAIN = b'{"run_id":"c"}'


def test_array_items_are_the_files_bytes(tmp_path: Path) -> None:
    path = tmp_path / "batch.json"
    path.write_bytes(b"[\n  " + b",\n  ".join([SPACED, REPEATED, PLAIN]) + b"\n]\n")
    items = list(iter_file(path))
    # Before: each item was re-serialized (1.2345678901234568e+29, 0.0, 1.5, no spaces).
    assert [i.raw for i in items] == [SPACED, REPEATED, PLAIN]
    assert [i.where for i in items] == [f"{path}[0]", f"{path}[1]", f"{path}[2]"]
    assert items[0].value["run_id"] == "a"
    assert isinstance(items[1].value, InvalidRollout)
    assert items[1].value.details["key"] == "k"
    assert items[2].value == {"run_id": "c"}


def test_lines_and_single_documents_refuse_repeated_keys_alone(tmp_path: Path) -> None:
    lines = tmp_path / "batch.jsonl"
    lines.write_bytes(REPEATED + b"\n" + PLAIN + b"\n{broken\n")
    values = [i.value for i in iter_file(lines)]
    assert isinstance(values[0], InvalidRollout)
    assert values[1] == {"run_id": "c"}
    assert isinstance(values[2], InvalidJSON)
    single = tmp_path / "one.json"
    single.write_bytes(REPEATED)
    (item,) = iter_file(single)
    assert isinstance(item.value, InvalidRollout)


def test_a_broken_array_is_one_invalid_document(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_bytes(b"[" + PLAIN + b",")
    (item,) = iter_file(path)
    assert isinstance(item.value, InvalidJSON)
