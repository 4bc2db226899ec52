"""One line of a provider batch's results as the outcome a synchronous call would have given (issue 31).

A line with an HTTP error status goes through the same classification as a synchronous error answer
(:func:`streamproc.core.verdict.classify_http_error`: a 429 line is service, a 400 business, a 401 a
configuration problem); a 200 line is :class:`AnsweredLine`, its body a chat completion for the same check
a synchronous 200 gets (``streamproc.llm.completion.check_completion``, outside the core: it needs
jsonschema). Anthropic's results are turned into those shapes first: a ``succeeded`` Message becomes a chat
completion, an ``errored`` result the error answer of its type's status.

The two lines no synchronous call has: a request the provider never ran because its batch expired
(``batch_expired``) is a service failure, so it goes back through the retry tiers, as a 503 would; one whose
provider batch was cancelled (``batch_cancelled``) is business, the end a cancel of our own batch gives
(``streamproc cancel`` cancels the provider batches too).

Used by the worker's route, ``app.provider_batch_route`` (design §8).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from streamproc.core.outcome import ConfigurationProblem, Failure
from streamproc.core.verdict import classify_embedded_error, classify_http_error
from streamproc.core.vocabulary import FailureLayer

PROVIDER_BATCH_EXPIRED: Final = "batch_expired"
PROVIDER_BATCH_CANCELLED: Final = "batch_cancelled"

# Anthropic's error types by the HTTP status its synchronous API answers them with
_ANTHROPIC_STATUS: Final = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                            "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                            "rate_limit_error": 429, "api_error": 500, "timeout_error": 504,
                            "overloaded_error": 529}
_FINISH_REASONS: Final = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                          "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}


@dataclass(frozen=True)
class AnsweredLine:
    """A 200 line: the chat completion to check as a synchronous 200 is checked, and the provider's request id."""

    body: bytes
    provider_request_id: str | None


LineVerdict = AnsweredLine | Failure | ConfigurationProblem


@dataclass(frozen=True)
class LineOutcome:
    custom_id: str
    verdict: LineVerdict


class MalformedLine(ValueError):
    """A results line that is not the provider's shape: the caller keeps it whole in its error, never drops it."""


def openai_line(raw: bytes | str) -> LineOutcome:
    """A line of an OpenAI output or error file (``{"id", "custom_id", "response", "error"}``)."""
    doc = _object(raw)
    custom_id = _custom_id(doc)
    response = doc.get("response")
    if isinstance(response, dict):
        status = response.get("status_code")
        if isinstance(status, bool) or not isinstance(status, int):
            raise MalformedLine(f"line {custom_id!r}: response.status_code is not an integer")
        body = json.dumps(response.get("body")).encode()
        request_id = response.get("request_id")
        if 200 <= status < 300:
            return LineOutcome(custom_id, AnsweredLine(body, request_id if isinstance(request_id, str) else None))
        return LineOutcome(custom_id, classify_http_error(status, {}, body))
    error = doc.get("error")
    if not isinstance(error, dict):
        raise MalformedLine(f"line {custom_id!r} has neither a response nor an error")
    return LineOutcome(custom_id, _not_run(error.get("code"), error.get("message")) or classify_embedded_error(
        {"error": error}))


def anthropic_line(raw: bytes | str) -> LineOutcome:
    """A line of an Anthropic results stream (``{"custom_id", "result": {"type": ...}}``)."""
    doc = _object(raw)
    custom_id = _custom_id(doc)
    result = doc.get("result")
    kind = result.get("type") if isinstance(result, dict) else None
    if not isinstance(result, dict) or not isinstance(kind, str):
        raise MalformedLine(f"line {custom_id!r} has no result type")
    if kind == "succeeded":
        message = result.get("message")
        if not isinstance(message, dict):
            raise MalformedLine(f"line {custom_id!r}: a succeeded result without a message")
        return LineOutcome(custom_id, AnsweredLine(json.dumps(chat_completion(message)).encode(), None))
    if kind == "errored":
        error = result.get("error")
        inner = error.get("error") if isinstance(error, dict) else None
        error_type = inner.get("type") if isinstance(inner, dict) else None
        status = _ANTHROPIC_STATUS.get(error_type, 500) if isinstance(error_type, str) else 500
        return LineOutcome(custom_id, classify_http_error(status, {}, json.dumps(error).encode()))
    not_run = _not_run({"canceled": PROVIDER_BATCH_CANCELLED, "expired": PROVIDER_BATCH_EXPIRED}.get(kind), None)
    if not_run is None:
        raise MalformedLine(f"line {custom_id!r}: unknown result type {kind!r}")
    return LineOutcome(custom_id, not_run)


def chat_completion(message: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Message as the chat completion a synchronous call returns (text blocks joined)."""
    blocks = message.get("content")
    texts = [b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)] if isinstance(
        blocks, list) else []
    stop = message.get("stop_reason")
    usage = message.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    prompt, completion = _tokens(usage, "input_tokens"), _tokens(usage, "output_tokens")
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "model": message.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(texts)},
                     "finish_reason": _FINISH_REASONS.get(stop, "stop") if isinstance(stop, str) else "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def _tokens(usage: dict[str, Any], name: str) -> int:
    count = usage.get(name)
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 0


def _not_run(code: object, message: object) -> Failure | None:
    text = message if isinstance(message, str) and message else None
    if code == PROVIDER_BATCH_EXPIRED:
        return Failure(FailureLayer.SERVICE, PROVIDER_BATCH_EXPIRED,
                       text or "the provider's batch expired before it ran this request")
    if code == PROVIDER_BATCH_CANCELLED:
        return Failure(FailureLayer.BUSINESS, PROVIDER_BATCH_CANCELLED,
                       text or "the provider's batch was cancelled before it ran this request")
    return None


def _object(raw: bytes | str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise MalformedLine(f"not a JSON line: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedLine(f"a line is a JSON object, not {type(doc).__name__}")
    return doc


def _custom_id(doc: dict[str, Any]) -> str:
    custom_id = doc.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise MalformedLine("line without a custom_id")
    return custom_id
