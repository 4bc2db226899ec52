"""Anthropic Message Batches result lines: every one parses with the anthropic package's types."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from anthropic.types import Message
from anthropic.types.messages import (
    MessageBatchCanceledResult,
    MessageBatchErroredResult,
    MessageBatchExpiredResult,
    MessageBatchSucceededResult,
)

from streamproc.core.vocabulary import FailureLayer
from streamproc.ops.anthropic_lines import error_line, output_line
from streamproc.ops.output_format import HeldFailure
from tests.batch_lines import parse_anthropic_line
from tests.unit.ops.test_output_format import RESPONSE, failure, result

OPENAI_429 = json.dumps({"error": {"message": "Rate limit reached for gpt-4o", "type": "requests",
                                   "code": "rate_limit_exceeded"}})
ANTHROPIC_529 = '{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'


def parsed(line: dict[str, Any]) -> object:
    return parse_anthropic_line(json.dumps(line)).result


def test_a_result_is_a_succeeded_message() -> None:
    cut = {**RESPONSE, "choices": [{**RESPONSE["choices"][0], "finish_reason": "length"}]}
    line = output_line(result(response=cut))
    outcome = parsed(line)
    assert isinstance(outcome, MessageBatchSucceededResult) and isinstance(outcome.message, Message)
    assert line["custom_id"] == "req-1"
    message = outcome.message
    assert (message.id, message.model, message.role, message.stop_reason) == (
        "chatcmpl-123", "mock-small", "assistant", "max_tokens")
    assert [(block.type, getattr(block, "text", None)) for block in message.content] == [("text", "spam")]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (9, 1)


def test_a_result_whose_body_is_odd_still_parses() -> None:
    outcome = parsed(output_line(result(response='{"cut', content="spam")))
    assert isinstance(outcome, MessageBatchSucceededResult)
    assert outcome.message.stop_reason == "end_turn" and outcome.message.model == "mock-small"


@pytest.mark.parametrize(("code", "kind"), [("batch_cancelled", MessageBatchCanceledResult),
                                            ("batch_expired", MessageBatchExpiredResult)])
def test_requests_a_batchs_end_reached_first_are_canceled_or_expired(code: str, kind: type) -> None:
    line = error_line("req-1", HeldFailure.of(failure(status=None, layer=FailureLayer.BUSINESS, code=code,
                                                      message="not called")))
    assert isinstance(parsed(line), kind)
    assert line["streamproc"]["error_code"] == code


@pytest.mark.parametrize(("status", "body", "code", "error_type", "message"), [
    (429, OPENAI_429, "rate_limit_exceeded", "rate_limit_error", "Rate limit reached for gpt-4o"),
    (529, ANTHROPIC_529, "overloaded", "overloaded_error", "Overloaded"),
    (400, '{"error": {"message": "prompt is too long"}}', "context_length_exceeded", "invalid_request_error",
     "prompt is too long"),
    (503, "<html>down</html>", "http_503", "api_error", "ours"),
    (None, None, "read_timeout", "timeout_error", "ours"),
    (None, None, "connection_reset", "api_error", "ours"),
    (None, None, "malformed_body", "invalid_request_error", "ours"),
])
def test_an_error_keeps_the_providers_message_and_request_id(status: int | None, body: str | None, code: str,
                                                              error_type: str, message: str) -> None:
    layer = FailureLayer.BUSINESS if code in ("malformed_body", "context_length_exceeded") else FailureLayer.SERVICE
    event = failure(status=status, layer=layer, code=code, message="ours", body=body,
                    provider_id="req_x" if status else None)
    line = error_line("req-1", HeldFailure.of(event))
    outcome = parsed(line)
    assert isinstance(outcome, MessageBatchErroredResult)
    assert (outcome.error.error.type, outcome.error.error.message) == (error_type, message)
    assert outcome.error.request_id == event.provider_request_id
    assert line["streamproc"]["http_status"] == status


def test_a_rejected_answer_is_errored_and_keeps_the_answer_under_streamproc() -> None:
    event = failure(status=200, layer=FailureLayer.SEMANTIC, code="schema_mismatch", message="'score' is required",
                    body=json.dumps(RESPONSE))
    line = error_line("req-1", HeldFailure.of(event))
    outcome = parsed(line)
    assert isinstance(outcome, MessageBatchErroredResult)
    assert (outcome.error.error.type, outcome.error.error.message) == ("api_error", "'score' is required")
    assert line["streamproc"]["response_body"] == RESPONSE


def test_a_body_that_is_not_json_is_kept_as_text() -> None:
    line = error_line("req-1", HeldFailure.of(replace(failure(body="<html>502</html>"), http_status=502)))
    assert line["streamproc"]["response_body"] == "<html>502</html>"


def test_an_errored_line_names_the_deployment_the_call_failed_on() -> None:
    line = error_line("req-1", HeldFailure.of(replace(failure(body=OPENAI_429), deployment="gpt-4o@1")))
    assert isinstance(parsed(line), MessageBatchErroredResult)
    assert line["streamproc"]["deployment"] == "gpt-4o@1"


def test_a_succeeded_line_names_the_deployment_that_answered_and_a_reused_answer_its_origin() -> None:
    line = output_line(replace(result(), deployment="gpt-4o@2", reused_from="earlier/req-1"))
    assert isinstance(parsed(line), MessageBatchSucceededResult)
    assert line["streamproc"] == {"reused_from": "earlier/req-1", "deployment": "gpt-4o@2"}
    assert "streamproc" not in output_line(result())


def test_lines_name_the_tenant_and_priority_only_when_not_the_default() -> None:
    line = output_line(replace(result(), tenant="team-a"))
    assert isinstance(parsed(line), MessageBatchSucceededResult)
    assert line["streamproc"] == {"tenant": "team-a"}
    event = failure()
    failed = error_line("req-1", HeldFailure.of(replace(event, request=replace(event.request, tenant="team-b",
                                                                               priority="high"))))
    assert isinstance(parsed(failed), MessageBatchErroredResult)
    assert (failed["streamproc"]["tenant"], failed["streamproc"]["priority"]) == ("team-b", "high")
