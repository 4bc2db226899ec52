"""200 chat completions checked against what the request asked for: the L1 and L3 rows, and error envelopes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamproc.core.outcome import ConfigurationProblem, Failure, Success
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.completion import check_completion

T, S, M, B = FailureLayer.TRANSPORT, FailureLayer.SERVICE, FailureLayer.SEMANTIC, FailureLayer.BUSINESS


def openai_error(message: str, type_: str | None, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()


# --- 200 responses ---------------------------------------------------------------------------------------


def completion(content: str | None = "ok", finish_reason: str = "stop", **message: Any) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, **message},
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }
    ).encode()


CHAT: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["spam", "ham"]}, "score": {"type": "number"}},
    "required": ["label", "score"],
    "additionalProperties": False,
}
JSON_OBJECT = {**CHAT, "response_format": {"type": "json_object"}}
JSON_SCHEMA = {
    **CHAT,
    "response_format": {"type": "json_schema", "json_schema": {"name": "label", "strict": True, "schema": SCHEMA}},
}


def test_success() -> None:
    assert check_completion(completion("hello"), CHAT) == Success("hello", "gpt-4o-mini-2024-07-18", 11, 7)


def test_success_without_model_or_usage_falls_back_to_the_request() -> None:
    body = json.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}).encode()
    assert check_completion(body, CHAT) == Success("hi", "gpt-4o-mini", 0, 0)


def failure_of(outcome: Success | Failure | ConfigurationProblem) -> Failure:
    assert isinstance(outcome, Failure), outcome
    return outcome


@pytest.mark.parametrize(
    ("body", "code"),
    [
        pytest.param(b"<html>gateway</html>", "invalid_response_body", id="not-json"),
        pytest.param(completion("hello")[:40], "invalid_response_body", id="cut-off"),
        pytest.param(b"\xff\xfe\xfa", "invalid_response_body", id="undecodable"),
        pytest.param(b"[1, 2]", "invalid_response_body", id="not-an-object"),
        pytest.param(b'{"id": "x"}', "missing_choices", id="no-choices"),
        pytest.param(b'{"choices": []}', "missing_choices", id="empty-choices"),
        pytest.param(b'{"choices": [{"finish_reason": "stop"}]}', "missing_choices", id="choice-without-message"),
        pytest.param(
            b'{"choices": [{"message": {"content": [{"type": "text"}]}}]}',
            "invalid_response_body",
            id="content-not-text",
        ),
    ],
)
def test_broken_200_bodies_are_transport(body: bytes, code: str) -> None:
    failure = failure_of(check_completion(body, CHAT))
    assert (failure.layer, failure.code, failure.http_status) == (T, code, 200)


@pytest.mark.parametrize("content", ["", None, "  \n\t"])
def test_empty_content_is_semantic(content: str | None) -> None:
    failure = failure_of(check_completion(completion(content), CHAT))
    assert (failure.layer, failure.code) == (M, "empty_content")


def test_length_is_truncated_even_with_content() -> None:
    failure = failure_of(check_completion(completion("The answer is", finish_reason="length"), CHAT))
    assert (failure.layer, failure.code) == (M, "truncated")
    assert "7 completion tokens" in failure.message


def test_length_with_no_content_is_truncated_not_empty() -> None:
    failure = failure_of(check_completion(completion("", finish_reason="length"), CHAT))
    assert failure.code == "truncated"


def test_truncated_beats_invalid_json() -> None:
    failure = failure_of(check_completion(completion('{"label": "sp', finish_reason="length"), JSON_SCHEMA))
    assert failure.code == "truncated"


def test_content_filter_finish_is_business() -> None:
    failure = failure_of(check_completion(completion(None, finish_reason="content_filter"), CHAT))
    assert (failure.layer, failure.code) == (B, "content_policy_violation")


def test_refusal_is_business() -> None:
    failure = failure_of(check_completion(completion(None, refusal="I can't help with that."), JSON_SCHEMA))
    assert (failure.layer, failure.code) == (B, "refusal")
    assert "I can't help with that." in failure.message


@pytest.mark.parametrize(
    "content",
    ['{"label": "sp"am"}', '```json\n{"label": "spam", "score": 1}\n```', "Sure! Here it is", "[1, 2]", "3"],
)
def test_invalid_json_when_json_object_asked(content: str) -> None:
    failure = failure_of(check_completion(completion(content), JSON_OBJECT))
    assert (failure.layer, failure.code) == (M, "invalid_json")


@pytest.mark.parametrize("content", ['{"label": "spam"', '{"label": "sp', '{"items": [1, 2,  ', "["])
def test_json_cut_mid_value_is_truncated_even_without_finish_reason_length(content: str) -> None:
    """Some servers stop at max_tokens without saying so: the retry must get more room, not the same call."""
    failure = failure_of(check_completion(completion(content), JSON_OBJECT))
    assert (failure.layer, failure.code) == (M, "truncated")


def test_json_object_accepts_any_object() -> None:
    assert isinstance(check_completion(completion('{"anything": [1]}'), JSON_OBJECT), Success)


def test_prose_is_fine_when_no_json_asked() -> None:
    assert isinstance(check_completion(completion("not { json"), CHAT), Success)
    text_format = {**CHAT, "response_format": {"type": "text"}}
    assert isinstance(check_completion(completion("not { json"), text_format), Success)


def test_schema_satisfied() -> None:
    outcome = check_completion(completion('{"label": "spam", "score": 0.9}'), JSON_SCHEMA)
    assert isinstance(outcome, Success)
    assert json.loads(outcome.content) == {"label": "spam", "score": 0.9}


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"label": "spam"}', "'score' is a required property"),
        ('{"label": "eggs", "score": 1}', "'eggs' is not one of ['spam', 'ham']"),
        ('{"label": "ham", "score": "high"}', "$.score"),
        ('{"label": "ham", "score": 1, "extra": true}', "Additional properties are not allowed"),
    ],
)
def test_schema_mismatch_carries_the_validator_message(content: str, fragment: str) -> None:
    failure = failure_of(check_completion(completion(content), JSON_SCHEMA))
    assert (failure.layer, failure.code) == (M, "schema_mismatch")
    assert fragment in failure.message


def test_schema_request_with_invalid_json_is_invalid_json() -> None:
    failure = failure_of(check_completion(completion("label: spam"), JSON_SCHEMA))
    assert failure.code == "invalid_json"


def test_invalid_schema_is_the_requests_fault() -> None:
    bad = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "banana"}}}}
    failure = failure_of(check_completion(completion("{}"), bad))
    assert (failure.layer, failure.code) == (B, "invalid_json_schema")


def test_validators_are_compiled_once_per_schema() -> None:
    from streamproc.llm import completion as classify

    same_schema_other_key_order = {
        **CHAT,
        "response_format": {"type": "json_schema", "json_schema": {"schema": dict(reversed(list(SCHEMA.items())))}},
    }
    check_completion(completion('{"label": "spam", "score": 1}'), JSON_SCHEMA)
    before = classify._validator.cache_info()
    check_completion(completion('{"label": "ham", "score": 2}'), same_schema_other_key_order)
    after = classify._validator.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b'{"error": {"message": "Rate limit", "code": 429}}', (S, "rate_limit_exceeded"), id="429"),
        pytest.param(b'{"error": {"message": "upstream died"}}', (S, "http_502"), id="no-status"),
        pytest.param(
            b'{"error": {"message": "too long", "code": "context_length_exceeded"}}',
            (B, "context_length_exceeded"),
            id="context",
        ),
    ],
)
def test_error_envelope_in_a_200_is_classified_as_that_error(body: bytes, expected: tuple[FailureLayer, str]) -> None:
    failure = failure_of(check_completion(body, CHAT))
    assert (failure.layer, failure.code, failure.http_status) == (*expected, 200)
    assert failure.message.startswith("200 body carries an error")


def test_quota_error_in_a_200_stops_consumption() -> None:
    body = openai_error("You exceeded your current quota", "insufficient_quota", "insufficient_quota")
    outcome = check_completion(body, CHAT)
    assert isinstance(outcome, ConfigurationProblem)
    assert outcome.code == "insufficient_quota"


def test_answers_nested_beyond_any_parser_end_as_failures_not_exceptions() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    failure = failure_of(check_completion(completion(deep), JSON_OBJECT))
    assert (failure.layer, failure.code) == (M, "invalid_json")
    body = b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    failure = failure_of(check_completion(body, CHAT))
    assert (failure.layer, failure.code) == (T, "invalid_response_body")


def test_a_schema_whose_ref_resolves_nowhere_is_the_request_s_fault() -> None:
    unresolvable = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}}
    failure = failure_of(check_completion(completion('{"a": 1}'), unresolvable))
    assert (failure.layer, failure.code) == (B, "invalid_json_schema")
    assert "missing" in failure.message

