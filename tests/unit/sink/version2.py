"""A sink database as streamproc left it at schema version 2, with rows, and what its upgrade must keep.

The same check runs on SQLite (tests/unit/sink/test_database.py) and on PostgreSQL (tests/integration/
test_sink.py), because migration 3 rebuilds the failures table with one SQL text for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamproc.core.events import RepairContext
from streamproc.sink import schema
from streamproc.sink.database import open_database
from streamproc.sink.ledger import read_ledger
from streamproc.sink.rows import iso_ms
from streamproc.sink.target import Target
from tests.unit.sink.events import failure, rows_of

Query = Callable[[str], list[tuple[Any, ...]]]

_COLUMNS = ("batch, custom_id, attempt, request_id, layer, code, message, terminal, resolved, first_failed_at, "
            "failed_at, url, body, metadata, submitted_ms, repair")
_ROWS = (  # req-1 failed twice (the second time for good), req-2 once, with the repair context it carried
    f"('b1', 'req-1', 1, 'b1/req-1', 'service', 'http_503', 'busy', FALSE, FALSE, '{iso_ms(4_000)}', "
    f"'{iso_ms(4_000)}', '/v1/chat/completions', '{{}}', '{{}}', 1000, NULL)",
    f"('b1', 'req-1', 2, 'b1/req-1', 'transport', 'read_timeout', 'timed out', TRUE, FALSE, '{iso_ms(4_000)}', "
    f"'{iso_ms(6_000)}', '/v1/chat/completions', '{{}}', '{{}}', 1000, NULL)",
    f"('b1', 'req-2', 1, 'b1/req-2', 'semantic', 'invalid_json', 'not JSON', TRUE, FALSE, '{iso_ms(5_000)}', "
    f"'{iso_ms(5_000)}', '/v1/chat/completions', '{{}}', '{{}}', 1000, "
    """'{"bad_output": "{", "reason": "invalid JSON"}')""",
)


def create_version_2(execute: Callable[[str], object]) -> None:
    """Migrations 1 and 2 as a release before runs applied them, and failure rows written then."""
    execute(schema.CREATE_VERSION_TABLE)
    for migration in schema.MIGRATIONS[:2]:
        for statement in migration.statements:
            execute(statement)
        execute(f"INSERT INTO schema_version VALUES ({migration.version}, 'v{migration.version}', '{iso_ms(0)}')")
    execute(f"INSERT INTO failures ({_COLUMNS}) VALUES {', '.join(_ROWS)}")


def check_upgrade(target: Target, query: Query, index_names: str) -> None:
    """Opening the database upgrades it: the rows are kept as run 0, the view and the index are back, and a
    replay's attempt 1 (run 1) is a row of its own beside the first attempt 1. ``index_names``: the SQL that
    lists the names of the failures table's indexes, in the database's own catalogue."""
    database = open_database(target)
    try:
        assert query("SELECT MAX(version) FROM schema_version") == [(schema.MIGRATIONS[-1].version,)]
        assert query("SELECT custom_id, run, attempt, code, terminal, submitted_ms FROM failures "
                     "ORDER BY custom_id, attempt") == [("req-1", 0, 1, "http_503", False, 1000),
                                                        ("req-1", 0, 2, "read_timeout", True, 1000),
                                                        ("req-2", 0, 1, "invalid_json", True, 1000)]
        assert "failures_by_code" in {name for (name,) in query(index_names)}
        assert query("SELECT custom_id, status, attempts, code FROM requests ORDER BY custom_id") == [
            ("req-1", "failed", 2, "read_timeout"), ("req-2", "failed", 1, "invalid_json")]

        database.write(rows_of(failure("req-1", run=1, attempt=1, terminal=True, failed_ms=20_000, code="x")))
    finally:
        database.close()
    assert query("SELECT run, attempt, code FROM failures WHERE custom_id = 'req-1' ORDER BY run, attempt") == [
        (0, 1, "http_503"), (0, 2, "read_timeout"), (1, 1, "x")]
    assert query("SELECT status, attempts, code FROM requests WHERE custom_id = 'req-1'") == [("failed", 1, "x")]
    events, _ = read_ledger(target, "b1")
    assert [(event.request.request_id, event.run, event.attempt) for event in events] == [
        ("b1/req-2", 0, 1), ("b1/req-1", 0, 2), ("b1/req-1", 1, 1)]
    assert events[0].request.repair == RepairContext("{", "invalid JSON")
