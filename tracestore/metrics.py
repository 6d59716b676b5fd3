"""Prometheus metrics of the API: ingest outcomes, request latencies, drift figures.

Each app gets its own registry (tests build many apps in one process; the global registry
would refuse the second). `tracestore serve --workers N` (N > 1) runs prometheus_client's
multiprocess mode (api/server.py names a directory in MULTIPROC_ENV before the workers
start): each worker's counters and histograms are kept in files there, and a scrape, which
one worker answers, sums every worker's (without it a scrape saw the answering worker's
numbers only, and counters went down from one scrape to the next). The drift gauges are
read from the database at scrape time: the most recent reading is the one served.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector

from tracestore.vocabulary import DRIFT_KINDS

__all__ = ["CONTENT_TYPE", "INGEST_STATUSES", "MULTIPROC_ENV", "Metrics"]

# prometheus_client's variable: set before it is imported, its values live in files there.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

INGEST_STATUSES = ("created", "duplicate", "conflict", "invalid")
# Request latencies from sub-millisecond reads to multi-second batch ingests.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Group sizes up to TRACESTORE_GROUP_COMMIT_MAX_ROLLOUTS (64 by default).
GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """The metrics of one app, on their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # As prometheus_client chose when it was imported (its variable read then): values
        # in this process's memory, or in the shared files.
        self.multiprocess = values.ValueClass is not values.MutexValue
        self.ingested = Counter(
            "tracestore_ingest_rollouts",
            "Rollouts posted to the API, by outcome (created, duplicate, conflict, invalid).",
            ["status"],
            registry=self.registry,
        )
        self.requests = Histogram(
            "tracestore_http_request_duration_seconds",
            "HTTP request latency, by method, route template and status code.",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.group_sizes = Histogram(
            "tracestore_group_commit_rollouts",
            "Single posts written in one transaction by a worker's group commit, per group "
            "(1: each post alone; see TRACESTORE_GROUP_COMMIT_WAIT_MS).",
            buckets=GROUP_BUCKETS,
            registry=self.registry,
        )
        self.legacy_reads = Counter(
            "tracestore_legacy_reads",
            "Successful reads of legacy trajectories, by client label and route.",
            ["client", "route"],
            registry=self.registry,
        )
        self.findings = Gauge(
            "tracestore_drift_findings",
            "Stored drift findings, by kind (read from the database at scrape time).",
            ["kind"],
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )
        self.runs = Gauge(
            "tracestore_drift_runs",
            "Checked runs: comparable, comparable with drift, not comparable, unchecked.",
            ["state"],
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )
        self.drift_read = Gauge(
            "tracestore_drift_figures_read",
            "1 when this scrape read the drift figures from the store, 0 when it could not "
            "(the drift gauges then hold their last reading).",
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )
        # Labelled children by their label values: prometheus_client's labels() validates
        # and locks on every call, once per request here (a small post's profile showed it).
        self._request_children: dict[tuple[str, str, str], Any] = {}
        self._ingest_children: dict[str, Any] = {}
        for status in INGEST_STATUSES:
            self._ingest_children[status] = self.ingested.labels(status=status)
        for kind in DRIFT_KINDS:
            self.findings.labels(kind=kind).set(0)

    def count_ingest(self, status: str, n: int = 1) -> None:
        """Count `n` ingest outcomes of `status`."""
        if n > 0:
            child = self._ingest_children.get(status)
            if child is None:
                child = self._ingest_children[status] = self.ingested.labels(status=status)
            child.inc(n)

    def observe_request(self, method: str, route: str, status: str, seconds: float) -> None:
        """Time one HTTP request in the latency histogram."""
        key = (method, route, status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(
                method=method, route=route, status=status
            )
        child.observe(seconds)

    def set_drift(self, findings_by_kind: dict[str, int], runs_by_state: dict[str, int]) -> None:
        """Set the drift gauges from figures read from the store."""
        for kind in DRIFT_KINDS:
            self.findings.labels(kind=kind).set(findings_by_kind.get(kind, 0))
        for state, n in runs_by_state.items():
            self.runs.labels(state=state).set(n)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (every worker's, summed, in
        multiprocess mode)."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # untyped upstream
        return generate_latest(registry)
