"""The inspector's templates and static files ship in the wheel, and its dependencies are
declared: the pages and /docs work from an install, offline."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tracestore.api.pages.render import STATIC, TEMPLATES

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_every_template_and_asset(tmp_path: Path) -> None:
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
    shipped = [*TEMPLATES.glob("*.html"), *STATIC.iterdir()]
    assert len(shipped) >= 10
    for path in shipped:
        assert f"tracestore/api/pages/{path.parent.name}/{path.name}" in names


def test_the_runtime_dependencies_are_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("[")[0] for d in project["dependencies"]}
    assert {"jinja2", "fastapi-offline"} <= names
    dev = {d.split(">")[0] for d in project["optional-dependencies"]["dev"]}
    assert "playwright" in dev
