"""README's SQL examples answer their questions on a database the sink filled."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from streamproc.core.events import FailureEvent
from streamproc.core.vocabulary import FailureLayer
from streamproc.sink.database import open_database
from streamproc.sink.target import SqliteTarget
from tests.unit.sink.events import failure, result, rows_of
from tests.unit.sink.readme import readme_queries


def test_the_readme_queries_on_a_sink_filled_database(tmp_path: Path) -> None:
    def timeout(attempt: int, terminal: bool = False) -> FailureEvent:
        return failure("req-2", attempt=attempt, failed_ms=5_000 + attempt, terminal=terminal,
                       layer=FailureLayer.TRANSPORT, code="read_timeout", status=None, message="timed out")

    rows = rows_of(failure("req-1", attempt=1), result("req-1", attempts=2), timeout(1), timeout(2, terminal=True),
                   result("req-3", model="mock-large"),
                   failure("req-1", "b2", terminal=True, layer=FailureLayer.BUSINESS,
                           code="content_policy_violation", status=400, message="policy"))
    database = open_database(SqliteTarget(tmp_path / "sink.db"))
    database.write(rows)
    database.close()

    by_code, unresolved, retries, tokens = readme_queries("b1")
    with sqlite3.connect(tmp_path / "sink.db") as connection:
        assert connection.execute(by_code).fetchall() == [
            ("transport", "read_timeout", 2, 1, 2), ("service", "rate_limit_exceeded", 1, 0, 0)]
        assert [row[:5] for row in connection.execute(unresolved)] == [
            ("b1", "req-2", "failed", "transport", "read_timeout"),
            ("b2", "req-1", "failed", "business", "content_policy_violation")]
        assert connection.execute(retries).fetchall() == [
            ("b1", "req-2", 2, "failed"), ("b1", "req-1", 1, "succeeded"), ("b2", "req-1", 1, "failed")]
        assert connection.execute(tokens).fetchall() == [("b1", "mock-large", 1, 9, 1, 10),
                                                         ("b1", "mock-small", 1, 9, 1, 10)]
