"""Each kind of provider-batch results line becomes the outcome a synchronous call would give (issue 31):
the same classification of error answers, the same 200 check, and the two ends only batches have."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.outcome import ConfigurationProblem, Failure
from streamproc.core.provider_batch_lines import (
    AnsweredLine,
    MalformedLine,
    anthropic_line,
    openai_line,
)
from streamproc.core.verdict import classify_http_error
from streamproc.core.vocabulary import FailureLayer

S, B = FailureLayer.SERVICE, FailureLayer.BUSINESS
COMPLETION: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "Positive."},
                           "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Label it"}]}


def openai(custom_id: str = "r1", status: int | None = 200, body: Any = None, error: Any = None) -> str:
    response = None if status is None else {"status_code": status, "request_id": "req_1", "body": body}
    return json.dumps({"id": "batch_req_1", "custom_id": custom_id, "response": response, "error": error})


def error_body(code: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": f"{code} happened", "type": type_, "param": None, "code": code}}


@pytest.mark.parametrize(
    ("status", "body", "layer", "code"),
    [
        (429, error_body("rate_limit_exceeded", "requests"), S, "rate_limit_exceeded"),
        (500, error_body("server_error", "server_error"), S, "server_error"),
        (400, error_body("content_policy_violation"), B, "content_policy_violation"),
        (400, error_body("invalid_value"), B, "invalid_request_error"),
        (400, error_body("context_length_exceeded"), B, "context_length_exceeded"),
    ],
)
def test_an_error_line_is_classified_as_the_same_synchronous_answer(
    status: int, body: dict[str, Any], layer: FailureLayer, code: str
) -> None:
    verdict = openai_line(openai(status=status, body=body)).verdict
    assert isinstance(verdict, Failure) and (verdict.layer, verdict.code, verdict.http_status) == (layer, code, status)
    assert verdict == classify_http_error(status, {}, json.dumps(body).encode())


def test_a_quota_line_is_a_configuration_problem() -> None:
    verdict = openai_line(openai(status=429, body=error_body("insufficient_quota", "insufficient_quota"))).verdict
    assert isinstance(verdict, ConfigurationProblem) and verdict.code == "insufficient_quota"


def test_a_200_line_keeps_the_provider_body_and_request_id() -> None:
    outcome = openai_line(openai(body=COMPLETION))
    assert outcome.custom_id == "r1"
    assert outcome.verdict == AnsweredLine(json.dumps(COMPLETION).encode(), "req_1")


def test_an_anthropic_message_becomes_a_chat_completion() -> None:
    verdict = anthropic_line(anthropic({"type": "succeeded", "message": message("max_tokens")})).verdict
    assert isinstance(verdict, AnsweredLine) and verdict.provider_request_id is None
    completion = json.loads(verdict.body)
    assert completion["choices"][0]["message"]["content"] == "Positive."
    assert completion["choices"][0]["finish_reason"] == "length"
    assert completion["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_lines_the_provider_never_ran() -> None:
    expired = openai_line(openai(status=None, error={"code": "batch_expired", "message": "window passed"})).verdict
    assert expired == Failure(S, "batch_expired", "window passed")  # resubmitted through the retry tiers
    cancelled = openai_line(openai(status=None, error={"code": "batch_cancelled", "message": None})).verdict
    assert isinstance(cancelled, Failure) and (cancelled.layer, cancelled.code) == (B, "batch_cancelled")
    other = openai_line(openai(status=None, error={"code": "server_error", "message": "boom"})).verdict
    assert isinstance(other, Failure) and other.layer is S


def message(stop_reason: str = "end_turn", text: str = "Positive.") -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": text}], "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": 5, "output_tokens": 2}}


def anthropic(result: dict[str, Any], custom_id: str = "r1") -> bytes:
    return json.dumps({"custom_id": custom_id, "result": result}).encode()


@pytest.mark.parametrize(
    ("error_type", "layer", "code"),
    [
        ("rate_limit_error", S, "rate_limit_exceeded"),
        ("overloaded_error", S, "overloaded"),
        ("api_error", S, "server_error"),
        ("invalid_request_error", B, "invalid_request_error"),
        ("billing_error", None, "insufficient_quota"),
    ],
)
def test_an_anthropic_error_is_classified_by_its_type(error_type: str, layer: FailureLayer | None, code: str) -> None:
    error = {"type": "error", "error": {"type": error_type, "message": "it failed"}, "request_id": "req_9"}
    verdict = anthropic_line(anthropic({"type": "errored", "error": error})).verdict
    if layer is None:
        assert isinstance(verdict, ConfigurationProblem) and verdict.code == code
    else:
        assert isinstance(verdict, Failure) and (verdict.layer, verdict.code) == (layer, code)


def test_anthropic_canceled_and_expired() -> None:
    expired = anthropic_line(anthropic({"type": "expired"})).verdict
    assert isinstance(expired, Failure) and (expired.layer, expired.code) == (S, "batch_expired")
    canceled = anthropic_line(anthropic({"type": "canceled"})).verdict
    assert isinstance(canceled, Failure) and (canceled.layer, canceled.code) == (B, "batch_cancelled")


@pytest.mark.parametrize(
    "line",
    ["", "[]", "{not json", '{"custom_id": "a"}', '{"custom_id": "", "response": null, "error": {}}',
     '{"custom_id": "a", "response": {"status_code": "200"}}'],
)
def test_a_malformed_openai_line_is_refused_with_a_reason(line: str) -> None:
    with pytest.raises(MalformedLine):
        openai_line(line)


@pytest.mark.parametrize("result", [None, {}, {"type": "paused"}, {"type": "succeeded"}])
def test_a_malformed_anthropic_line_is_refused_with_a_reason(result: Any) -> None:
    with pytest.raises(MalformedLine):
        anthropic_line(json.dumps({"custom_id": "a", "result": result}))


LEAF = st.none() | st.booleans() | st.integers(-5, 600) | st.text(max_size=4)
SMALL = LEAF | st.dictionaries(st.sampled_from(["error", "type", "message", "content", "input_tokens", "text"]), LEAF,
                               max_size=3)
LINES = st.fixed_dictionaries({}, optional={
    "custom_id": st.text(max_size=3) | LEAF,
    "response": LEAF | st.fixed_dictionaries({"status_code": LEAF | st.integers(100, 599), "body": SMALL}),
    "error": LEAF | st.fixed_dictionaries({}, optional={
        "code": st.sampled_from(["batch_expired", "batch_cancelled", "server_error"]) | LEAF, "message": LEAF}),
    "result": LEAF | st.fixed_dictionaries(
        {"type": st.sampled_from(["succeeded", "errored", "canceled", "expired", "paused"]) | LEAF},
        optional={"message": SMALL | st.fixed_dictionaries({"usage": SMALL, "content": LEAF | st.lists(SMALL),
                                                             "stop_reason": LEAF}),
                  "error": SMALL | st.fixed_dictionaries({"error": SMALL})}),
})


@given(doc=LINES)
def test_any_line_ends_in_an_outcome_or_a_malformed_line(doc: dict[str, Any]) -> None:
    for read in (openai_line, anthropic_line):
        try:
            outcome = read(json.dumps(doc))
        except MalformedLine:
            continue
        assert isinstance(outcome.verdict, AnsweredLine | Failure | ConfigurationProblem)
