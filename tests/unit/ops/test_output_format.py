"""Export lines in OpenAI's batch output and error shapes, and one outcome per custom_id."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

import pytest

from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.vocabulary import FailureLayer
from streamproc.ops.output_format import ExportCounts, ExportDeduper, error_line, output_line

RESPONSE = {
    "id": "chatcmpl-123",
    "object": "chat.completion",
    "model": "mock-small",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "spam"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
}
BODY_JSON = '{"model":"mock-small","messages":[{"role":"user","content":"Label: Buy now!!!"}]}'


def digest(batch_id: str, custom_id: str) -> str:
    return hashlib.sha256(f"{batch_id}\n{custom_id}".encode()).hexdigest()[:24]


def result(custom_id: str = "req-1", response: Any = RESPONSE, batch_id: str | None = "batch-1",
           content: str = "spam") -> InferenceResult:
    response_json = response if isinstance(response, str) else json.dumps(response)
    return InferenceResult(custom_id, batch_id, "mock-small", response_json, content, attempts=1, latency_ms=80,
                           completed_ms=1_000, input_hash="h")


def failure(custom_id: str = "req-1", *, terminal: bool = True, last_ms: int = 2_000, status: int | None = 429,
            layer: FailureLayer = FailureLayer.SERVICE, code: str = "rate_limit_exceeded",
            message: str = "HTTP 429 rate_limit_exceeded: Rate limit reached") -> FailureEvent:
    request = InferenceRequest(custom_id, BODY_JSON, batch_id="batch-1", submitted_ms=500)
    return FailureEvent(request, layer, code, message, attempt=5, terminal=terminal, first_failure_ms=1_000,
                        last_failure_ms=last_ms, http_status=status)


# --- output lines ------------------------------------------------------------------------------------------


def test_output_line_is_openais_shape_with_the_provider_response_id() -> None:
    assert output_line(result()) == {
        "id": "batch_req_" + digest("batch-1", "req-1"),
        "custom_id": "req-1",
        "response": {"status_code": 200, "request_id": "chatcmpl-123", "body": RESPONSE},
        "error": None,
    }


def test_output_line_id_is_stable_and_depends_on_batch_and_custom_id() -> None:
    line_id = output_line(result())["id"]
    assert line_id == output_line(result(content="other"))["id"]
    assert len(line_id) == len("batch_req_") + 24
    assert output_line(result(batch_id="batch-2"))["id"] != line_id
    assert output_line(result(custom_id="req-2"))["id"] != line_id
    # ("ab", "c") and ("a", "bc") would collide on plain concatenation
    assert output_line(result("c", batch_id="ab"))["id"] != output_line(result("bc", batch_id="a"))["id"]


def test_output_line_without_batch_hashes_an_empty_batch_id() -> None:
    assert output_line(result(batch_id=None))["id"] == "batch_req_" + digest("", "req-1")


@pytest.mark.parametrize("response_id", [None, "", 42])
def test_output_line_derives_request_id_when_the_response_has_no_usable_id(response_id: Any) -> None:
    response = {k: v for k, v in RESPONSE.items() if k != "id"}
    if response_id is not None:
        response["id"] = response_id
    line = output_line(result(response=response))
    assert line["response"] == {"status_code": 200, "request_id": "req_" + digest("batch-1", "req-1"),
                                "body": response}


def test_output_line_keeps_a_body_that_is_not_json_as_text() -> None:
    line = output_line(result(response='{"choices": [ cut off'))
    assert line["response"] == {"status_code": 200, "request_id": "req_" + digest("batch-1", "req-1"),
                                "body": '{"choices": [ cut off'}


def test_output_line_round_trips_through_json() -> None:
    line = output_line(result())
    assert json.loads(json.dumps(line)) == line


# --- error lines -------------------------------------------------------------------------------------------


def test_error_line_with_an_http_status_carries_openais_error_response() -> None:
    assert error_line(failure()) == {
        "id": "batch_req_" + digest("batch-1", "req-1"),
        "custom_id": "req-1",
        "response": {
            "status_code": 429,
            "request_id": "req_" + digest("batch-1", "req-1"),
            "body": {"error": {"message": "HTTP 429 rate_limit_exceeded: Rate limit reached",
                               "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}},
        },
        "error": {"code": "rate_limit_exceeded", "message": "HTTP 429 rate_limit_exceeded: Rate limit reached"},
        "streamproc": {"layer": "service", "error_code": "rate_limit_exceeded", "attempts": 5,
                       "first_failure_ms": 1_000, "last_failure_ms": 2_000, "batch_id": "batch-1"},
    }


def test_error_line_without_an_http_status_has_no_response() -> None:
    line = error_line(failure(status=None, layer=FailureLayer.TRANSPORT, code="read_timeout",
                              message="read timed out after 60 s"))
    assert line == {
        "id": "batch_req_" + digest("batch-1", "req-1"),
        "custom_id": "req-1",
        "response": None,
        "error": {"code": "read_timeout", "message": "read timed out after 60 s"},
        "streamproc": {"layer": "transport", "error_code": "read_timeout", "attempts": 5,
                       "first_failure_ms": 1_000, "last_failure_ms": 2_000, "batch_id": "batch-1"},
    }


def test_a_semantic_failure_on_a_200_has_no_error_response() -> None:
    line = error_line(failure(status=200, layer=FailureLayer.SEMANTIC, code="invalid_json", message="not JSON"))
    assert line["response"] is None
    assert line["error"] == {"code": "invalid_json", "message": "not JSON"}
    assert line["streamproc"]["layer"] == "semantic"


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(400, "invalid_request_error"), (413, "invalid_request_error"), (429, "rate_limit_error"),
     (500, "server_error"), (529, "server_error"), (408, "invalid_request_error")],
)
def test_error_type_follows_the_status(status: int, error_type: str) -> None:
    response = error_line(failure(status=status))["response"]
    assert response["status_code"] == status
    assert response["body"]["error"]["type"] == error_type


def test_error_and_output_lines_of_one_request_share_the_line_id() -> None:
    assert error_line(failure("x"))["id"] == output_line(result("x"))["id"]


# --- one outcome per custom_id -----------------------------------------------------------------------------


def test_first_result_wins_over_later_duplicates() -> None:
    dedupe = ExportDeduper()
    first = result(response={**RESPONSE, "id": "chatcmpl-first"})
    assert dedupe.add_result(first) == output_line(first)
    assert dedupe.add_result(result(response={**RESPONSE, "id": "chatcmpl-again"})) is None
    assert dedupe.add_result(result()) is None
    assert list(dedupe.error_lines()) == []
    assert dedupe.counts == ExportCounts(results=1, duplicate_results=2)


def test_a_result_wins_over_failures_before_and_after_it() -> None:
    dedupe = ExportDeduper()
    dedupe.add_failure(failure("a", last_ms=1))
    assert dedupe.add_result(result("a")) is not None
    dedupe.add_failure(failure("a", last_ms=99))
    assert list(dedupe.error_lines()) == []
    assert dedupe.counts == ExportCounts(results=1, failures_after_success=2)


def test_the_latest_terminal_failure_wins_whatever_the_arrival_order() -> None:
    dedupe = ExportDeduper()
    late = failure("a", last_ms=300, code="server_error", status=500)
    dedupe.add_failure(failure("a", last_ms=200))
    dedupe.add_failure(late)
    dedupe.add_failure(failure("a", last_ms=100, code="overloaded", status=529))
    assert list(dedupe.error_lines()) == [error_line(late)]
    assert dedupe.counts == ExportCounts(superseded_failures=2)


def test_between_failures_at_the_same_time_the_later_arrival_wins() -> None:
    dedupe = ExportDeduper()
    dedupe.add_failure(failure("a", last_ms=100, code="first"))
    second = failure("a", last_ms=100, code="second")
    dedupe.add_failure(second)
    assert list(dedupe.error_lines()) == [error_line(second)]


def test_non_terminal_failures_are_never_an_outcome() -> None:
    dedupe = ExportDeduper()
    dedupe.add_failure(failure("a", terminal=False, last_ms=500))
    dedupe.add_failure(failure("b", terminal=False))
    dedupe.add_failure(failure("a", last_ms=100))
    assert list(dedupe.error_lines()) == [error_line(failure("a", last_ms=100))]
    assert dedupe.counts == ExportCounts(non_terminal=2)


def test_error_lines_come_in_order_of_each_ids_first_failure() -> None:
    dedupe = ExportDeduper()
    for custom_id, last_ms in [("c", 1), ("a", 2), ("b", 3), ("c", 4)]:
        dedupe.add_failure(failure(custom_id, last_ms=last_ms))
    assert [line["custom_id"] for line in dedupe.error_lines()] == ["c", "a", "b"]


def test_any_interleaving_of_the_topics_gives_the_same_lines() -> None:
    """Results and failure topics are read one after the other or merged: only each topic's own order counts."""
    results = [result("a", response={**RESPONSE, "id": "first"}), result("a", response={**RESPONSE, "id": "dup"}),
               result("c")]
    failures = [failure("a", last_ms=5), failure("b", last_ms=10, code="old"), failure("b", last_ms=20, code="new"),
                failure("c", last_ms=7)]
    seen: set[str] = set()
    for slots in itertools.combinations(range(len(results) + len(failures)), len(results)):
        dedupe = ExportDeduper()
        pending_results, pending_failures = iter(results), iter(failures)
        written = []
        for slot in range(len(results) + len(failures)):
            if slot in slots:
                line = dedupe.add_result(next(pending_results))
                if line is not None:
                    written.append(line)
            else:
                dedupe.add_failure(next(pending_failures))
        errors = list(dedupe.error_lines())
        outcome = json.dumps([sorted(written, key=lambda x: x["custom_id"]), errors], sort_keys=True)
        seen.add(outcome)
        assert sorted((x["custom_id"], x["response"]["request_id"]) for x in written) == [
            ("a", "first"), ("c", "chatcmpl-123")
        ]
        assert errors == [error_line(failures[2])]
        assert dedupe.counts == ExportCounts(results=2, duplicate_results=1, failures_after_success=2,
                                             superseded_failures=1)
    assert len(seen) == 1


# --- batch-scoped request ids ------------------------------------------------------------------------------


def test_lines_carry_the_users_custom_id_not_the_batch_scoped_request_id() -> None:
    scoped = output_line(result("batch-1/req-1"))
    assert scoped == output_line(result("req-1"))  # the same line as an id written before ids were scoped
    assert scoped["custom_id"] == "req-1"
    assert error_line(failure("batch-1/req-1"))["custom_id"] == "req-1"
    assert error_line(failure("batch-1/req-1"))["id"] == error_line(failure("req-1"))["id"]


def test_deduper_settles_a_scoped_and_an_unscoped_id_of_one_custom_id_on_one_line() -> None:
    deduper = ExportDeduper()
    deduper.add_failure(failure("batch-1/req-1"))
    assert deduper.add_result(result("req-1")) is not None
    assert deduper.add_result(result("batch-1/req-1")) is None
    assert list(deduper.error_lines()) == []
    counts = deduper.counts
    assert (counts.results, counts.duplicate_results, counts.failures_after_success) == (1, 1, 1)
