"""Property: any accepted RolloutResponse comes back equal (both databases)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from sqlalchemy.orm import Session

from tests.conftest import store_raw
from tests.strategies import rollouts
from tracestore.store.runs import get_document


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(doc=rollouts())
def test_generated_rollouts_come_back_equal(session: Session, doc: dict[str, Any]) -> None:
    # Python's json-style spacing, as producers write it; the read-back must equal the doc.
    raw = orjson.dumps(doc)
    conn = session.connection()
    with conn.begin_nested() as example:  # each example on the store as the test found it
        result = store_raw(conn, raw)
        assert result.status == "created", result.error
        back = get_document(session, doc["run_id"])
        assert orjson.loads(back) == doc
        # Posting it again is a duplicate, never a conflict: the stored hash is stable.
        assert store_raw(conn, raw).status == "duplicate"
        example.rollback()
