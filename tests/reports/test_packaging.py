"""The report SQL ships in the wheel, so `tracestore report` works from an install."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tracestore.reports.catalog import list_reports

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_every_report_and_the_views(tmp_path: Path) -> None:
    if importlib.util.find_spec("hatchling") is None:
        pytest.skip("hatchling (a dev dependency) is not installed")
    done = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "tracestore/reports/views.sql" in names
    for report in list_reports():
        assert f"tracestore/reports/sql/{report.name}.sql" in names
