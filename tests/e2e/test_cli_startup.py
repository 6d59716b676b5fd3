"""`tracestore --help` starts fast (issue 13): the CLI module and the help of every verb
load none of the heavy libraries; verbs import them when they run. A behaviour test, in
a fresh interpreter; the timing itself is in bench/cli_startup.py."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("duckdb", "pyarrow", "sqlalchemy", "fastapi", "uvicorn", "matplotlib")

PROBE = """
import json, sys
from typer.testing import CliRunner
from tracestore.cli.main import app

helps = [[], ["ingest"], ["report"], ["sql"], ["export"], ["drift"], ["show"], ["db", "upgrade"],
         ["convert", "to-trace"]]
codes = [CliRunner().invoke(app, [*verb, "--help"]).exit_code for verb in helps]
heavy = %r
print(json.dumps({"codes": codes, "loaded": [m for m in heavy if m in sys.modules]}))
"""


def test_help_loads_no_heavy_library() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(seen["codes"]) == {0}, seen
    assert seen["loaded"] == [], seen
