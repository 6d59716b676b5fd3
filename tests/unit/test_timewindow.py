"""The one time grammar of since / until (tracestore/timewindow.py), and its users."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import typer

from tracestore.cli.drift import parse_when as cli_parse_when
from tracestore.errors import InvalidRequest
from tracestore.timewindow import EARLIEST, LATEST, parse_optional, parse_when

NOW = datetime(2025, 11, 20, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2025-11-20", datetime(2025, 11, 20, tzinfo=UTC)),
        ("2025-11-20T12:30:00Z", datetime(2025, 11, 20, 12, 30, tzinfo=UTC)),
        ("2025-11-20T14:30:00+02:00", datetime(2025, 11, 20, 12, 30, tzinfo=UTC)),
        ("2025-11-20 12:30", datetime(2025, 11, 20, 12, 30, tzinfo=UTC)),
        (" 7d ", NOW - timedelta(days=7)),
        ("45s", NOW - timedelta(seconds=45)),
        ("30m", NOW - timedelta(minutes=30)),
        ("12h", NOW - timedelta(hours=12)),
        ("2w", NOW - timedelta(weeks=2)),
        ("1.5d", NOW - timedelta(days=1.5)),
    ],
)
def test_dates_times_and_durations(text: str, want: datetime) -> None:
    assert parse_when(text, now=NOW) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # Past the calendar's ends once made UTC, or further back than it goes: its ends.
        ("0001-01-01T00:00:00+14:00", EARLIEST),
        ("0001-01-01T00:00:00+01:00", EARLIEST),
        ("9999-12-31T23:59:59-14:00", LATEST),
        ("9999999999d", EARLIEST),
        ("99999999999999999999w", EARLIEST),
        ("9" * 400 + "d", EARLIEST),
    ],
)
def test_the_calendars_ends_are_clamped(text: str, want: datetime) -> None:
    assert parse_when(text, now=NOW) == want


@pytest.mark.parametrize("text", ["yesterday", "-1d", "7 days", "2025-13-01", "\x00", "1e5d"])
def test_anything_else_is_an_input_error_naming_the_parameter(text: str) -> None:
    with pytest.raises(InvalidRequest, match="until: cannot read") as raised:
        parse_when(text, name="until", now=NOW)
    assert raised.value.details == {"until": text}


def test_absent_and_empty_mean_not_given() -> None:
    assert parse_optional(None, name="since") is None
    assert parse_optional("", name="since") is None
    with pytest.raises(InvalidRequest, match="since: cannot read"):
        parse_optional(" \t\n", name="since")
    assert parse_optional("7d", name="since", now=NOW) == NOW - timedelta(days=7)


def test_the_drift_verb_reads_the_same_grammar() -> None:
    # It knew only Nd and Nh before, and kept a zone's offset instead of making it UTC.
    before = datetime.now(UTC)
    got = cli_parse_when("30m", "--since")
    assert got is not None
    assert (
        before - timedelta(minutes=30, seconds=5) < got <= datetime.now(UTC) - timedelta(minutes=30)
    )
    assert cli_parse_when("2w") is not None
    assert cli_parse_when("2025-11-20T14:30:00+02:00") == datetime(2025, 11, 20, 12, 30, tzinfo=UTC)
    assert cli_parse_when("0001-01-01T00:00:00+14:00") == EARLIEST
    with pytest.raises(typer.BadParameter, match="--since: cannot read 'soon'"):
        cli_parse_when("soon", "--since")
