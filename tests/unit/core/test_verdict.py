"""Every row of the failure-layer table for error responses, the non-layer conditions, text fallbacks and
retry hints: the pure verdict rules."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamproc.core.durations import parse_duration_ms
from streamproc.core.outcome import ConfigurationProblem, Failure
from streamproc.core.retry_hints import retry_after_ms
from streamproc.core.verdict import classify_http_error
from streamproc.core.vocabulary import FailureLayer

T, S, M, B = FailureLayer.TRANSPORT, FailureLayer.SERVICE, FailureLayer.SEMANTIC, FailureLayer.BUSINESS


def openai_error(message: str, type_: str | None, code: str | int | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()


def anthropic_error(type_: str, message: str, **extra: Any) -> bytes:
    return json.dumps({"type": "error", "error": {"type": type_, "message": message, **extra}}).encode()


def vllm_error(message: str, type_: str, code: int) -> bytes:
    return json.dumps({"object": "error", "message": message, "type": type_, "param": None, "code": code}).encode()


NGINX_502 = b"<html><head><title>502 Bad Gateway</title></head><body><center>502 Bad Gateway</center></body></html>"

# (status, body, layer, code): the failure rows of design §2 as providers actually send them.
FAILURE_ROWS = [
    pytest.param(408, b"", T, "request_timeout", id="408"),
    pytest.param(
        429,
        openai_error("Rate limit reached for gpt-4o on requests per min (RPM)", "requests", "rate_limit_exceeded"),
        S,
        "rate_limit_exceeded",
        id="429-openai",
    ),
    pytest.param(
        429,
        anthropic_error("rate_limit_error", "Number of requests has exceeded your rate limit"),
        S,
        "rate_limit_exceeded",
        id="429-anthropic",
    ),
    pytest.param(
        429,
        openai_error("Please reduce your rate of requests", "rate_limit_error", "slow_down"),
        S,
        "rate_limit_exceeded",
        id="429-slow_down",
    ),
    pytest.param(429, b"Too Many Requests", S, "rate_limit_exceeded", id="429-plain-text"),
    pytest.param(
        429,
        json.dumps({"error": {"code": "429", "message": "Requests have exceeded the token rate limit."}}).encode(),
        S,
        "rate_limit_exceeded",
        id="429-azure-numeric-code",
    ),
    pytest.param(500, openai_error("The server had an error", "server_error"), S, "server_error", id="500-openai"),
    pytest.param(500, anthropic_error("api_error", "Internal server error"), S, "server_error", id="500-anthropic"),
    pytest.param(500, b"Internal Server Error", S, "http_500", id="500-plain"),
    pytest.param(502, NGINX_502, S, "http_502", id="502-html"),
    pytest.param(503, b"", S, "http_503", id="503-empty"),
    pytest.param(504, b"upstream request timeout", S, "http_504", id="504"),
    pytest.param(
        503,
        openai_error("That model is currently overloaded with other requests.", "server_error"),
        S,
        "overloaded",
        id="503-overloaded-text",
    ),
    pytest.param(529, anthropic_error("overloaded_error", "Overloaded"), S, "overloaded", id="529-anthropic"),
    pytest.param(529, b"", S, "overloaded", id="529-no-body"),
    pytest.param(409, anthropic_error("conflict_error", "conflict"), S, "conflict", id="409"),
    pytest.param(
        400,
        openai_error(
            "This model's maximum context length is 128000 tokens.", "invalid_request_error", "context_length_exceeded"
        ),
        B,
        "context_length_exceeded",
        id="400-context-openai",
    ),
    pytest.param(
        400,
        anthropic_error("invalid_request_error", "prompt is too long: 208000 tokens > 200000 maximum"),
        B,
        "context_length_exceeded",
        id="400-context-anthropic-text",
    ),
    pytest.param(
        400,
        vllm_error(
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.",
            "BadRequestError",
            400,
        ),
        B,
        "context_length_exceeded",
        id="400-context-vllm-flat",
    ),
    pytest.param(
        400,
        json.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size",
                    "type": "exceed_context_size_error",
                }
            }
        ).encode(),
        B,
        "context_length_exceeded",
        id="400-context-llamacpp",
    ),
    pytest.param(
        500,
        b'{"error": "input length exceeds maximum context length"}',
        B,
        "context_length_exceeded",
        id="500-context-text",
    ),
    pytest.param(
        400,
        openai_error("Invalid value for 'temperature'", "invalid_request_error", "invalid_value"),
        B,
        "invalid_request_error",
        id="400-invalid-value",
    ),
    pytest.param(
        422,
        json.dumps({"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}).encode(),
        B,
        "invalid_request_error",
        id="422-fastapi",
    ),
    pytest.param(
        413,
        anthropic_error("request_too_large", "Request exceeds the maximum size"),
        B,
        "request_too_large",
        id="413-anthropic",
    ),
    pytest.param(413, b"<html>413 Request Entity Too Large</html>", B, "request_too_large", id="413-html"),
    pytest.param(
        400,
        openai_error(
            "Your request was rejected by our safety system", "invalid_request_error", "content_policy_violation"
        ),
        B,
        "content_policy_violation",
        id="400-content_policy_violation",
    ),
    pytest.param(
        400,
        json.dumps(
            {
                "error": {
                    "code": "content_filter",
                    "message": "The response was filtered",
                    "status": 400,
                    "innererror": {"code": "ResponsibleAIPolicyViolation"},
                }
            }
        ).encode(),
        B,
        "content_policy_violation",
        id="400-azure-content_filter",
    ),
    pytest.param(
        400,
        json.dumps(
            {
                "error": {
                    "message": "filtered due to the prompt triggering Azure OpenAI's content management policy",
                    "innererror": {"code": "ResponsibleAIPolicyViolation"},
                }
            }
        ).encode(),
        B,
        "content_policy_violation",
        id="400-azure-innererror",
    ),
    pytest.param(
        400,
        b'{"message": "The response was filtered: content management policy"}',
        B,
        "content_policy_violation",
        id="400-policy-text",
    ),
    pytest.param(418, b"I'm a teapot", B, "http_418", id="other-4xx"),
    pytest.param(204, b"", T, "unexpected_status", id="2xx-on-error-path"),
]


@pytest.mark.parametrize(("status", "body", "layer", "code"), FAILURE_ROWS)
def test_http_error_rows(status: int, body: bytes, layer: FailureLayer, code: str) -> None:
    outcome = classify_http_error(status, {}, body)
    assert isinstance(outcome, Failure)
    assert (outcome.layer, outcome.code, outcome.http_status) == (layer, code, status)
    assert outcome.message.startswith(f"HTTP {status}")


CONFIG_ROWS = [
    pytest.param(
        401,
        openai_error("Incorrect API key provided", "invalid_request_error", "invalid_api_key"),
        "invalid_api_key",
        id="401-openai",
    ),
    pytest.param(
        401, anthropic_error("authentication_error", "invalid x-api-key"), "invalid_api_key", id="401-anthropic"
    ),
    pytest.param(401, b"", "invalid_api_key", id="401-empty"),
    pytest.param(403, anthropic_error("permission_error", "no access"), "permission_denied", id="403-anthropic"),
    pytest.param(
        403,
        openai_error(
            "Country, region, or territory not supported", "request_forbidden", "unsupported_country_region_territory"
        ),
        "permission_denied",
        id="403-country",
    ),
    pytest.param(
        404,
        openai_error(
            "The model `gpt-9` does not exist or you do not have access to it.",
            "invalid_request_error",
            "model_not_found",
        ),
        "model_not_found",
        id="404-openai",
    ),
    pytest.param(
        404, b'{"error":"model \'llama9\' not found, try pulling it first"}', "model_not_found", id="404-ollama-text"
    ),
    pytest.param(
        404,
        vllm_error("The model `gpt-4.5-x` does not exist.", "NotFoundError", 404),
        "model_not_found",
        id="404-vllm-text",
    ),
    pytest.param(
        404,
        json.dumps(
            {"error": {"code": "DeploymentNotFound", "message": "The API deployment for this resource does not exist."}}
        ).encode(),
        "model_not_found",
        id="404-azure",
    ),
    pytest.param(
        404,
        openai_error("Unknown request URL: POST /v1/chat/completion.", "invalid_request_error", "unknown_url"),
        "not_found",
        id="404-wrong-url",
    ),
    pytest.param(
        429,
        openai_error(
            "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            "insufficient_quota",
        ),
        "insufficient_quota",
        id="429-insufficient_quota",
    ),
    pytest.param(
        429,
        openai_error("You exceeded your current quota.", "insufficient_quota", "project_spend_limit_exceeded"),
        "insufficient_quota",
        id="429-project-spend-limit",
    ),
    pytest.param(
        429,
        anthropic_error("rate_limit_error", "spend limit", details={"error_code": "enforced_spend_limit_reached"}),
        "insufficient_quota",
        id="429-anthropic-spend-limit",
    ),
    pytest.param(429, b'{"message": "You exceeded your current quota"}', "insufficient_quota", id="429-quota-text"),
    pytest.param(
        402, anthropic_error("billing_error", "credit balance too low"), "insufficient_quota", id="402-anthropic"
    ),
    pytest.param(307, b"", "unexpected_redirect", id="3xx"),
]


@pytest.mark.parametrize(("status", "body", "code"), CONFIG_ROWS)
def test_configuration_problems_are_not_failures(status: int, body: bytes, code: str) -> None:
    outcome = classify_http_error(status, {"retry-after": "5"}, body)
    assert isinstance(outcome, ConfigurationProblem)
    assert (outcome.code, outcome.http_status) == (code, status)


def test_structured_code_beats_message_text() -> None:
    body = openai_error("rate limited; also check your quota", "requests", "rate_limit_exceeded")
    outcome = classify_http_error(429, {}, body)
    assert isinstance(outcome, Failure)
    assert outcome.code == "rate_limit_exceeded"


def test_code_beats_type() -> None:
    body = json.dumps({"error": {"type": "rate_limit_error", "code": "insufficient_quota", "message": "x"}}).encode()
    assert isinstance(classify_http_error(429, {}, body), ConfigurationProblem)


def test_structured_code_beats_status() -> None:
    body = openai_error("too long", "invalid_request_error", "context_length_exceeded")
    outcome = classify_http_error(500, {}, body)
    assert isinstance(outcome, Failure)
    assert (outcome.layer, outcome.code) == (B, "context_length_exceeded")


def test_message_keeps_the_provider_identifier_and_text() -> None:
    body = openai_error("Please reduce your rate of requests", "rate_limit_error", "slow_down")
    outcome = classify_http_error(429, {}, body)
    assert outcome.message == "HTTP 429 slow_down: Please reduce your rate of requests"


def test_non_json_body_is_excerpted_and_bounded() -> None:
    outcome = classify_http_error(502, {}, b"<html>\n  bad   gateway\n</html>" + b"x" * 5000)
    assert outcome.message.startswith("HTTP 502: <html> bad gateway </html>")
    assert len(outcome.message) <= 1000


def test_error_response_carries_the_retry_hint() -> None:
    outcome = classify_http_error(429, {"retry-after-ms": "1234"}, openai_error("slow", None, "rate_limit_exceeded"))
    assert isinstance(outcome, Failure)
    assert outcome.retry_after_ms == 1234


def test_retry_hint_from_azure_message() -> None:
    body = json.dumps({"error": {"code": "429", "message": "Please retry after 6 seconds."}}).encode()
    outcome = classify_http_error(429, {}, body)
    assert isinstance(outcome, Failure)
    assert outcome.retry_after_ms == 6000


# --- retry hints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "message", "expected"),
    [
        pytest.param({"retry-after-ms": "1500"}, "", 1500, id="retry-after-ms"),
        pytest.param({"retry-after-ms": "1500.2"}, "", 1501, id="retry-after-ms-rounded-up"),
        pytest.param({"Retry-After": "2"}, "", 2000, id="retry-after-seconds-any-case"),
        pytest.param({"retry-after": "1.1"}, "", 1100, id="retry-after-fractional"),
        pytest.param({"retry-after-ms": "250", "retry-after": "1"}, "", 250, id="explicit-ms-wins"),
        pytest.param(
            {"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT", "date": "Wed, 21 Oct 2015 07:28:00 GMT"},
            "",
            30_000,
            id="http-date-relative-to-date-header",
        ),
        pytest.param({"retry-after": "Wed, 21 Oct 2015 07:28:30 GMT"}, "", None, id="http-date-without-date"),
        pytest.param(
            {"retry-after": "Wed, 21 Oct 2015 07:27:00 GMT", "date": "Wed, 21 Oct 2015 07:28:00 GMT"},
            "",
            0,
            id="http-date-in-the-past",
        ),
        pytest.param({"retry-after": "soon"}, "", None, id="garbage"),
        pytest.param({"retry-after": "-5"}, "", None, id="negative"),
        pytest.param({}, "Rate limit reached. Please try again in 1.5s. Visit ...", 1500, id="text-1.5s"),
        pytest.param({}, "Please try again in 20ms.", 20, id="text-20ms"),
        pytest.param({}, "Please try again in 6m0s.", 360_000, id="text-6m0s"),
        pytest.param({}, "Please retry after 20 seconds.", 20_000, id="text-azure-seconds"),
        pytest.param({}, "Try again in 86400 seconds.", 86_400_000, id="text-daily"),
        pytest.param({}, "Please try again later.", None, id="text-no-duration"),
        pytest.param({}, "We retry 3 times", None, id="text-not-a-hint"),
        pytest.param({"retry-after": "2"}, "Please try again in 20ms", 2000, id="header-beats-text"),
        pytest.param(
            {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-remaining-requests": "0"},
            "",
            360_000,
            id="reset-requests-exhausted",
        ),
        pytest.param(
            {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-remaining-requests": "12"},
            "",
            None,
            id="reset-ignored-when-not-exhausted",
        ),
        pytest.param({"x-ratelimit-reset-tokens": "1s"}, "", None, id="reset-ignored-without-remaining"),
        pytest.param(
            {
                "x-ratelimit-reset-requests": "20ms",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-tokens": "1.5s",
                "x-ratelimit-remaining-tokens": "0",
            },
            "",
            1500,
            id="both-exhausted-takes-longest",
        ),
        pytest.param(
            {"x-ratelimit-reset-tokens": "6m0s", "x-ratelimit-remaining-tokens": "0"},
            "try again in 1s",
            1000,
            id="text-beats-reset-headers",
        ),
        pytest.param({}, "", None, id="nothing"),
    ],
)
def test_retry_after_ms(headers: dict[str, str], message: str, expected: int | None) -> None:
    assert retry_after_ms(headers, message) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1s", 1000),
        ("6m0s", 360_000),
        ("20ms", 20),
        ("1.5s", 1500),
        ("1.1s", 1100),
        ("1h2m3s", 3_723_000),
        ("17ms", 17),
        ("0.5", 500),
        (" 2s ", 2000),
        ("", None),
        ("abc", None),
        ("5x", None),
        ("1s junk", None),
        ("s", None),
    ],
)
def test_parse_duration_ms(text: str, expected: int | None) -> None:
    assert parse_duration_ms(text) == expected


# llama-cpp-python's server, verbatim: a request it cannot parse, answered with a 500.
LLAMA_CPP_VALIDATION = json.dumps({"error": {
    "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
               "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': {'expected': "
               "\"'text' or 'json_object'\"}}\n\n  File \"/x/llama_cpp/server/app.py\", line 376, in "
               "create_chat_completion\n    POST /v1/chat/completions",
    "type": "internal_server_error", "param": None, "code": None}}).encode()


def test_a_500_that_is_a_validation_error_of_the_body_is_the_request_s_fault() -> None:
    failure = classify_http_error(500, {}, LLAMA_CPP_VALIDATION)
    assert isinstance(failure, Failure)
    assert (failure.layer, failure.code) == (B, "invalid_request_error")
    assert "Input should be 'text' or 'json_object'" in failure.message  # the provider's own words are kept
    fastapi_422_shape = b'{"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}'
    assert classify_http_error(500, {}, fastapi_422_shape) == Failure(
        B, "invalid_request_error", classify_http_error(500, {}, fastapi_422_shape).message, 500)
    plain_500 = classify_http_error(500, {}, b'{"error": {"message": "CUDA out of memory", "type": "server_error"}}')
    assert isinstance(plain_500, Failure) and plain_500.layer is S

