"""The inspector's pages over HTTP, against a real `tracestore serve` (no browser here):
what each page answers, its JSON, the drift report's links, the offline docs, and sign-in
with API keys (cookie flags, CSRF, what the cookie may and may not do).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

import httpx
import pytest

from tests.conftest import Example
from tests.drift.helpers import created
from tests.reliability.harness import ServerProcess
from tests.web.conftest import LONG_DRIFT_AT, LONG_STEPS, SHARED_CID_RUN, Store
from tracestore.api.pages.session import SESSION_COOKIE, issue_token, token_client
from tracestore.client import path_segment
from tracestore.settings import ApiClient

KEY = "inspector-key-0123456789abcdef"
KEYS = f"alice:{KEY},bob:other-key-abcdef0123456789"


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("href"):
            self.hrefs.append(str(a["href"]))
        if a.get("src"):
            self.sources.append(str(a["src"]))


def links_of(html: str) -> _Links:
    parsed = _Links()
    parsed.feed(html)
    return parsed


@pytest.fixture(scope="module")
def http(served: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=60) as client:
        yield client


def test_home_is_a_page_with_the_search_box_and_figures(http: httpx.Client) -> None:
    home = http.get("/")
    assert home.status_code == 200
    assert home.headers["content-type"].startswith("text/html")
    assert 'action="/search"' in home.text
    assert 'data-figure="runs"' in home.text
    # A page holds store data: never cached by a shared cache, and only our own scripts.
    assert home.headers["cache-control"] == "no-store"
    assert "script-src 'self'" in home.headers["content-security-policy"]
    assert "<script>" not in home.text
    # Everything it loads comes from this server.
    assert all(s.startswith("/") for s in links_of(home.text).sources)


def test_search_leads_to_the_run_or_the_runs_of_a_cid(
    http: httpx.Client, examples: list[Example], store: Store
) -> None:
    malformed = next(e for e in created(examples) if e.label.get("url_style") == "malformed")
    url = malformed.doc["trajectories"][0]["inference_url"]
    run_page = "/runs/" + path_segment(malformed.label["run_id"])
    for query in (malformed.label["run_id"], malformed.label["correlation_id"], url):
        answer = http.get("/search", params={"q": query})
        assert answer.status_code == 303, query
        assert answer.headers["location"] == run_page
    shared = http.get("/search", params={"q": store.shared_cid})
    assert shared.headers["location"] == "/correlations/" + store.shared_cid
    page = http.get(shared.headers["location"])
    assert SHARED_CID_RUN in page.text
    missing = http.get("/search", params={"q": "trace_nobody_has_this"})
    assert missing.status_code == 200
    assert 'id="not-found"' in missing.text
    assert "trace_nobody_has_this" in missing.text


def test_run_page_and_the_json_of_its_panels(http: httpx.Client, store: Store) -> None:
    run_id = store.long_run_id
    page = http.get(f"/runs/{run_id}", params={"step": LONG_DRIFT_AT})
    assert page.status_code == 200
    assert f'id="step-{LONG_DRIFT_AT}"' in page.text
    hrefs = links_of(page.text).hrefs
    for wanted in (
        f"/v1/rollouts/{run_id}",
        f"/v1/rollouts/{run_id}/trace",
        f"/v1/rollouts/{run_id}/trajectories",
        f"/v1/rollouts/{run_id}/drift",
    ):
        assert wanted in hrefs
    panels = {urlsplit(h).query.split("&")[0] for h in hrefs if h.startswith("/v1/inspect/")}
    assert {"panel=header", "panel=rewards", "panel=parts", "panel=steps", "panel=all"} <= panels
    for href in hrefs:
        if href.startswith("/v1/"):
            answer = http.get(href)
            assert answer.status_code == 200, href
            assert answer.headers["content-type"].startswith("application/json"), href
    steps = http.get(f"/v1/inspect/{run_id}", params={"panel": "steps", "step": LONG_DRIFT_AT})
    body = steps.json()
    assert body["header"] is None
    assert body["steps"]["total"] == LONG_STEPS
    row = next(r for r in body["steps"]["items"] if r["position"] == LONG_DRIFT_AT)
    assert row["fields"] == ["reward"]
    assert http.get("/v1/inspect/no-such-run").status_code == 404
    assert http.get(f"/v1/inspect/{run_id}", params={"panel": "nope"}).status_code == 422
    missing = http.get("/runs/no-such-run")
    assert missing.status_code == 404
    assert "no rollout with run_id" in missing.text


def test_odd_run_ids_are_linked_whole(http: httpx.Client, served: ServerProcess) -> None:
    odd = "odd/run id?#100%"
    doc = {
        "run_id": odd,
        "trajectories": [{"steps": [{"obs": 1, "reward": 1.0, "done": True}]}],
        "metrics": {"episode_returns": [1.0], "mean_return": 1.0, "num_steps": 1},
    }
    assert http.post("/v1/rollouts", json=doc).status_code in (200, 201)
    runs = http.get("/runs", params={"limit": 5})
    href = "/runs/" + path_segment(odd)
    assert href in links_of(runs.text).hrefs
    page = http.get(href)
    assert page.status_code == 200
    assert odd in page.text.replace("&amp;", "&").replace("&#34;", '"')
    assert unquote(href.removeprefix("/runs/")) == odd


def test_run_list_filters_and_pages(http: httpx.Client, examples: list[Example]) -> None:
    made = created(examples)
    drifted = http.get("/runs", params={"has_drift": "yes", "limit": 3})
    assert drifted.status_code == 200
    seen: list[str] = []
    page = drifted
    while True:
        hrefs = links_of(page.text).hrefs
        seen += [
            unquote(h.removeprefix("/runs/")) for h in hrefs if re.fullmatch(r"/runs/[^?#]+", h)
        ]
        nxt = re.search(r'href="(/runs\?[^"]*cursor=[^"]*)"', page.text)
        if nxt is None:
            break
        page = http.get(nxt.group(1).replace("&amp;", "&"))
    drifting = {e.label["run_id"] for e in made if e.label["drift"]} | {"long-1200-12"}
    assert set(seen) == drifting
    bad = http.get("/runs", params={"since": "yesterday-ish"})
    assert bad.status_code == 422
    assert "since" in bad.text
    # Parameters the framework checks were answered with the API's JSON (exploratory QA):
    # a page, like the one above; the API's routes keep their JSON.
    for path, params in [
        ("/runs", {"limit": "abc"}),
        (f"/runs/{path_segment(SHARED_CID_RUN)}", {"step": "-1"}),
        (f"/runs/{path_segment(SHARED_CID_RUN)}", {"offset": str(10**30)}),
    ]:
        page = http.get(path, params=params)
        assert page.status_code == 422, (path, params)
        assert page.headers["content-type"].startswith("text/html"), (path, params)
        # The problem named as the framework names it ("step" alone is on every page).
        assert f"query.{next(iter(params))}" in page.text, (path, params)
    api = http.get("/v1/rollouts", params={"limit": "abc"})
    assert api.status_code == 422
    assert api.json()["error"]["code"] == "invalid_request"
    # Empty form fields are no filter.
    assert http.get("/runs", params={"env_id": "", "has_drift": ""}).status_code == 200


def test_drift_report_links_runs_and_steps(http: httpx.Client, examples: list[Example]) -> None:
    report = http.get("/reports/drift")
    assert report.status_code == 200
    hrefs = links_of(report.text).hrefs
    drifting = {e.label["run_id"] for e in created(examples) if e.label["drift"]}
    linked = {
        unquote(urlsplit(h).path.removeprefix("/runs/")) for h in hrefs if h.startswith("/runs/")
    }
    assert drifting <= linked | {"long-1200-12"}
    step_links = [h for h in hrefs if "?step=" in h]
    assert step_links
    for href in step_links[:3]:
        target = http.get(href)
        assert target.status_code == 200
        assert f'id="{urlsplit(href).fragment}"' in target.text
    assert "#migration" in hrefs
    assert 'id="migration"' in report.text


def test_drift_report_json_is_the_report(http: httpx.Client) -> None:
    body = http.get("/v1/drift/report").json()
    assert set(body) >= {"summary", "worst_runs", "status", "generated_at"}
    assert body["summary"]["runs"] >= 60
    assert http.get("/v1/drift/report", params={"kind": "nope"}).status_code == 422


def test_docs_work_offline(http: httpx.Client) -> None:
    for path in ("/docs", "/redoc"):
        page = http.get(path)
        assert page.status_code == 200
        # Every asset is this server's: no CDN, no web font.
        assert not re.search(r"https?://", re.sub(r"<!--.*?-->", "", page.text, flags=re.S))
        for asset in re.findall(r'(?:src|href)="(/static/docs/[^"]+)"', page.text):
            assert http.get(asset).status_code == 200, asset
    bundle = http.get("/static/docs/redoc.standalone.js")
    assert bundle.status_code == 200
    assert b"cdn.redoc.ly" not in bundle.content
    assert http.get("/openapi.json").json()["paths"]["/v1/inspect/{run_id}"]


# --- API keys -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("keyed") / "server.log"
    with ServerProcess(store.db.url, log, env={"TRACESTORE_API_KEYS": KEYS}) as server:
        yield server


def _csrf(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
    assert found is not None
    return found.group(1)


def test_pages_need_a_key_and_sign_in_sets_a_session_cookie(
    keyed: ServerProcess, store: Store
) -> None:
    with httpx.Client(base_url=keyed.url, timeout=60) as client:
        for path in ("/", "/runs", f"/runs/{store.long_run_id}", "/search?q=x"):
            locked = client.get(path)
            assert locked.status_code == 401, path
            assert 'id="login-form"' in locked.text
            # No store data; the path asked for comes back only as where to go after sign-in.
            assert "data-figure" not in locked.text
            assert 'id="step-0"' not in locked.text
        # A browser going to a page is sent on to the sign-in page (a 200 there).
        browser = client.get("/runs?limit=3", headers={"Sec-Fetch-Mode": "navigate"})
        assert browser.status_code == 303
        assert browser.headers["location"] == "/login?next=%2Fruns%3Flimit%3D3"
        # The docs stay open; the API and the report need a key.
        assert client.get("/docs").status_code == 200
        assert client.get(f"/v1/inspect/{store.long_run_id}").status_code == 401
        form = client.get("/login", params={"next": "/runs"})
        assert form.status_code == 200
        wrong = client.post(
            "/login", data={"csrf": _csrf(form), "key": "not-the-key", "next": "/runs"}
        )
        assert wrong.status_code == 303
        assert wrong.headers["location"] == "/login?next=%2Fruns&failed=1"
        assert SESSION_COOKIE not in wrong.headers.get("set-cookie", "")
        assert "That key is not valid" in client.get(wrong.headers["location"]).text
        signed = client.post("/login", data={"csrf": _csrf(form), "key": KEY, "next": "/runs"})
        assert signed.status_code == 303
        assert signed.headers["location"] == "/runs"
        cookie = signed.headers["set-cookie"]
        assert cookie.startswith(f"{SESSION_COOKIE}=alice:")
        assert "HttpOnly" in cookie
        assert "samesite=lax" in cookie.lower()
        assert KEY not in cookie
        assert KEY not in signed.headers["location"]
        assert client.get("/runs").status_code == 200
        assert client.get(f"/runs/{store.long_run_id}").status_code == 200
        # The cookie reads the API (links from the pages)...
        assert client.get(f"/v1/rollouts/{store.long_run_id}/drift").status_code == 200
        assert client.get("/reports/drift").status_code == 200
        # ...but never writes: a cross-site form could otherwise post with it.
        doc = {"run_id": "via-cookie", "trajectories": [], "metrics": {}}
        assert client.post("/v1/rollouts", json=doc).status_code == 401
        page = client.get("/")
        out = client.post("/logout", data={"csrf": _csrf(page)})
        assert out.status_code == 303
        assert client.get("/runs").status_code == 401


def test_sign_in_and_out_refuse_forged_forms(keyed: ServerProcess) -> None:
    with httpx.Client(base_url=keyed.url, timeout=60) as client:
        form = client.get("/login")
        token = _csrf(form)
        # Without the browser's CSRF cookie, or with another token: refused.
        bare = httpx.post(keyed.url + "/login", data={"csrf": token, "key": KEY})
        assert bare.status_code == 403
        other = client.post("/login", data={"csrf": "0" * 64, "key": KEY})
        assert other.status_code == 403
        # From another site, even with the right token.
        cross = client.post(
            "/login",
            data={"csrf": token, "key": KEY},
            headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        )
        assert cross.status_code == 403
        assert SESSION_COOKIE not in cross.headers.get("set-cookie", "")
        # After sign-in, `next` never leads off the site.
        away = client.post("/login", data={"csrf": token, "key": KEY, "next": "//evil.example/"})
        assert away.headers["location"] == "/"


def test_session_tokens_expire_and_die_with_their_key() -> None:
    alice = ApiClient("alice", KEY)
    now = time.time()
    token = issue_token(alice, now)
    assert token_client(token, [alice], now) == "alice"
    assert token_client(token, [ApiClient("alice", "rotated-key")], now) is None
    assert token_client(token, [alice], now + 13 * 3600) is None
    name, expires, mac = token.split(":")
    assert token_client(f"{name}:{int(expires) + 3600}:{mac}", [alice], now) is None
    assert token_client(f"bob:{expires}:{mac}", [alice, ApiClient("bob", "b")], now) is None
    assert token_client("garbage", [alice], now) is None


def test_page_views_are_not_legacy_reads(keyed: ServerProcess, store: Store) -> None:
    headers = {"X-API-Key": KEY}
    run = "run-1001-00003-626fda73"  # it has trajectories: reading it raw is a legacy read
    with httpx.Client(base_url=keyed.url, timeout=60, headers=headers) as client:

        def readers() -> list[dict[str, object]]:
            status = client.get("/v1/migration/status").json()
            found: list[dict[str, object]] = next(p for p in status["phases"] if p["phase"] == 3)[
                "figures"
            ]["readers"]
            return found

        before = readers()
        for path in (
            f"/runs/{run}",
            f"/runs/{run}?step=2",
            "/",
            f"/correlations/{store.shared_cid}",
        ):
            assert client.get(path).status_code == 200
        assert readers() == before
        # A browser following the page's link to the trajectories is a person looking.
        client.get(
            f"/v1/rollouts/{run}/trajectories", headers={"Sec-Fetch-Mode": "navigate"}
        ).raise_for_status()
        after = readers()
        assert [r for r in after if r["client"] == "alice"] == [
            r for r in before if r["client"] == "alice"
        ]
