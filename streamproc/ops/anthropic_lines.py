"""Lines of Anthropic's Message Batches results file (``MessageBatchIndividualResponse``): ``custom_id`` and a
``result`` of type ``succeeded`` (a Message), ``errored`` (an error response), ``canceled`` or ``expired``.

Anthropic writes every outcome to one file, so this format does too. A result is a chat completion turned
into a Message (the answer as one text block, ``finish_reason`` as ``stop_reason``, usage as input and output
tokens). An error keeps the provider's own message and request id; a failure with no provider message
(no answer, a rejected 200, no call) carries ours. ``batch_cancelled`` and ``batch_expired`` are
``canceled`` and ``expired``. Our diagnosis, and the provider's body as received (a rejected answer was paid
for), go under ``"streamproc"``, and so do a result's marks (the deployment that answered, a reused answer's
origin), as in the OpenAI format.
"""

from __future__ import annotations

import json
from typing import Any, Final

from streamproc.app.manifest_follower import BATCH_CANCELLED, BATCH_EXPIRED
from streamproc.core.events import InferenceResult
from streamproc.ops.output_format import HeldFailure, result_custom_id, result_marks

_STOP_REASONS: Final = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                        "function_call": "tool_use", "content_filter": "refusal"}
_NOT_CALLED: Final = {BATCH_CANCELLED: "canceled", BATCH_EXPIRED: "expired"}
# Anthropic's error types (its ErrorObject union) by our code first, then by HTTP status
_TYPES_BY_CODE: Final = {"rate_limit_exceeded": "rate_limit_error", "overloaded": "overloaded_error",
                         "read_timeout": "timeout_error", "connect_timeout": "timeout_error",
                         "timeout": "timeout_error", "request_timeout": "timeout_error"}
_TYPES_BY_STATUS: Final = {401: "authentication_error", 402: "billing_error", 403: "permission_error",
                           404: "not_found_error", 408: "timeout_error", 429: "rate_limit_error",
                           504: "timeout_error", 529: "overloaded_error"}


def output_line(result: InferenceResult) -> dict[str, Any]:
    """A ``succeeded`` line: the chat completion as an Anthropic Message."""
    try:
        body: Any = json.loads(result.response_json)
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    finish_reason = choice.get("finish_reason")
    message = {
        "id": body.get("id") if isinstance(body.get("id"), str) else "",
        "type": "message",
        "role": "assistant",
        "model": body.get("model") if isinstance(body.get("model"), str) else result.model,
        "content": [{"type": "text", "text": result.content}],
        "stop_reason": _STOP_REASONS.get(finish_reason, "end_turn") if isinstance(finish_reason, str) else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": _tokens(usage, "prompt_tokens"),
                  "output_tokens": _tokens(usage, "completion_tokens")},
    }
    line: dict[str, Any] = {"custom_id": result_custom_id(result), "result": {"type": "succeeded", "message": message}}
    marks = result_marks(result)
    if marks:
        line["streamproc"] = marks
    return line


def error_line(custom_id: str, failure: HeldFailure) -> dict[str, Any]:
    """An ``errored``, ``canceled`` or ``expired`` line."""
    ours = failure.ours()
    ours["http_status"] = failure.http_status
    body = failure.body_object()
    ours["response_body"] = body if body is not None else failure.response_body
    not_called = _NOT_CALLED.get(failure.error_code)
    if not_called is not None:
        return {"custom_id": custom_id, "result": {"type": not_called}, "streamproc": ours}
    error = {"type": _error_type(failure), "message": _provider_message(body) or failure.message}
    return {"custom_id": custom_id,
            "result": {"type": "errored", "error": {"type": "error", "error": error,
                                                    "request_id": failure.provider_request_id}},
            "streamproc": ours}


def _tokens(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _provider_message(body: dict[str, Any] | None) -> str | None:
    """``error.message`` of an error body (OpenAI's and Anthropic's shapes both have it), verbatim."""
    error = body.get("error") if body is not None else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else None


def _error_type(failure: HeldFailure) -> str:
    by_code = _TYPES_BY_CODE.get(failure.error_code)
    if by_code is not None:
        return by_code
    status = failure.http_status
    if status is not None and status in _TYPES_BY_STATUS:
        return _TYPES_BY_STATUS[status]
    if status is not None and status >= 500:
        return "api_error"
    if (status is not None and 400 <= status < 500) or failure.layer == "business":
        return "invalid_request_error"
    return "api_error"  # no answer, or an answer our checks rejected: nothing the request itself did wrong
