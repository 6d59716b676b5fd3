"""Correlation id (cid) resolution, SPEC §4: pure functions over a parsed RolloutResponse."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from tracestore.jsontext import member as _get

CorrelationSource = Literal[
    "top_level",
    "pipeline_metadata",
    "trajectory",
    "inference_url",
    "pipeline_metadata_url",
    "step_inference_url",
]
# Resolution order of SPEC §4 (1 to 6).
SOURCES: tuple[CorrelationSource, ...] = (
    "top_level",
    "pipeline_metadata",
    "trajectory",
    "inference_url",
    "pipeline_metadata_url",
    "step_inference_url",
)
URL_PARAMS = ("cid", "trace_correlation_id", "trace")


def clean_cid(value: object) -> str | None:
    """Return `value` when it is a usable id: a string that is not empty or whitespace."""
    if isinstance(value, str) and value.strip():
        return value
    return None


def cid_from_url(url: object) -> str | None:
    """Extract the cid from an inference URL's query (`cid`, `trace_correlation_id`, `trace`).

    Repairs the malformed form seen in the wild, `https://host?cid=trace_abc/v1/chat`: the
    path ended up in the query, so the value stops at the first `/`.
    """
    if not isinstance(url, str) or "?" not in url:
        return None
    return _cid_in_query(url)


# Log lines quote URLs in these; they are no part of the URL.
_QUOTES = "\"'<>()[]{},;`"


def cid_in_text(text: str) -> str | None:
    """The cid an inference URL in `text` names (the rules above), or None.

    `text` is what a person pastes: the URL alone, or a log line holding it among other
    words (quotes and brackets around it are not part of it).
    """
    whole = text.strip()
    # A URL holds no whitespace: in a line that does, only its words can be the URL (the
    # whole line read as one gave `trace_x HTTP` for `...?cid=trace_x HTTP/1.1" 200`).
    candidates = text.split() if any(c.isspace() for c in whole) else [whole]
    for candidate in candidates:
        candidate = candidate.strip(_QUOTES)
        if "?" in candidate:
            cid = cid_from_url(candidate)
            if cid is not None:
                return cid
    return None


def lookup_forms(cid: str) -> list[str]:
    """The ids a look-up by `cid` tries, in order: `cid`, then the id it names in a URL.

    synth-ai's own extractor (`extract_trace_correlation_id`) keeps the path that a
    malformed URL put in the query (`?cid=trace_x/v1/chat/completions` gives
    `trace_x/v1/chat/completions`), and debuggers copy the id the SDK logged; tracestore
    stores what the value names before the `/` (`trace_x`), so that is tried next.
    """
    forms = [cid]
    repaired = clean_cid(cid.split("/", 1)[0])
    if repaired is not None and repaired != cid:
        forms.append(repaired)
    return forms


# Every step of a rollout repeats its trajectory's URL, and a rollout's cids are read twice
# (projection and the drift check): parse each distinct URL once.
@lru_cache(maxsize=4096)
def _cid_in_query(url: str) -> str | None:
    try:
        query = urlsplit(url).query
    except ValueError:
        # urlsplit refuses some malformed netlocs (e.g. an unclosed IPv6 bracket); the
        # query is still everything after the first '?'.
        query = url.split("?", 1)[1].split("#", 1)[0]
    params = parse_qs(query, keep_blank_values=True)
    for name in URL_PARAMS:
        for value in params.get(name, ()):
            cid = clean_cid(value.split("/", 1)[0])
            if cid is not None:
                return cid
    return None


@dataclass(frozen=True, slots=True)
class Location:
    """One place in the document that names a cid."""

    source: CorrelationSource
    path: str
    cid: str


@dataclass(frozen=True, slots=True)
class Resolution:
    """The canonical cid, each trajectory's own cid, and every location that names one."""

    correlation_id: str | None
    source: CorrelationSource | None
    trajectory_cids: list[tuple[str | None, CorrelationSource | None]]
    locations: list[Location] = field(default_factory=list)

    @property
    def distinct_cids(self) -> list[str]:
        """The distinct cids named anywhere, in resolution order."""
        return list(dict.fromkeys(loc.cid for loc in self.locations))

    @property
    def conflict(self) -> bool:
        """True when two locations name different non-empty ids (a correlation_conflict)."""
        return len(self.distinct_cids) > 1


def resolve_correlation(doc: Mapping[str, Any]) -> Resolution:
    """Find every cid of a RolloutResponse and pick the canonical one (SPEC §4 order)."""
    found: list[Location] = []

    def add(source: CorrelationSource, path: str, cid: str | None) -> None:
        if cid is not None:
            found.append(Location(source, path, cid))

    add("top_level", "trace_correlation_id", clean_cid(doc.get("trace_correlation_id")))
    pipeline = doc.get("pipeline_metadata")
    add(
        "pipeline_metadata",
        "pipeline_metadata.trace_correlation_id",
        clean_cid(_get(pipeline, "trace_correlation_id")),
    )
    trajectories = doc.get("trajectories")
    trajectories = trajectories if isinstance(trajectories, list) else []
    per_trajectory: list[tuple[str | None, CorrelationSource | None]] = []
    for i, traj in enumerate(trajectories):
        own = clean_cid(_get(traj, "trace_correlation_id"))
        add("trajectory", f"trajectories[{i}].trace_correlation_id", own)
        url_cid = cid_from_url(_get(traj, "inference_url"))
        add("inference_url", f"trajectories[{i}].inference_url", url_cid)
        if own is not None:
            per_trajectory.append((own, "trajectory"))
        elif url_cid is not None:
            per_trajectory.append((url_cid, "inference_url"))
        else:
            per_trajectory.append((None, None))
    add(
        "pipeline_metadata_url",
        "pipeline_metadata.inference_url",
        cid_from_url(_get(pipeline, "inference_url")),
    )
    for i, traj in enumerate(trajectories):
        steps = _get(traj, "steps")
        for j, step in enumerate(steps if isinstance(steps, list) else []):
            url = _get(_get(_get(step, "info"), "meta"), "inference_url")
            add(
                "step_inference_url",
                f"trajectories[{i}].steps[{j}].info.meta.inference_url",
                cid_from_url(url),
            )
    # `found` was filled in an order where each source's locations are contiguous, but
    # sources 3 and 4 interleave per trajectory: pick the first by source rank.
    ranked = sorted(found, key=lambda loc: SOURCES.index(loc.source))
    canonical = ranked[0] if ranked else None
    return Resolution(
        correlation_id=canonical.cid if canonical else None,
        source=canonical.source if canonical else None,
        trajectory_cids=per_trajectory,
        locations=ranked,
    )
