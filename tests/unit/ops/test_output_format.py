"""One outcome per custom_id, whatever the format, and the line ids every format shares."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

import pytest

from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.vocabulary import FailureLayer
from streamproc.ops.output_format import ExportCounts, ExportDeduper, HeldFailure, line_id

RESPONSE: dict[str, Any] = {
    "id": "chatcmpl-123",
    "object": "chat.completion",
    "created": 1_764_000_000,
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
            message: str = "HTTP 429 rate_limit_exceeded: Rate limit reached", body: str | None = None,
            provider_id: str | None = None) -> FailureEvent:
    request = InferenceRequest(custom_id, BODY_JSON, batch_id="batch-1", submitted_ms=500)
    return FailureEvent(request, layer, code, message, attempt=5, terminal=terminal, first_failure_ms=1_000,
                        last_failure_ms=last_ms, http_status=status, response_body=body,
                        provider_request_id=provider_id)


def settled(dedupe: ExportDeduper) -> list[tuple[str, str]]:
    """The failures the deduper hands out, as (custom_id, error_code)."""
    return [(custom_id, held.error_code) for custom_id, held in dedupe.failures()]


# --- line ids ----------------------------------------------------------------------------------------------


def test_a_line_id_is_stable_and_depends_on_batch_and_custom_id() -> None:
    assert line_id("batch-1", "req-1") == "batch_req_" + digest("batch-1", "req-1")
    assert line_id(None, "req-1") == "batch_req_" + digest("", "req-1")
    assert line_id("batch-2", "req-1") != line_id("batch-1", "req-1") != line_id("batch-1", "req-2")
    # ("ab", "c") and ("a", "bc") would collide on plain concatenation
    assert line_id("ab", "c") != line_id("a", "bc")


# --- what a held failure keeps -------------------------------------------------------------------------------


def test_a_held_failure_keeps_the_providers_answer_and_not_the_request_body() -> None:
    held = HeldFailure.of(failure(body='{"error": {"message": "slow down"}}', provider_id="req_9"))
    assert (held.response_body, held.provider_request_id) == ('{"error": {"message": "slow down"}}', "req_9")
    assert held.body_object() == {"error": {"message": "slow down"}}
    assert BODY_JSON not in repr(held)


@pytest.mark.parametrize("body", [None, "", "<html>502 Bad Gateway</html>", '{"cut": "of', "[1, 2]", "[" * 100_000])
def test_a_body_that_is_not_a_json_object_has_no_body_object(body: str | None) -> None:
    assert HeldFailure.of(failure(body=body)).body_object() is None




# --- one outcome per custom_id -----------------------------------------------------------------------------


def test_first_result_wins_over_later_duplicates() -> None:
    dedupe = ExportDeduper()
    assert dedupe.add_result(result(response={**RESPONSE, "id": "chatcmpl-first"}))
    assert not dedupe.add_result(result(response={**RESPONSE, "id": "chatcmpl-again"}))
    assert not dedupe.add_result(result())
    assert settled(dedupe) == []
    assert dedupe.counts == ExportCounts(results=1, duplicate_results=2)


def test_a_result_wins_over_failures_before_and_after_it() -> None:
    dedupe = ExportDeduper()
    dedupe.add_failure(failure("a", last_ms=1))
    assert dedupe.add_result(result("a"))
    dedupe.add_failure(failure("a", last_ms=99))
    assert settled(dedupe) == []
    assert dedupe.counts == ExportCounts(results=1, failures_after_success=2)


def test_the_latest_terminal_failure_wins_whatever_the_arrival_order() -> None:
    dedupe = ExportDeduper()
    late = failure("a", last_ms=300, code="server_error", status=500)
    dedupe.add_failure(failure("a", last_ms=200))
    dedupe.add_failure(late)
    dedupe.add_failure(failure("a", last_ms=100, code="overloaded", status=529))
    assert list(dedupe.failures()) == [("a", HeldFailure.of(late))]
    assert dedupe.counts == ExportCounts(superseded_failures=2)


def test_between_failures_at_the_same_time_the_later_arrival_wins() -> None:
    dedupe = ExportDeduper()
    dedupe.add_failure(failure("a", last_ms=100, code="first"))
    dedupe.add_failure(failure("a", last_ms=100, code="second"))
    assert settled(dedupe) == [("a", "second")]


def test_non_terminal_failures_are_never_an_outcome() -> None:
    dedupe = ExportDeduper()
    dedupe.add_failure(failure("a", terminal=False, last_ms=500))
    dedupe.add_failure(failure("b", terminal=False))
    dedupe.add_failure(failure("a", last_ms=100))
    assert list(dedupe.failures()) == [("a", HeldFailure.of(failure("a", last_ms=100)))]
    assert dedupe.counts == ExportCounts(non_terminal=2)


def test_failures_come_in_order_of_each_ids_first_failure() -> None:
    dedupe = ExportDeduper()
    for custom_id, last_ms in [("c", 1), ("a", 2), ("b", 3), ("c", 4)]:
        dedupe.add_failure(failure(custom_id, last_ms=last_ms))
    assert [custom_id for custom_id, _ in dedupe.failures()] == ["c", "a", "b"]


def test_any_interleaving_of_the_topics_gives_the_same_outcomes() -> None:
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
                answer = next(pending_results)
                if dedupe.add_result(answer):
                    written.append(answer)
            else:
                dedupe.add_failure(next(pending_failures))
        held = list(dedupe.failures())
        seen.add(json.dumps([sorted(r.response_json for r in written), [(c, list(h)) for c, h in held]]))
        assert sorted((r.request_id, json.loads(r.response_json)["id"]) for r in written) == [
            ("a", "first"), ("c", "chatcmpl-123")
        ]
        assert held == [("b", HeldFailure.of(failures[2]))]
        assert dedupe.counts == ExportCounts(results=2, duplicate_results=1, failures_after_success=2,
                                             superseded_failures=1)
    assert len(seen) == 1


# --- batch-scoped request ids ------------------------------------------------------------------------------


def test_deduper_settles_a_scoped_and_an_unscoped_id_of_one_custom_id_on_one_line() -> None:
    deduper = ExportDeduper()
    deduper.add_failure(failure("batch-1/req-1"))
    assert deduper.add_result(result("req-1"))
    assert not deduper.add_result(result("batch-1/req-1"))
    assert settled(deduper) == []
    counts = deduper.counts
    assert (counts.results, counts.duplicate_results, counts.failures_after_success) == (1, 1, 1)


def test_failures_carry_the_users_custom_id_not_the_batch_scoped_request_id() -> None:
    deduper = ExportDeduper()
    deduper.add_failure(failure("batch-1/req-1"))
    assert settled(deduper) == [("req-1", "rate_limit_exceeded")]
