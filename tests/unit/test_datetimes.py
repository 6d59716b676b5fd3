"""SPEC §2 datetime forms all parse to the same instant."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tracestore.wire.datetimes import parse_datetime

INSTANT = datetime(2025, 11, 20, 11, 59, 59, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    "value",
    [
        "2025-11-20T11:59:59.123456Z",
        "2025-11-20T11:59:59.123456+00:00",
        "2025-11-20 11:59:59.123456+00:00",
        "2025-11-20T13:59:59.123456+02:00",
        "datetime.datetime(2025, 11, 20, 11, 59, 59, 123456, tzinfo=datetime.timezone.utc)",
        "datetime.datetime(2025, 11, 20, 13, 59, 59, 123456, "
        "tzinfo=datetime.timezone(datetime.timedelta(seconds=7200)))",
        # Spacing and a trailing comma, as a hand-written repr may have them.
        "datetime.datetime(2025,11,20,11,59,59,123456,tzinfo = datetime.timezone.utc)",
        "datetime.datetime(2025, 11, 20, 11, 59, 59, 123456,)",
        INSTANT.timestamp(),
    ],
)
def test_every_form_parses_to_the_same_instant(value: object) -> None:
    parsed = parse_datetime(value)
    assert parsed == INSTANT
    assert parsed is not None
    assert parsed.utcoffset() is not None


def test_second_precision_forms_agree() -> None:
    forms = [
        "2025-11-20T11:59:59Z",
        "2025-11-20 11:59:59+00:00",
        "datetime.datetime(2025, 11, 20, 11, 59, 59, tzinfo=datetime.timezone.utc)",
        1763639999,
        1763639999.0,
    ]
    assert {parse_datetime(f) for f in forms} == {datetime(2025, 11, 20, 11, 59, 59, tzinfo=UTC)}


def test_naive_text_is_read_as_utc() -> None:
    assert parse_datetime("2025-11-20T11:59:59") == datetime(2025, 11, 20, 11, 59, 59, tzinfo=UTC)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "   ",
        "yesterday",
        "datetime.datetime(oops)",
        "datetime.datetime(20 25, 1, 1)",  # digits, but not a number
        "datetime.datetime(2025, 1)",  # too few fields
        True,
        [],
        {},
        float("nan"),
    ],
)
def test_null_and_unparseable_give_none(value: object) -> None:
    assert parse_datetime(value) is None
