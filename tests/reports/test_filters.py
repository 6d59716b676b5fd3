"""Report parameters: times, durations, windows, and filters a report does not take."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tracestore.errors import InvalidRequest, NotFound
from tracestore.reports.catalog import PARAMETERS, get_report, list_reports, parse_report
from tracestore.reports.filters import Filters, parse_when

NOW = datetime(2025, 11, 20, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2025-11-20", datetime(2025, 11, 20, tzinfo=UTC)),
        ("2025-11-20T12:30:00Z", datetime(2025, 11, 20, 12, 30, tzinfo=UTC)),
        ("2025-11-20T14:30:00+02:00", datetime(2025, 11, 20, 12, 30, tzinfo=UTC)),
        ("2025-11-20 12:30", datetime(2025, 11, 20, 12, 30, tzinfo=UTC)),  # naive is UTC
        ("7d", NOW - timedelta(days=7)),
        ("12h", NOW - timedelta(hours=12)),
        ("30m", NOW - timedelta(minutes=30)),
        ("2w", NOW - timedelta(weeks=2)),
        ("1.5d", NOW - timedelta(days=1.5)),
    ],
)
def test_times_and_durations(text: str, want: datetime) -> None:
    assert parse_when(text, now=NOW) == want


# Times past the calendar's ends are clamped, not refused (tests/unit/test_timewindow.py).
@pytest.mark.parametrize("text", ["yesterday", "", "-1d", "2025-13-01"])
def test_unreadable_times_are_input_errors(text: str) -> None:
    with pytest.raises(InvalidRequest, match="since: cannot read"):
        parse_when(text, name="since", now=NOW)


def test_the_window_must_be_a_window() -> None:
    with pytest.raises(InvalidRequest, match="must be before"):
        Filters.parse("2025-11-20", "2025-11-19", None)


def test_every_report_takes_every_filter_and_binds_none_as_null() -> None:
    for report in list_reports():
        assert report.parameters
        assert set(report.parameters) <= set(PARAMETERS)
        assert Filters().bind(report.parameters, report.name) == dict.fromkeys(report.parameters)


def test_a_filter_a_report_does_not_take_is_refused() -> None:
    report = parse_report("window_only", "-- description: x\nSELECT $since, $until")
    with pytest.raises(InvalidRequest, match="does not take --env"):
        Filters(env="crafter").bind(report.parameters, report.name)


def test_malformed_report_files_are_refused() -> None:
    with pytest.raises(ValueError, match="description"):
        parse_report("x", "SELECT 1")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \$limit"):
        parse_report("x", "-- description: d\nSELECT $limit")
    with pytest.raises(NotFound, match="no report named"):
        get_report("../etc/passwd")
