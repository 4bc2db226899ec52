"""OpenAI batch output and error lines: every one parses with the openai package's types, an HTTP failure is the
provider's answer verbatim, a failure without an HTTP answer is in ``error``, a rejected answer is kept."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from openai.types import ErrorObject
from openai.types.chat import ChatCompletion

from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.provider_answer import kept_body
from streamproc.ops.openai_lines import error_line, output_line
from streamproc.ops.output_format import HeldFailure, line_id
from tests.batch_lines import parse_openai_line
from tests.unit.ops.test_output_format import RESPONSE, failure, result

CONTEXT_BODY = json.dumps({"error": {
    "message": "This model's maximum context length is 8192 tokens. However, you requested 9001 tokens "
               "(8745 in the messages, 256 in the completion). Please reduce the length of the messages or "
               "completion.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
ANSWER = {**RESPONSE, "choices": [{"index": 0, "message": {"role": "assistant", "content": '{"label": "sp'},
                                   "finish_reason": "length"}]}


def line_of(**kwargs: object) -> dict[str, object]:
    event = failure(**kwargs)  # type: ignore[arg-type]
    line = error_line("req-1", HeldFailure.of(event))
    parse_openai_line(json.dumps(line))
    return line


def test_an_output_line_is_openais_with_the_providers_request_id() -> None:
    line = output_line(replace(result(), provider_request_id="req_1"))
    assert line == {"id": line_id("batch-1", "req-1"), "custom_id": "req-1",
                    "response": {"status_code": 200, "request_id": "req_1", "body": RESPONSE}, "error": None}
    _, body = parse_openai_line(json.dumps(line))
    assert isinstance(body, ChatCompletion) and body.choices[0].message.content == "spam"


def test_an_output_line_without_the_providers_request_id_makes_none_up() -> None:
    line = output_line(result())
    assert line["response"]["request_id"] is None
    parse_openai_line(json.dumps(line))


def test_an_output_line_keeps_a_body_that_is_not_json_as_text() -> None:
    line = output_line(result(response='{"choices": [ cut off'))
    assert line["response"] == {"status_code": 200, "request_id": None, "body": '{"choices": [ cut off'}


def test_an_http_failure_is_the_providers_status_and_body_verbatim_and_no_error() -> None:
    line = line_of(status=400, layer=FailureLayer.BUSINESS, code="context_length_exceeded",
                   message="HTTP 400 context_length_exceeded: This model's ...", body=CONTEXT_BODY,
                   provider_id="req_ctx")
    assert line["response"] == {"status_code": 400, "request_id": "req_ctx", "body": json.loads(CONTEXT_BODY)}
    assert line["error"] is None
    assert line["streamproc"] == {
        "layer": "business", "error_code": "context_length_exceeded",
        "message": "HTTP 400 context_length_exceeded: This model's ...", "attempts": 5, "first_failure_ms": 1_000,
        "last_failure_ms": 2_000, "batch_id": "batch-1"}
    _, body = parse_openai_line(json.dumps(line))
    assert isinstance(body, ErrorObject) and body.message == json.loads(CONTEXT_BODY)["error"]["message"]


def test_a_restated_http_failure_still_shows_the_providers_answer_and_says_ours_under_streamproc() -> None:
    body = '{"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}'
    line = line_of(status=429, code="retry_budget_exhausted", message="rate_limit_exceeded, not retried", body=body)
    assert line["response"] == {"status_code": 429, "request_id": None, "body": json.loads(body)}
    assert line["error"] is None
    assert line["streamproc"]["error_code"] == "retry_budget_exhausted"  # type: ignore[index]


@pytest.mark.parametrize(("code", "message"), [
    ("read_timeout", "read timed out after 60 s"),
    ("connection_reset", "connection reset by peer"),
    ("batch_cancelled", "batch 'b' was cancelled before request 'b/1' was called"),
    ("batch_expired", "batch 'b' passed its completion window before request 'b/1' was called"),
])
def test_a_failure_without_an_http_answer_is_in_error_with_no_response(code: str, message: str) -> None:
    line = line_of(status=None, layer=FailureLayer.TRANSPORT, code=code, message=message)
    assert line["response"] is None
    assert line["error"] == {"code": code, "message": message}
    assert "response_text" not in line["streamproc"]  # type: ignore[operator]


@pytest.mark.parametrize(("layer", "code"), [(FailureLayer.SEMANTIC, "truncated"),
                                             (FailureLayer.SEMANTIC, "schema_mismatch"),
                                             (FailureLayer.BUSINESS, "refusal"),
                                             (FailureLayer.BUSINESS, "content_policy_violation")])
def test_a_rejected_answer_is_kept_in_the_response_with_our_verdict_in_error(layer: FailureLayer, code: str) -> None:
    line = line_of(status=200, layer=layer, code=code, message="why it is no result", body=json.dumps(ANSWER),
                   provider_id="req_200")
    assert line["response"] == {"status_code": 200, "request_id": "req_200", "body": ANSWER}
    assert line["error"] == {"code": code, "message": "why it is no result"}


def test_an_answer_too_large_for_a_result_shows_the_providers_200_with_its_text_cut_and_the_sizes() -> None:
    content = "word " * 400_000
    answer = {**RESPONSE, "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                       "finish_reason": "stop"}]}
    message = "the answer to request 'batch-1/req-1' is 2,000,170 bytes: its result record would be ..."
    line = line_of(status=200, layer=FailureLayer.BUSINESS, code="response_too_large", message=message,
                   body=kept_body(json.dumps(answer).encode()), provider_id="req_big")
    assert line["error"] == {"code": "response_too_large", "message": message}
    response = line["response"]
    assert isinstance(response, dict) and (response["status_code"], response["request_id"]) == (200, "req_big")
    _, body = parse_openai_line(json.dumps(line))
    assert isinstance(body, ChatCompletion) and body.usage is not None
    assert body.usage.model_dump(exclude_none=True) == RESPONSE["usage"]  # what it cost, whole
    kept = body.choices[0].message.content
    assert kept is not None and kept.endswith("[cut: 2000000 bytes in all]") and content.startswith(kept[:90_000])


def test_a_200_that_is_not_a_json_object_has_no_response_and_keeps_its_text() -> None:
    line = line_of(status=200, layer=FailureLayer.TRANSPORT, code="invalid_response_body", message="not JSON",
                   body='{"choices": [{"mess')
    assert line["response"] is None
    assert line["error"] == {"code": "invalid_response_body", "message": "not JSON"}
    assert line["streamproc"]["response_text"] == '{"choices": [{"mess'  # type: ignore[index]


@pytest.mark.parametrize(("status", "body", "ours", "message", "error_type"), [
    (502, "<html>502 Bad Gateway</html>", "HTTP 502", "<html>502 Bad Gateway</html>", "server_error"),
    (400, "", "HTTP 400 (empty body)", "HTTP 400 (empty body)", "invalid_request_error"),
    (429, None, "HTTP 429 rate limited", "HTTP 429 rate limited", "rate_limit_error"),  # written before bodies
])
def test_an_error_body_that_is_not_json_is_rebuilt_around_the_providers_text(
        status: int, body: str | None, ours: str, message: str, error_type: str) -> None:
    line = line_of(status=status, code="some_code", message=ours, body=body)
    assert line["response"] == {"status_code": status, "request_id": None, "body": {"error": {
        "message": message, "type": error_type, "param": None, "code": "some_code"}}}
    assert line["error"] is None
    assert line["streamproc"]["body_rebuilt"] is True  # type: ignore[index]


def test_error_and_output_lines_of_one_request_share_the_line_id() -> None:
    assert error_line("x", HeldFailure.of(failure("x")))["id"] == output_line(result("x"))["id"]


def test_lines_carry_the_users_custom_id_not_the_batch_scoped_request_id() -> None:
    scoped = output_line(result("batch-1/req-1"))
    assert scoped == output_line(result("req-1"))  # the same line as an id written before ids were scoped
    assert scoped["custom_id"] == "req-1"


def test_an_error_line_names_the_deployment_the_call_failed_on_only_when_there_was_one() -> None:
    event = replace(failure(status=503, layer=FailureLayer.SERVICE, code="server_error"), deployment="gpt-4o@2")
    line = error_line("req-1", HeldFailure.of(event))
    parse_openai_line(json.dumps(line))
    assert line["streamproc"]["deployment"] == "gpt-4o@2"
    assert "deployment" not in error_line("req-1", HeldFailure.of(failure()))["streamproc"]  # none called


def test_lines_name_the_tenant_and_priority_only_when_not_the_default() -> None:
    line = output_line(replace(result(), tenant="team-a", priority="high"))
    parse_openai_line(json.dumps(line))
    assert line["streamproc"] == {"tenant": "team-a", "priority": "high"}
    assert "streamproc" not in output_line(result())
    event = failure()
    failed = error_line("req-1", HeldFailure.of(replace(event, request=replace(event.request, priority="low"))))
    parse_openai_line(json.dumps(failed))
    assert failed["streamproc"]["priority"] == "low" and "tenant" not in failed["streamproc"]
