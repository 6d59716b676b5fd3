"""The inspector in a real browser: Playwright driving the system's Chromium
(scripts/ensure-chromium; no browser download) against a real `tracestore serve` over a
store holding the examples, a 1,200-step run and a cid shared by two runs.

A person searches by run id, cid and inference URL, follows the drift report to a run and
to its drifting step, pages a long run, opens JSON, signs in when keys are set. No page
logs a console error or a warning, fails a request, or asks anything of the network
outside the server. Each page's screenshot is kept under test-artifacts/inspector/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.conftest import Example
from tests.drift.helpers import created
from tests.reliability.harness import ServerProcess
from tests.web.conftest import (
    LONG_DRIFT_AT,
    LONG_STEPS,
    SHARED_CID_RUN,
    Console,
    Store,
    screenshot,
)

KEY = "browser-key-0123456789abcdef"


@pytest.fixture
def console(served: ServerProcess) -> Iterator[Console]:
    watched = Console(served.url)
    yield watched
    assert watched.problems == []


@pytest.fixture
def page(browser: Any, served: ServerProcess, console: Console) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = console.watch(context.new_page())
    opened.set_default_timeout(30_000)
    yield opened
    context.close()


def _reward_drift(examples: list[Example]) -> Example:
    return next(e for e in created(examples) if e.label["drift"] == ["reward_mismatch"])


def test_from_an_inference_url_to_the_drifting_step_in_two_interactions(
    page: Any, served: ServerProcess, examples: list[Example], backend: str
) -> None:
    drifted = _reward_drift(examples)
    url = drifted.doc["pipeline_metadata"]["inference_url"]
    log_line = f'2026-01-21 13:06:23 INFO httpx: HTTP Request: POST {url} "HTTP/1.1 200 OK"'
    page.goto(served.url + "/")
    screenshot(page, "home", backend)
    interactions = 0
    page.fill("#home-search input[name=q]", log_line)
    page.press("#home-search input[name=q]", "Enter")  # 1: paste and search
    interactions += 1
    page.wait_for_url(re.compile(r"/runs/"))
    assert page.inner_text("#run-id") == drifted.label["run_id"]
    assert page.inner_text("#run-cid") == drifted.label["correlation_id"]
    screenshot(page, "run", backend)
    page.click("#findings a.finding-step")  # 2: the finding's step
    interactions += 1
    page.wait_for_url(re.compile(r"step=\d+#step-\d+$"))
    position = int(urlsplit(page.url).fragment.removeprefix("step-"))
    step = page.locator(f"#step-{position}")
    assert step.is_visible()
    assert "drifted" in (step.get_attribute("class") or "")
    # Trajectory and trace side by side; the drifting field marked on its row.
    assert step.locator("table.sides thead").inner_text().split() == ["trajectory", "trace"]
    reward = step.locator("tr.differs[data-field=reward]")
    assert reward.count() == 1
    cells = reward.locator("td").all_inner_texts()
    assert len(cells) == 2
    assert cells[0] != cells[1]
    box = step.bounding_box()
    assert box is not None
    assert -1 <= box["y"] < 900  # scrolled to it
    screenshot(page, "drifting-step", backend)
    assert interactions <= 2


def test_search_by_run_id_and_cid(
    page: Any, served: ServerProcess, store: Store, examples: list[Example], backend: str
) -> None:
    ex = created(examples)[1]
    for query, expect in (
        (ex.label["run_id"], ex.label["run_id"]),
        (ex.label["correlation_id"], ex.label["run_id"]),
    ):
        page.goto(served.url + "/")
        page.fill("#home-search input[name=q]", query)
        page.press("#home-search input[name=q]", "Enter")
        page.wait_for_url(re.compile(r"/runs/"))
        assert page.inner_text("#run-id") == expect
    # A cid of two runs: the correlation page, each run a link.
    page.fill("header.top input[name=q]", store.shared_cid)
    page.press("header.top input[name=q]", "Enter")
    page.wait_for_url(re.compile(r"/correlations/"))
    rows = page.locator("table.runs tbody tr")
    assert rows.count() == 2
    assert SHARED_CID_RUN in rows.all_inner_texts()[0] + rows.all_inner_texts()[1]
    screenshot(page, "correlation", backend)
    page.click(f"text={SHARED_CID_RUN}")
    page.wait_for_url(re.compile(r"/runs/"))
    assert page.inner_text("#run-id") == SHARED_CID_RUN
    # Nothing: said so, with the box to try again.
    page.goto(served.url + "/search?q=trace_nobody_has_this")
    assert "trace_nobody_has_this" in page.inner_text("#not-found")


def test_drift_report_leads_to_the_run_and_its_drifting_step(
    page: Any, served: ServerProcess, backend: str
) -> None:
    page.goto(served.url + "/reports/drift")
    screenshot(page, "drift-report", backend)
    first_run = page.locator("td.run a").first
    run_id = first_run.inner_text()
    first_run.click()
    page.wait_for_url(re.compile(r"/runs/"))
    assert page.inner_text("#run-id") == run_id
    page.go_back()
    step_link = page.locator("a[href*='?step=']").first
    step_link.click()
    page.wait_for_url(re.compile(r"#step-\d+$"))
    position = urlsplit(page.url).fragment
    assert page.locator(f"#{position}").is_visible()
    assert page.locator(f"#{position} ul.findings li").count() >= 1
    # The migration status is linked from the pages.
    page.goto(served.url + "/")
    page.click("text=Migration status")
    page.wait_for_url(re.compile(r"/reports/drift#migration$"))
    assert page.locator("#migration").is_visible()


def test_a_long_run_is_paged_and_its_chart_leads_to_steps(
    page: Any, served: ServerProcess, store: Store, backend: str
) -> None:
    page.goto(f"{served.url}/runs/{store.long_run_id}")
    assert page.locator("article.step").count() == 25
    assert f"of {LONG_STEPS}" in page.inner_text("#pager-top")
    screenshot(page, "long-run", backend)
    # The chart: its bar holding the drifting step links to that step's page.
    bar = page.locator("svg.rewards a:has(rect.drift)")
    assert bar.count() == 1
    bar.click()
    page.wait_for_url(re.compile(r"step=\d+"))
    assert page.locator(f"#step-{LONG_DRIFT_AT}.drifted").count() == 1
    # Next page, then straight to a step by number.
    page.click("#pager-top a.next-page")
    page.wait_for_url(re.compile(r"offset=\d+"))
    offset = int(parse_qs(urlsplit(page.url).query)["offset"][0])
    assert page.locator("article.step").first.get_attribute("data-position") == str(offset)
    page.fill("#pager-top input[name=step]", "700")
    page.press("#pager-top input[name=step]", "Enter")
    page.wait_for_url(re.compile(r"step=700"))
    assert page.locator("#step-700").is_visible()
    # An observation opens as a collapsible JSON tree (the page's script).
    first = page.locator("#step-700 tr[data-field=obs] td").first
    first.locator("details.json > summary").click()
    tree = first.locator(".json-tree")
    tree.wait_for()
    assert "text" in tree.inner_text()
    # Expand all: every step's transcript opens.
    page.click("button.toggle-all")
    assert page.locator("details.transcript[open]").count() == 25
    screenshot(page, "long-run-step", backend)


def test_run_list_filters_and_pages(page: Any, served: ServerProcess, backend: str) -> None:
    page.goto(served.url + "/runs?limit=4")
    page.select_option("select[name=has_drift]", "yes")
    page.click("#filters button[type=submit]")
    page.wait_for_url(re.compile(r"has_drift=yes"))
    first = page.locator("table.runs tbody tr").all_inner_texts()
    assert len(first) == 4
    screenshot(page, "runs", backend)
    page.click("#next-page")
    page.wait_for_url(re.compile(r"cursor="))
    second = page.locator("table.runs tbody tr").all_inner_texts()
    assert second
    assert not set(first) & set(second)


def test_api_docs_render_offline(page: Any, served: ServerProcess, backend: str) -> None:
    page.goto(served.url + "/docs")
    page.locator(".swagger-ui .info .title").wait_for()
    assert "tracestore" in page.inner_text(".swagger-ui .info .title")
    screenshot(page, "docs", backend)
    page.goto(served.url + "/redoc")
    page.locator("h1:has-text('tracestore')").first.wait_for()
    screenshot(page, "redoc", backend)


@pytest.fixture(scope="module")
def keyed(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("browser-keyed") / "server.log"
    env = {"TRACESTORE_API_KEYS": f"person:{KEY}"}
    with ServerProcess(store.db.url, log, env=env) as server:
        yield server


def test_sign_in_with_a_key(browser: Any, keyed: ServerProcess, store: Store, backend: str) -> None:
    watched = Console(keyed.url)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = watched.watch(context.new_page())
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    target = f"{keyed.url}/runs/{store.long_run_id}?step=5"
    page.goto(target)
    page.wait_for_url(re.compile(r"/login\?next="))
    assert page.locator("#login-form").is_visible()
    screenshot(page, "login", backend)
    page.fill("#login-form input[name=key]", "not the key")
    page.press("#login-form input[name=key]", "Enter")
    page.locator("#login-error").wait_for()
    page.fill("#login-form input[name=key]", KEY)
    page.press("#login-form input[name=key]", "Enter")
    page.wait_for_url(re.compile(r"/runs/.*step=5"))
    assert page.inner_text("#run-id") == store.long_run_id
    session = next(c for c in context.cookies() if c["name"] == "tracestore_session")
    assert session["httpOnly"] is True
    assert session["sameSite"] == "Lax"
    assert not any(KEY in u for u in urls)  # the key never travelled in a URL
    # A link from the page to the API works signed in.
    page.goto(f"{keyed.url}/v1/rollouts/{store.long_run_id}/drift")
    assert store.long_run_id in page.content()
    page.goto(keyed.url + "/")
    page.click("form.signout button")
    page.wait_for_url(re.compile(r"/login\?next="))
    assert not [c for c in context.cookies() if c["name"] == "tracestore_session"]
    context.close()
    assert watched.problems == []
