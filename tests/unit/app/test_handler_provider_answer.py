"""The handler keeps what the provider answered on every failure event (its body, bounded, and its request id)
and the request id on a result, so the export can write the provider's own answer (design §6)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx

from streamproc.core.retry_policy import DEFAULT_MAX_ATTEMPTS, RetryPolicy
from streamproc.core.verdict import classify_http_error
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.llm.client import CallResult
from streamproc.llm.completion import check_completion
from streamproc.llm.provider_answer import KEPT_BODY_BYTES
from streamproc.llm.transport_errors import classify_exception
from tests.unit.app.test_handler import (
    JSON_BODY,
    Reply,
    Rig,
    completion_bytes,
    make_request,
    next_hop,
    submission,
)

REQUEST_ID = {"x-request-id": "req_7f3a9c"}
CONTEXT_BODY = json.dumps({"error": {
    "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9001 tokens.",
    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}).encode()


def replied(status: int, raw: bytes, response_headers: dict[str, str]) -> Reply:
    """An HTTP answer as the real client returns it: classified, with its body and headers."""
    def reply(body: dict[str, Any]) -> CallResult:
        outcome = (check_completion(raw, body) if status == 200
                   else classify_http_error(status, response_headers, raw))
        return CallResult(outcome, raw, 25, response_headers)
    return reply


async def test_an_http_failure_event_keeps_the_providers_body_verbatim_and_its_request_id() -> None:
    rig = Rig([replied(400, CONTEXT_BODY, REQUEST_ID)])

    await rig.handle(submission(make_request()))

    [(event, _)] = rig.sink.failures
    assert (event.error_code, event.http_status, event.terminal) == ("context_length_exceeded", 400, True)
    assert event.response_body == CONTEXT_BODY.decode()
    assert event.provider_request_id == "req_7f3a9c"


async def test_every_attempt_of_a_rejected_answer_keeps_that_answer() -> None:
    """A cut answer (finish_reason=length) is retried, then terminal: each failure event carries its own answer."""
    first, second = completion_bytes('{"label": "sp', "length"), completion_bytes('{"label": "spam", "sc', "length")
    policy = RetryPolicy(max_attempts={**DEFAULT_MAX_ATTEMPTS, FailureLayer.SEMANTIC: 2})
    rig = Rig([replied(200, first, {"x-request-id": "req_1"})], policy)

    await rig.handle(submission(make_request(body=JSON_BODY)))
    [retry] = rig.sink.retries
    rig.caller.replies.append(replied(200, second, {"x-request-id": "req_2"}))
    await rig.handle(next_hop(retry, 200))

    events = [event for event, _ in rig.sink.failures]
    assert [(e.error_code, e.terminal) for e in events] == [("truncated", False), ("truncated", True)]
    assert [(e.response_body, e.provider_request_id) for e in events] == [(first.decode(), "req_1"),
                                                                          (second.decode(), "req_2")]


async def test_no_http_answer_keeps_no_body_and_no_request_id() -> None:
    outcome = classify_exception(httpx.ReadTimeout("timed out"))
    rig = Rig([lambda body: CallResult(outcome, b"", 30_000)])

    await rig.handle(submission(make_request()))

    [(event, _)] = rig.sink.failures
    assert (event.error_code, event.http_status, event.response_body, event.provider_request_id) == (
        "read_timeout", None, None, None)


async def test_a_request_failed_before_any_call_has_no_answer() -> None:
    rig = Rig([])

    await rig.handle(submission(replace(make_request(), body_json="[1]")))

    [(event, _)] = rig.sink.failures
    assert event.error_code == "malformed_body"
    assert (event.response_body, event.provider_request_id) == (None, None)


async def test_a_long_answer_is_cut_to_the_bound_and_says_so() -> None:
    content = "x" * (KEPT_BODY_BYTES + 10)
    huge = completion_bytes(content, "length")
    rig = Rig([replied(200, huge, {})], RetryPolicy(max_attempts={**DEFAULT_MAX_ATTEMPTS, FailureLayer.SEMANTIC: 1}))

    await rig.handle(submission(make_request()))

    [(event, _)] = rig.sink.failures
    assert event.response_body is not None
    assert len(event.response_body.encode()) <= KEPT_BODY_BYTES
    kept = json.loads(event.response_body)  # still the provider's JSON: only its text is cut
    assert kept["choices"][0]["message"]["content"].endswith(f"[cut: {len(content)} bytes in all]")
    assert kept["usage"] == json.loads(huge)["usage"]
    assert event.provider_request_id is None


async def test_an_answer_too_large_for_a_result_record_ends_as_response_too_large_with_a_bounded_copy() -> None:
    """A paid 200 whose result the producer would refuse (about 2 x 600 KB: body and content): not a result, not
    a send that fails into internal_error, but a terminal business failure that keeps the answer's head, its
    usage and the sizes; the state counts its tokens."""
    content = "word " * 120_000  # 600,000 bytes, once in the body and once as the content
    raw = completion_bytes(content)
    rig = Rig([replied(200, raw, {"x-request-id": "req_big"})])

    await rig.handle(submission(make_request()))

    assert rig.sink.results == [] and rig.sink.retries == []
    [(event, _)] = rig.sink.failures
    assert (event.layer, event.error_code, event.terminal, event.http_status, event.provider_request_id) == (
        FailureLayer.BUSINESS, "response_too_large", True, 200, "req_big")
    assert f"request 'req-1' is {len(raw):,} bytes" in event.message and "9 prompt + 3 completion" in event.message
    assert event.response_body is not None and len(event.response_body.encode()) <= KEPT_BODY_BYTES
    kept = json.loads(event.response_body)
    assert content.startswith(kept["choices"][0]["message"]["content"][:100_000])
    assert (kept["usage"], kept["id"]) == ({"prompt_tokens": 9, "completion_tokens": 3}, "chatcmpl-1")
    state = rig.state()
    assert (state.status, state.last_error_code, state.model, state.prompt_tokens, state.completion_tokens) == (
        RequestStatus.FAILED, "response_too_large", "gpt-test-0613", 9, 3)


async def test_an_answer_that_still_fits_a_record_is_a_result() -> None:
    raw = completion_bytes("word " * 90_000)  # 450,000 bytes twice: under the record's limit with the rest
    rig = Rig([replied(200, raw, {})])

    await rig.handle(submission(make_request()))

    [result] = rig.sink.results
    assert rig.sink.failures == [] and result.response_json == raw.decode()


async def test_a_result_carries_the_providers_request_id() -> None:
    rig = Rig([replied(200, completion_bytes("spam"), {"X-Request-Id": "req_ok"})])

    await rig.handle(submission(make_request()))

    [result] = rig.sink.results
    assert result.provider_request_id == "req_ok"
