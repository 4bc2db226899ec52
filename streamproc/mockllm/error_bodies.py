"""Error answers in the shapes real providers send, so a client's classifier meets the real thing.

OpenAI: ``{"error": {"message", "type", "param", "code"}}`` with its statuses and codes. Anthropic's 529:
``{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamproc.mockllm.injected_faults import FaultKind

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


@dataclass(frozen=True)
class ErrorReply:
    """An HTTP error answer: status, JSON body and extra headers; an empty body is sent as no bytes at all."""

    status: int
    body: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def code(self) -> str | None:
        """The structured code a client classifies by first (design §2)."""
        error = self.body.get("error")
        if not isinstance(error, Mapping):
            return None
        code = error.get("type") if self.body.get("type") == "error" else error.get("code")  # Anthropic: type
        return str(code) if code is not None else None


def openai_error(
    status: int,
    message: str,
    type_: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ErrorReply:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return ErrorReply(status, body, dict(headers or {}))


# ---- configuration and account problems -------------------------------------------------------------


def missing_api_key() -> ErrorReply:
    return openai_error(
        401,
        "You didn't provide an API key. You need to provide your API key in an Authorization header "
        "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        INVALID_REQUEST,
    )


def invalid_api_key(given: str) -> ErrorReply:
    shown = f"{given[:3]}*****{given[-4:]}" if len(given) > 8 else "*****"
    return openai_error(
        401,
        f"Incorrect API key provided: {shown}. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        INVALID_REQUEST,
        code="invalid_api_key",
    )


def bare_bad_request() -> ErrorReply:
    """400 with an empty body and no content type: starlette-context's answer to a bad x-request-id."""
    return ErrorReply(400, {})


def model_not_found(model: str) -> ErrorReply:
    return openai_error(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        INVALID_REQUEST,
        code="model_not_found",
    )


def insufficient_quota() -> ErrorReply:
    return openai_error(
        429,
        "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
        "insufficient_quota",
        code="insufficient_quota",
    )


# ---- malformed and invalid requests (business layer) -----------------------------------------------


def unparsable_body() -> ErrorReply:
    return openai_error(
        400,
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
        "HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)",
        INVALID_REQUEST,
    )


def missing_parameter(param: str) -> ErrorReply:
    return openai_error(
        400,
        f"Missing required parameter: '{param}'.",
        INVALID_REQUEST,
        param=param,
        code="missing_required_parameter",
    )


def invalid_type(param: str, expected: str, got: object) -> ErrorReply:
    return openai_error(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {_json_type(got)} instead.",
        INVALID_REQUEST,
        param=param,
        code="invalid_type",
    )


def invalid_value(param: str, message: str) -> ErrorReply:
    return openai_error(
        400, f"Invalid value for '{param}': {message}", INVALID_REQUEST, param=param, code="invalid_value"
    )


def body_too_large(limit: int) -> ErrorReply:
    return openai_error(
        413, f"Request body too large: the limit is {limit} bytes.", INVALID_REQUEST, code="request_too_large"
    )


def context_length_exceeded(window: int, prompt_tokens: int, completion_tokens: int) -> ErrorReply:
    total = prompt_tokens + completion_tokens
    return openai_error(
        400,
        f"This model's maximum context length is {window} tokens. However, you requested {total} tokens "
        f"({prompt_tokens} in the messages, {completion_tokens} in the completion). Please reduce the length "
        "of the messages or completion.",
        INVALID_REQUEST,
        param="messages",
        code="context_length_exceeded",
    )


def injected_invalid_request() -> ErrorReply:
    return invalid_value("messages", "the request was rejected as invalid (injected invalid_request fault).")


def content_policy() -> ErrorReply:
    return openai_error(
        400,
        "Your request was rejected as a result of our safety system. Your prompt may contain text that is "
        "not allowed by our safety system.",
        INVALID_REQUEST,
        param="messages",
        code="content_policy_violation",
    )


def not_found_route(method: str, path: str) -> ErrorReply:
    return openai_error(404, f"Invalid URL ({method} {path})", INVALID_REQUEST)


def method_not_allowed(method: str, path: str) -> ErrorReply:
    return openai_error(405, f"Method {method} is not allowed for {path}", INVALID_REQUEST)


# ---- service faults --------------------------------------------------------------------------------


def rate_limited(
    model: str, unit: str, limit: int, used: int, requested: int, retry_after: str, headers: Mapping[str, str]
) -> ErrorReply:
    """429 ``rate_limit_exceeded`` with OpenAI's "Please try again in Xs." message; ``unit`` is
    ``requests`` or ``tokens`` (OpenAI puts it in ``type``)."""
    label = "requests per min (RPM)" if unit == "requests" else "tokens per min (TPM)"
    return openai_error(
        429,
        f"Rate limit reached for {model} in organization org-mock on {label}: Limit {limit}, Used {used}, "
        f"Requested {requested}. Please try again in {retry_after}. "
        "Visit https://platform.openai.com/account/rate-limits to learn more.",
        unit,
        code="rate_limit_exceeded",
        headers=headers,
    )


def busy(retry_after_s: float) -> ErrorReply:
    """429 for reasons of the server's own (a busy shard, a fair-share scheduler): it names no bucket and
    carries only ``retry-after`` in whole seconds, whatever the client's rate."""
    return openai_error(
        429,
        "The server is busy with other requests. Please retry after a short wait.",
        "requests",
        code="rate_limit_exceeded",
        headers={"retry-after": str(max(1, math.ceil(retry_after_s)))},
    )


def server_error_reply(status: int, message: str, headers: Mapping[str, str] | None = None) -> ErrorReply:
    return openai_error(status, message, SERVER_ERROR, headers=headers)


def anthropic_overloaded() -> ErrorReply:
    return ErrorReply(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})


SERVICE_FAULT_REPLIES: Mapping[FaultKind, ErrorReply] = {
    FaultKind.SERVER_ERROR: server_error_reply(
        500, "The server had an error while processing your request. Sorry about that!"
    ),
    FaultKind.BAD_GATEWAY: server_error_reply(502, "Bad gateway."),
    FaultKind.SERVICE_UNAVAILABLE: server_error_reply(
        503, "The engine is currently overloaded, please try again later."
    ),
    FaultKind.GATEWAY_TIMEOUT: server_error_reply(504, "Gateway timeout: the upstream model did not answer."),
    FaultKind.OVERLOADED: anthropic_overloaded(),
}


def outage(remaining_seconds: float | None) -> ErrorReply:
    """503 while an outage window is open; the hint says when it ends, if it has an end."""
    headers = {} if remaining_seconds is None else {"retry-after": str(max(1, int(remaining_seconds + 0.999)))}
    return server_error_reply(503, "Service Unavailable: the service is temporarily down.", headers)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
