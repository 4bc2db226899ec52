"""The sink's writes on a real SQLite file: migrations, idempotent upserts, resolution and the view."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from streamproc.core.events import FailureEvent, InferenceResult
from streamproc.core.vocabulary import FailureLayer
from streamproc.sink.database import DatabaseError, SinkDatabase, open_database
from streamproc.sink.rows import FailureRow, failure_row, iso_ms
from streamproc.sink.schema import CREATE_VERSION_TABLE, MIGRATIONS, SchemaTooNewError
from streamproc.sink.target import SqliteTarget
from tests.unit.sink.events import failure, result, rows_of
from tests.unit.sink.version2 import check_upgrade, create_version_2


def write(database: SinkDatabase, *events: InferenceResult | FailureEvent) -> None:
    database.write(rows_of(*events))


def query(path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(sql).fetchall()


def test_migrating_twice_applies_each_version_once(path: Path, database: SinkDatabase) -> None:
    assert database.migrate() == len(MIGRATIONS)
    open_database(SqliteTarget(path)).close()
    assert query(path, "SELECT version FROM schema_version ORDER BY version") == [
        (migration.version,) for migration in MIGRATIONS]


def test_a_database_from_a_newer_streamproc_is_refused(path: Path, database: SinkDatabase) -> None:
    query(path, "INSERT INTO schema_version VALUES (99, 'future', '2030-01-01T00:00:00.000+00:00')")
    with pytest.raises(SchemaTooNewError):
        open_database(SqliteTarget(path))


def test_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="no directory"):
        open_database(SqliteTarget(tmp_path / "absent" / "sink.db"))


def test_writing_the_same_records_again_changes_nothing(path: Path, database: SinkDatabase) -> None:
    events: list[InferenceResult | FailureEvent] = [failure(attempt=1), failure(attempt=2, failed_ms=6_000),
                                                    result(attempts=3), failure("req-2")]
    write(database, *events)
    before = query(path, "SELECT * FROM failures ORDER BY custom_id, attempt") + query(path, "SELECT * FROM results")
    write(database, *events)
    write(database, result(content="a second answer after a crash"))
    after = query(path, "SELECT * FROM failures ORDER BY custom_id, attempt") + query(path, "SELECT * FROM results")
    assert after == before
    assert query(path, "SELECT content FROM results") == [("spam",)]


def test_an_older_copy_of_an_attempt_never_replaces_a_newer_one(path: Path, database: SinkDatabase) -> None:
    write(database, failure(failed_ms=6_000, message="newer"))
    write(database, failure(failed_ms=5_000, message="older"))
    assert query(path, "SELECT message FROM failures") == [("newer",)]


@pytest.mark.parametrize("result_first", [False, True])
def test_a_success_resolves_the_requests_failures_in_either_order(path: Path, database: SinkDatabase,
                                                                   result_first: bool) -> None:
    failures = [failure(attempt=1), failure(attempt=2, failed_ms=6_000), failure("other")]
    if result_first:
        write(database, result())
        write(database, *failures)
    else:
        write(database, *failures)
        write(database, result())
    assert query(path, "SELECT custom_id, attempt, resolved FROM failures ORDER BY custom_id, attempt") == [
        ("other", 1, 0), ("req-1", 1, 1), ("req-1", 2, 1)]


def test_the_view_shows_each_requests_latest_outcome_through_a_backfill(path: Path, database: SinkDatabase) -> None:
    def outcome() -> list[tuple[object, ...]]:
        return query(path, "SELECT status, attempts, layer, code FROM requests WHERE custom_id = 'req-1'")

    write(database, failure(attempt=1, failed_ms=5_000))
    assert outcome() == [("retrying", 1, "service", "rate_limit_exceeded")]
    write(database, failure(attempt=2, failed_ms=6_000, terminal=True, layer=FailureLayer.TRANSPORT,
                            code="read_timeout"))
    assert outcome() == [("failed", 2, "transport", "read_timeout")]
    # the backfill replay (the next run) starts at attempt 1 again: its outcome is later, so it is the one shown
    write(database, failure(attempt=1, run=2, failed_ms=20_000, terminal=True, layer=FailureLayer.BUSINESS,
                            code="context_length_exceeded"))
    assert outcome() == [("failed", 1, "business", "context_length_exceeded")]
    write(database, result(attempts=2, completed_ms=30_000))
    assert outcome() == [("succeeded", 2, None, None)]
    assert query(path, "SELECT COUNT(*), SUM(resolved) FROM failures") == [(3, 3)]
    assert query(path, "SELECT COUNT(*) FROM requests") == [(1,)]


def test_a_replays_attempt_1_keeps_the_first_runs_attempt_1(path: Path, database: SinkDatabase) -> None:
    write(database, failure(attempt=1, run=1, failed_ms=5_000, terminal=True, code="http_503"))
    write(database, failure(attempt=1, run=2, failed_ms=20_000, terminal=True, code="read_timeout"))
    assert query(path, "SELECT run, attempt, code FROM failures ORDER BY run") == [
        (1, 1, "http_503"), (2, 1, "read_timeout")]


def test_at_the_same_failure_time_the_later_run_is_the_latest_outcome(path: Path, database: SinkDatabase) -> None:
    write(database, failure(attempt=3, run=1, failed_ms=5_000, terminal=True, code="http_503"),
          failure(attempt=1, run=2, failed_ms=5_000, terminal=True, code="read_timeout"))
    assert query(path, "SELECT attempts, code FROM requests") == [(1, "read_timeout")]


def test_a_version_2_database_upgrades_keeping_its_failures_as_run_0(path: Path) -> None:
    with sqlite3.connect(path, isolation_level=None) as connection:
        create_version_2(connection.execute)
    check_upgrade(SqliteTarget(path), lambda sql: query(path, sql),
                  "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'failures'")


def database_at(path: Path, version: int, old_row: str, values: Sequence[object] = ()) -> None:
    """A database as the sink of schema ``version`` left it, with one row it wrote (``old_row``, an INSERT)."""
    with sqlite3.connect(path, isolation_level=None) as connection:
        connection.execute(CREATE_VERSION_TABLE)
        for migration in MIGRATIONS[:version]:
            for statement in migration.statements:
                connection.execute(statement)
            connection.execute(f"INSERT INTO schema_version VALUES ({migration.version}, 'v', '{iso_ms(0)}')")
        connection.execute(old_row, values)


def write_once(path: Path, *events: InferenceResult | FailureEvent) -> None:
    """Open the database (migrating it), write the events, close it."""
    database = open_database(SqliteTarget(path))
    try:
        write(database, *events)
    finally:
        database.close()


def test_results_store_the_deployment_and_a_version_4_database_migrates_with_null_for_its_rows(path: Path) -> None:
    database_at(path, 4, "INSERT INTO results (batch, custom_id, request_id, model, content, response, attempt, "
                f"latency_ms, finished_at, input_hash) VALUES ('b1', 'old', 'b1/old', 'm', 'x', '{{}}', 1, 5, "
                f"'{iso_ms(1_000)}', 'h')")
    write_once(path, result("req-1", deployment="mock-small@2"), result("req-2"))
    assert query(path, "SELECT custom_id, deployment FROM results ORDER BY custom_id") == [
        ("old", None), ("req-1", "mock-small@2"), ("req-2", None)]


def test_failures_store_the_deployment_and_a_version_5_database_migrates_with_null_for_its_rows(path: Path) -> None:
    before = FailureRow._fields[:FailureRow._fields.index("deployment")]  # a version-5 row: the columns before it
    database_at(path, 5, f"INSERT INTO failures ({', '.join(before)}) VALUES ({', '.join('?' for _ in before)})",
                failure_row(failure("old"))[:len(before)])
    write_once(path, failure("req-1", deployment="mock-small@2"), failure("req-2"))
    assert query(path, "SELECT custom_id, deployment FROM failures ORDER BY custom_id") == [
        ("old", None), ("req-1", "mock-small@2"), ("req-2", None)]


def test_rows_keep_the_tenant_and_priority_and_a_version_6_database_reads_the_default_tenant_s(path: Path) -> None:
    before = FailureRow._fields[:FailureRow._fields.index("tenant")]  # a version-6 row
    database_at(path, 6, f"INSERT INTO failures ({', '.join(before)}) VALUES ({', '.join('?' for _ in before)})",
                failure_row(failure("old"))[:len(before)])
    of_a = failure("req-1")
    of_a = replace(of_a, request=replace(of_a.request, tenant="team-a", priority="high"))
    write_once(path, of_a, replace(result("req-2"), tenant="team-b", priority="low"))
    assert query(path, "SELECT custom_id, tenant, priority FROM failures ORDER BY custom_id") == [
        ("old", "default", "normal"), ("req-1", "team-a", "high")]
    assert query(path, "SELECT tenant, priority FROM results") == [("team-b", "low")]
