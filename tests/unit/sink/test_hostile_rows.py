"""Hostile text and rows: stored so they read back unchanged, or set aside in ``rejected_rows``; never a stop."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.events import InferenceResult
from streamproc.sink.database import SinkDatabase
from streamproc.sink.ledger import read_ledger
from streamproc.sink.rows import REASON_CHARS, Kind, RowBatch
from streamproc.sink.target import SqliteTarget
from streamproc.sink.text import restored, storable
from tests.unit.sink.events import FakeRecord, failure, record, result

ANY_TEXT = st.text(st.characters(exclude_categories=()))  # surrogates and NUL included


@given(ANY_TEXT)
def test_any_text_is_stored_as_utf8_without_nul_and_reads_back_unchanged(value: str) -> None:
    stored = storable(value)
    assert "\x00" not in stored
    stored.encode("utf-8")  # no lone surrogate left
    assert restored(stored) == value


def test_ordinary_text_is_stored_as_it_is_and_odd_text_as_its_json_literal() -> None:
    for plain in ("req-1", 'say "hi"', '{"model": "x"}', '"', "", "caf\u00e9 \u2603"):
        assert storable(plain) == plain
    assert storable("a\x00b") == '"a\\u0000b"'
    assert storable("x\ud800") == '"x\\ud800"'
    assert storable('"quoted"') == '"\\"quoted\\""'


def query(path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(sql).fetchall()


def test_deeply_nested_json_is_set_aside_with_its_origin_and_the_other_rows_stay() -> None:
    rows = RowBatch()
    nested = InferenceResult("b1/deep", "b1", "m", "[" * 100_000, "x", attempts=1, latency_ms=1,
                             completed_ms=1, input_hash="h")
    rows.add(Kind.RESULT, FakeRecord(record(nested).value, partition=2, offset=9,
                                     headers=[("x-request-id", b"b1/deep")]), "llm.results")
    rows.add(Kind.RESULT, record(result("fine"), offset=10), "llm.results")
    assert list(rows.results) == [("b1", "fine")]
    [rejected] = rows.rejected.values()
    assert rejected.key == ("llm.results", 2, 9) and "RecursionError" in rejected.reason
    assert len(rejected.reason) <= REASON_CHARS + 40


def test_a_row_the_driver_refuses_is_set_aside_and_the_rest_of_the_batch_is_written(
        path: Path, database: SinkDatabase) -> None:
    rows = RowBatch()
    rows.add(Kind.RESULT, record(result("ok-1"), offset=1), "llm.results")
    rows.add(Kind.FAILURE, record(failure("huge", attempt=1), offset=2), "llm.failed.service")
    rows.add(Kind.RESULT, record(result("ok-2"), offset=3), "llm.results")
    huge = rows.failures[("b1", "huge", 1, 1)]
    rows.failures[huge.key] = huge._replace(retry_after_ms=2**70)  # SQLite stores no such integer
    rejected = database.write(rows)
    assert [(row.key, row.request_id) for row in rejected] == [(("llm.failed.service", 0, 2), "b1/huge")]
    assert "OverflowError" in rejected[0].reason
    assert sorted(query(path, "SELECT custom_id FROM results")) == [("ok-1",), ("ok-2",)]
    assert query(path, "SELECT COUNT(*) FROM failures") == [(0,)]
    assert query(path, "SELECT topic, kafka_partition, kafka_offset, request_id FROM rejected_rows") == [
        ("llm.failed.service", 0, 2, "b1/huge")]
    assert database.write(rows) == rejected  # a redelivery sets it aside once


def test_nul_and_lone_surrogates_are_stored_and_read_back_by_backfill(path: Path, database: SinkDatabase) -> None:
    # Avro carries no lone surrogate, but the model is read from the body's JSON, whose escapes make one
    body = json.dumps({"model": "m\x00\ud800", "messages": []})
    plain = failure("a\x00b", terminal=True, message="bad \x00 text")
    hostile = replace(plain, request=replace(plain.request, body_json=body))
    rows = RowBatch()
    rows.add(Kind.FAILURE, record(hostile), "llm.failed.service")
    assert database.write(rows) == []
    assert query(path, "SELECT custom_id, model FROM failures") == [('"a\\u0000b"', '"m\\u0000\\ud800"')]
    [event], _ = read_ledger(SqliteTarget(path), None)
    assert event.request.request_id == "b1/a\x00b" and event.message == "bad \x00 text"
    assert event.request.body_json == body
