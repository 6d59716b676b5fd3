"""The drift report opened in a real headless Chromium: it renders, shows the headline
figures and its charts; a screenshot is saved under test-artifacts/.

Chromium is Debian's `chromium` package (scripts/ensure-chromium installs it). Without it
the tests are skipped locally, and fail in CI (CI=true).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from tests.conftest import Database, Example, LiveServer
from tests.drift.helpers import ingest_examples, label_figures
from tracestore.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("TRACESTORE_CHROMIUM", "/usr/bin/chromium")
TRACESTORE = shutil.which("tracestore", path=str(Path(sys.executable).parent)) or "tracestore"
# The bar colour of drift above the budget (tracestore/drift/report.py _RED).
DRIFT_RED = (0xC0, 0x39, 0x2B)


def chromium() -> str:
    """The Chromium binary; skip (or, in CI, fail) with the fix when it is missing."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    message = (
        f"Chromium not found at {CHROMIUM}: run scripts/ensure-chromium "
        "(apt-get install chromium) or set TRACESTORE_CHROMIUM"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def headless(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on `url` with a throwaway profile and no background traffic."""
    done = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


class _Figures(HTMLParser):
    """Collects headline figures (data-figure) and the <svg> inside each chart <figure>."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, str] = {}
        self.charts: dict[str, int] = {}
        self.texts: list[str] = []
        self._figure: str | None = None
        self._chart: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("data-figure"):
            self._figure = a["data-figure"]
        chart = a.get("id")
        if tag == "figure" and chart:
            self._chart = chart
            self.charts[chart] = 0
        if tag == "svg" and self._chart is not None:
            self.charts[self._chart] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._chart = None

    def handle_data(self, data: str) -> None:
        if self._figure is not None and data.strip():
            self.figures[self._figure] = data.strip()
            self._figure = None
        if self._chart is not None and data.strip():
            self.texts.append(data.strip())


def _check_dom(dom: str, examples: list[Example]) -> None:
    expected = label_figures(examples)
    parsed = _Figures()
    parsed.feed(dom)
    assert parsed.figures == {
        "runs": str(expected["runs"]),
        "comparable_runs": str(expected["comparable_runs"]),
        "runs_with_drift": str(expected["comparable_runs_with_drift"]),
        "drift_rate": f"{expected['drift_rate']:.2%}",
        "safe_through_phase": "0",
    }
    assert parsed.charts == {"chart-rate-per-day": 1, "chart-kinds": 1}
    # The kinds chart labels its bars; text stays text in the inline SVG.
    assert {"reward_mismatch", "correlation_conflict"} <= set(parsed.texts)
    assert "Migration gates" in dom
    assert "not ready" in dom


def _red_pixels(png: Path) -> int:
    from matplotlib.image import imread

    pixels = (imread(str(png))[:, :, :3] * 255).round()
    close = (abs(pixels - DRIFT_RED) <= 6).all(axis=2)
    return int(close.sum())


def test_served_report_renders_in_chromium(
    database: Database, engine: Engine, examples: list[Example], backend: str, tmp_path: Path
) -> None:
    ingest_examples(engine, examples)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"drift-report-{backend}.png"
    shot.unlink(missing_ok=True)
    with LiveServer(Settings(database_url=database.url)) as live:
        url = f"{live.url}/reports/drift"
        assert httpx.get(url).headers["content-type"].startswith("text/html")
        dom = headless(url, tmp_path / "profile", "--dump-dom").stdout
        headless(url, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,1600")
    _check_dom(dom, examples)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The drift bars (red: above the budget) are drawn: the charts rendered, not only text.
    assert _red_pixels(shot) > 500


def test_cli_html_file_is_self_contained(
    database: Database, engine: Engine, examples: list[Example], tmp_path: Path
) -> None:
    ingest_examples(engine, examples)
    out = tmp_path / "drift.html"
    done = subprocess.run(
        [TRACESTORE, "drift", "--db", database.url, "--format", "html", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    # Nothing to fetch: no scripts, stylesheets, images or fonts; the only references are
    # the inline SVGs' own fragments (clip paths, reused markers).
    assert not re.search(r"<script|<link|<img|<iframe|@import|src\s*=", html, re.IGNORECASE)
    references = re.findall(r'url\(([^)]*)\)|href="([^"]*)"', html)
    assert references
    assert all((a or b).startswith("#") for a, b in references)
    dom = headless(out.as_uri(), tmp_path / "profile", "--dump-dom").stdout
    _check_dom(dom, examples)
