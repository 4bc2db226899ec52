"""Requests too large to travel inside the worker's own records."""

from __future__ import annotations

import pytest

from streamproc.core.events import InferenceRequest, InferenceResult, RepairContext
from streamproc.core.outcome import Success
from streamproc.core.record_size import (
    CARRIED_BYTES,
    RECORD_BYTES,
    RESPONSE_TOO_LARGE,
    request_bytes,
    response_too_large,
    result_record_bytes,
    too_large_to_carry,
    without_body,
)
from streamproc.core.vocabulary import FailureLayer


def test_the_size_counts_body_repair_and_metadata() -> None:
    request = InferenceRequest("r", "é" * 10, repair=RepairContext("ab", "why"), metadata={"k": "vv"})
    assert request_bytes(request) == 20 + 2 + 3 + 3


def test_a_request_over_the_limit_is_carried_without_its_body_and_says_where_it_is() -> None:
    big = InferenceRequest("r", "x" * (CARRIED_BYTES + 1), batch_id="b", metadata={"a": "b"})
    assert too_large_to_carry(big) and not too_large_to_carry(InferenceRequest("r", "x" * CARRIED_BYTES))
    slim = without_body(big, "llm.requests[3]@0")
    assert (slim.request_id, slim.batch_id, slim.body_json, slim.repair) == ("r", "b", "", None)
    assert slim.metadata == {"body_omitted": f"{CARRIED_BYTES + 3} bytes, too large to carry in this event; the "
                                             "request is at llm.requests[3]@0"}


def result(content: str, response_json: str = "{}") -> InferenceResult:
    return InferenceResult(request_id="b/r-1", batch_id="b", model="m", response_json=response_json, content=content,
                           attempts=1, latency_ms=5, completed_ms=1, input_hash="h" * 32)


def test_a_small_result_is_sized_by_its_bound_without_encoding() -> None:
    def encode(_: InferenceResult) -> bytes:
        raise AssertionError("a small result must not be encoded to be measured")

    assert result_record_bytes(result("short"), encode) < 1_000


def test_a_big_result_is_measured_by_its_encoding() -> None:
    big = result("x" * 300_000, "y" * 300_000)  # a bound of 4 bytes a character passes the limit: measured
    assert result_record_bytes(big, lambda r: b"z" * 600_123) == len(b"b/r-1") + 600_123


@pytest.mark.parametrize(("record_bytes", "too_large"), [(RECORD_BYTES, False), (RECORD_BYTES + 1, True)])
def test_an_answer_is_too_large_exactly_past_what_a_record_carries(record_bytes: int, too_large: bool) -> None:
    failure = response_too_large("b/r-1", 2_097_152, record_bytes, Success("x", "mock-small", 12, 524_288))
    assert (failure is not None) is too_large
    if failure is not None:
        assert (failure.layer, failure.code, failure.http_status) == (FailureLayer.BUSINESS, RESPONSE_TOO_LARGE, 200)
        assert failure.message == (
            f"the answer to request 'b/r-1' is 2,097,152 bytes: its result record would be {RECORD_BYTES + 1:,} "
            f"bytes, more than the {RECORD_BYTES:,} a Kafka record may carry here (the producer's max.request.size); "
            "not called again (paid: 12 prompt + 524,288 completion tokens of mock-small); the failure keeps the "
            "answer with its text cut, usage whole")
