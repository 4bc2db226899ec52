"""``backfill --from-db``'s selection on a real SQLite file: the sink's rows read back as backfill's input."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from streamproc.core.events import FailureEvent, InferenceResult, RepairContext
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.ops.backfill import BackfillFilter, plan_backfill
from streamproc.sink import schema
from streamproc.sink.database import DatabaseError, SinkDatabase, open_database
from streamproc.sink.ledger import read_ledger
from streamproc.sink.rows import iso_ms
from streamproc.sink.target import SqliteTarget
from tests.unit.sink.events import failure, result, rows_of


@pytest.fixture
def target(tmp_path: Path) -> SqliteTarget:
    return SqliteTarget(tmp_path / "sink.db")


@pytest.fixture
def database(target: SqliteTarget) -> Iterator[SinkDatabase]:
    opened = open_database(target)
    yield opened
    opened.close()


def write(database: SinkDatabase, *events: InferenceResult | FailureEvent) -> None:
    database.write(rows_of(*events))


def terminal(custom_id: str, batch: str | None = "b1", **kwargs: Any) -> FailureEvent:
    return failure(custom_id, batch, terminal=True, **kwargs)


def test_the_rows_give_back_the_terminal_failure_events_as_the_topics_carry_them(
        target: SqliteTarget, database: SinkDatabase) -> None:
    repaired = replace(terminal("req-r", layer=FailureLayer.TRANSPORT, code="read_timeout", status=None),
                       request=replace(failure("req-r").request, repair=RepairContext("{not json", "invalid_json"),
                                       tenant="team-a", priority="low"))
    events = [terminal("req-1", attempt=3, failed_ms=1_700_000_000_123, deployment="gpt@2"), repaired,
              terminal("legacy-1", None, layer=FailureLayer.SEMANTIC, code="invalid_json")]
    write(database, failure("req-1", attempt=1), failure("req-1", attempt=2, failed_ms=5_500), *events)
    failures, statuses = read_ledger(target, None)
    assert sorted(failures, key=lambda e: e.request.request_id) == sorted(events, key=lambda e: e.request.request_id)
    assert statuses == {"b1/req-1": RequestStatus.FAILED, "b1/req-r": RequestStatus.FAILED,
                        "legacy-1": RequestStatus.FAILED}


def test_each_request_has_the_views_latest_outcome(target: SqliteTarget, database: SinkDatabase) -> None:
    write(database, terminal("done"), result("done", completed_ms=9_000),  # succeeded since: resolved
          terminal("again", attempt=3), failure("again", attempt=1, failed_ms=8_000),  # a replay retrying
          terminal("failed"), failure("only-retrying"))  # no terminal failure: nothing to replay
    failures, statuses = read_ledger(target, "b1")
    assert sorted(event.request.request_id for event in failures) == ["b1/again", "b1/done", "b1/failed"]
    assert statuses == {"b1/done": RequestStatus.SUCCEEDED, "b1/again": RequestStatus.RETRYING,
                        "b1/failed": RequestStatus.FAILED}


def test_the_latest_terminal_failure_comes_last_whatever_the_write_order(
        target: SqliteTarget, database: SinkDatabase) -> None:
    """Backfill keeps the last terminal failure it meets of a request: the database gives them oldest first."""
    write(database, terminal("req-1", attempt=1, failed_ms=20_000, layer=FailureLayer.BUSINESS, code="refused"))
    write(database, terminal("req-1", attempt=4, failed_ms=6_000, code="http_503"))
    failures, _ = read_ledger(target, "b1")
    assert [(event.attempt, event.error_code) for event in failures] == [(4, "http_503"), (1, "refused")]


def test_only_the_batch_asked_for(target: SqliteTarget, database: SinkDatabase) -> None:
    write(database, terminal("req-1", "b1"), terminal("req-1", "b2"), terminal("legacy-1", None))
    assert [event.request.request_id for event in read_ledger(target, "b2")[0]] == ["b2/req-1"]
    assert len(read_ledger(target, None)[0]) == 3


def test_the_plan_from_the_database_is_the_plan_from_the_events(target: SqliteTarget,
                                                                 database: SinkDatabase) -> None:
    events = [terminal("t", layer=FailureLayer.TRANSPORT, code="read_timeout", status=None),
              terminal("m", layer=FailureLayer.SEMANTIC, code="invalid_json", failed_ms=6_000),
              terminal("b", layer=FailureLayer.BUSINESS, code="context_length_exceeded"),
              terminal("done", code="http_503"), terminal("other", "b2")]
    write(database, *events, result("done"))
    topic_statuses = {"b1/done": RequestStatus.SUCCEEDED}
    for selection in (BackfillFilter(), BackfillFilter(batch_id="b1", include_business=True),
                      BackfillFilter(layers=frozenset({FailureLayer.SEMANTIC}), since_ms=5_500),
                      BackfillFilter(error_codes=frozenset({"read_timeout", "http_503"}), until_ms=5_001)):
        from_db = plan_backfill(*read_ledger(target, selection.batch_id), selection)
        from_topics = plan_backfill(events, topic_statuses, selection)
        assert from_db.summary() == from_topics.summary(), selection
        assert sorted(from_db.replays, key=lambda r: r.request_id) == sorted(from_topics.replays,
                                                                            key=lambda r: r.request_id)
    assert plan_backfill(*read_ledger(target, None), BackfillFilter()).counts[
        ("service", "http_503", "skip: succeeded since")] == 1


def test_rows_written_before_version_2_read_as_a_request_without_submission_time(target: SqliteTarget) -> None:
    with sqlite3.connect(target.path) as connection:
        connection.execute(schema.CREATE_VERSION_TABLE)
        for statement in schema.MIGRATIONS[0].statements:
            connection.execute(statement)
        connection.execute(schema.RECORD_VERSION, (1, "v1", iso_ms(0)))
        connection.execute(
            "INSERT INTO failures (batch, custom_id, attempt, request_id, layer, code, message, terminal, "
            "first_failed_at, failed_at, url, body, metadata) VALUES ('b1', 'old', 2, 'b1/old', 'transport', "
            f"'read_timeout', 'timed out', TRUE, '{iso_ms(4_000)}', '{iso_ms(5_000)}', '/v1/chat/completions', "
            "'{}', '{}')")
    [event], statuses = read_ledger(target, "b1")
    assert (event.request.submitted_ms, event.request.repair, event.last_failure_ms) == (0, None, 5_000)
    assert statuses == {"b1/old": RequestStatus.FAILED}


def test_a_missing_sqlite_file_is_an_error_and_is_not_created(target: SqliteTarget) -> None:
    with pytest.raises(DatabaseError, match="no database at"):
        read_ledger(target, None)
    assert not target.path.exists()
