"""Where things are: the URL of each page and API answer the inspector links to.

Run ids and cids are any text ('/', '?', '#', spaces, line breaks): each goes into its URL
as one escaped path segment.
"""

from __future__ import annotations

from urllib.parse import urlencode

from tracestore.client import path_segment

STEP_ANCHOR = "step-{}"


def run_href(run_id: str, step: int | None = None) -> str:
    """The run page; with `step`, the page holding that step, scrolled to it."""
    base = "/runs/" + path_segment(run_id)
    if step is None:
        return base
    return f"{base}?{urlencode({'step': step})}#{STEP_ANCHOR.format(step)}"


def run_page_href(run_id: str, offset: int, limit: int, default_limit: int) -> str:
    """One page of the run's steps."""
    query: dict[str, int] = {"offset": offset} if offset else {}
    if limit != default_limit:
        query["limit"] = limit
    base = "/runs/" + path_segment(run_id)
    return f"{base}?{urlencode(query)}#steps" if query else f"{base}#steps"


def cid_href(cid: str) -> str:
    """The correlation page: every run of a cid."""
    return "/correlations/" + path_segment(cid)


def api_run_href(run_id: str, suffix: str = "") -> str:
    """A /v1 answer about the run: the document, or `/trace`, `/trajectories`, `/drift`."""
    return "/v1/rollouts/" + path_segment(run_id) + suffix


def panel_href(run_id: str, panel: str, **query: int) -> str:
    """The JSON of one panel of the run page (GET /v1/inspect/{run_id})."""
    params = urlencode({"panel": panel, **query})
    return f"/v1/inspect/{path_segment(run_id)}?{params}"


def search_href(query: str) -> str:
    """The search for `query`."""
    return "/search?" + urlencode({"q": query})


def api_cid_href(cid: str) -> str:
    """GET /v1/correlations/{cid}: the runs of a cid, as JSON."""
    return "/v1/correlations/" + path_segment(cid)
