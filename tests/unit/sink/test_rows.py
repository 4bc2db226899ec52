"""Events -> rows, and one row per key inside a poll."""

from __future__ import annotations

import json

from streamproc.core import headers
from streamproc.core.vocabulary import FailureLayer
from streamproc.sink.rows import Kind, RowBatch, dead_letter_row, failure_row, iso_ms, result_row
from tests.unit.sink.events import BODY, FakeRecord, failure, record, result


def test_timestamps_are_utc_text_that_sorts_in_time_order() -> None:
    assert iso_ms(0) == "1970-01-01T00:00:00.000+00:00"
    assert iso_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123+00:00"
    assert iso_ms(999) < iso_ms(1_000) < iso_ms(10_000_000_000)


def test_a_result_row_is_keyed_by_batch_and_custom_id_with_its_usage() -> None:
    row = result_row(result("req-7", "b1", attempts=3))
    assert row.key == ("b1", "req-7") and row.request_id == "b1/req-7"
    assert (row.prompt_tokens, row.completion_tokens, row.total_tokens) == (9, 1, 10)
    assert json.loads(row.usage or "") == {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}
    assert row.attempt == 3 and row.finished_at == iso_ms(10_000) and row.content == "spam"


def test_a_result_row_keeps_the_deployment_that_answered() -> None:
    assert result_row(result(deployment="mock-small@2")).deployment == "mock-small@2"
    assert result_row(result()).deployment is None  # the single endpoint, or a reused answer


def test_a_failure_row_keeps_the_deployment_the_call_was_made_to() -> None:
    assert failure_row(failure(deployment="mock-small@2")).deployment == "mock-small@2"
    assert failure_row(failure()).deployment is None  # the single endpoint, or no call made


def test_an_unscoped_id_has_the_empty_batch_and_odd_usage_gives_no_tokens() -> None:
    row = result_row(result("legacy-1", None, response='{"usage": {"prompt_tokens": "9", "total_tokens": true}}'))
    assert row.key == ("", "legacy-1")
    assert (row.prompt_tokens, row.completion_tokens, row.total_tokens) == (None, None, None)
    assert result_row(result(response="not json")).usage is None


def test_a_failure_row_keeps_what_a_replay_needs() -> None:
    row = failure_row(failure("req-2", attempt=4, run=3, terminal=True, layer=FailureLayer.TRANSPORT,
                              code="read_timeout", status=None))
    assert row.key == ("b1", "req-2", 3, 4) and row.terminal
    assert (row.layer, row.code, row.http_status, row.model) == ("transport", "read_timeout", None, "mock-small")
    assert row.body == BODY and json.loads(row.metadata) == {"team": "x"} and row.url == "/v1/chat/completions"
    assert (row.first_failed_at, row.failed_at) == (iso_ms(4_000), iso_ms(5_000))
    assert (row.provider_body, row.provider_request_id) == (None, None)  # no HTTP answer came
    answered = failure_row(failure("req-3"))
    assert answered.provider_body == '{"error": {"code": "rate_limit_exceeded"}}'
    assert answered.provider_request_id == "req_abc"


def test_a_dead_letter_row_reads_its_headers() -> None:
    raw = FakeRecord(b"\x00garbage", partition=3, offset=41, key=None, headers=[
        (headers.FAILURE_LAYER, b"business"), (headers.ERROR_CODE, b"unreadable_record"),
        (headers.ERROR_MESSAGE, b"record llm.requests[3]@9: bad"), (headers.ORIG_TOPIC, b"llm.requests"),
        (headers.ORIG_PARTITION, b"3"), (headers.ORIG_OFFSET, b"not a number"), (headers.REQUEST_ID, b"")])
    row = dead_letter_row(raw)
    assert row.key == (3, 41) and row.record_value == b"\x00garbage" and row.request_id is None
    assert (row.layer, row.code, row.origin_topic, row.origin_partition, row.origin_offset) == (
        "business", "unreadable_record", "llm.requests", 3, None)


def test_a_poll_keeps_the_first_result_and_the_latest_copy_of_an_attempt() -> None:
    rows = RowBatch()
    rows.add(Kind.RESULT, record(result(content="first")))
    rows.add(Kind.RESULT, record(result(content="second")))
    rows.add(Kind.FAILURE, record(failure(attempt=1, failed_ms=6_000, message="newer")))
    rows.add(Kind.FAILURE, record(failure(attempt=1, failed_ms=5_000, message="older")))
    rows.add(Kind.FAILURE, record(failure(attempt=1, run=2, failed_ms=4_000, message="the replay's")))
    rows.add(Kind.FAILURE, record(failure("req-9", attempt=2)))
    rows.add(Kind.FAILURE, FakeRecord(b"not avro"))
    rows.add(Kind.RESULT, FakeRecord(None))
    assert rows.results[("b1", "req-1")].content == "first"
    assert rows.failures[("b1", "req-1", 1, 1)].message == "newer"
    assert rows.failures[("b1", "req-1", 2, 1)].message == "the replay's"  # its own row, whatever its time
    assert len(rows) == 4 and rows.skipped == 2
    assert rows.touched() == {("b1", "req-1"), ("b1", "req-9")}
