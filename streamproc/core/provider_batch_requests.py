"""A request's chat-completions body as a line of a provider batch (issue 31): OpenAI's input-file line
(``{"custom_id", "method", "url", "body"}``: the body as it is) or Anthropic's Message Batches request
(``{"custom_id", "params"}``: the Messages API's parameters), and Anthropic's request body around them. Pure.

Anthropic's Messages API is not the chat-completions API: system and developer messages become ``system`` (as
text blocks, in order), text parts text blocks,
``stop`` becomes ``stop_sequences``, ``max_tokens`` (or ``max_completion_tokens``) is required. A field with no
Messages counterpart here (tools, response formats, images, ``n`` > 1, ...) is refused with its name
(:class:`NotConvertible`) rather than dropped: a request answered without its tools or schema would be
answered wrongly, and the caller sends it by the synchronous route instead.

Used by the worker's route, ``app.provider_batch_route`` (design §8).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from streamproc.core.endpoints import CHAT_COMPLETIONS

_JSON: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
ANTHROPIC_ENVELOPE: Final = (b'{"requests":[', b"]}")
_PASSED: Final = ("model", "temperature", "top_p")  # the same name and meaning in both APIs
_HANDLED: Final = frozenset({*_PASSED, "messages", "max_tokens", "max_completion_tokens", "stop", "n", "user",
                             "stream"})
_SYSTEM_ROLES: Final = frozenset({"system", "developer"})


class NotConvertible(ValueError):
    """A chat body the Messages API cannot carry as it is: the request goes by the synchronous route."""


def openai_line(custom_id: str, body: dict[str, Any]) -> bytes:
    """The input-file line of a chat-completions request."""
    return _JSON.encode({"custom_id": custom_id, "method": "POST", "url": CHAT_COMPLETIONS.url,
                         "body": body}).encode()


def anthropic_request(custom_id: str, body: dict[str, Any]) -> bytes:
    """The Message Batches request of a chat-completions body; :class:`NotConvertible` says what does not fit."""
    return _JSON.encode({"custom_id": custom_id, "params": messages_params(body)}).encode()


def anthropic_body(requests: Sequence[bytes]) -> bytes:
    """The create call's body around requests made by :func:`anthropic_request` (the gatherer counted its bytes
    as ``ANTHROPIC_LIMITS.envelope_bytes`` and a comma a request)."""
    return ANTHROPIC_ENVELOPE[0] + b",".join(requests) + ANTHROPIC_ENVELOPE[1]


def messages_params(body: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(body) - _HANDLED)
    if unknown:
        raise NotConvertible(f"the Messages API has no counterpart here for {', '.join(unknown)}")
    if body.get("stream"):
        raise NotConvertible("a batch request cannot stream")
    if body.get("n", 1) != 1:
        raise NotConvertible("the Messages API answers one choice (n must be 1)")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise NotConvertible("the Messages API needs max_tokens (or max_completion_tokens), a positive integer")
    params: dict[str, Any] = {name: body[name] for name in _PASSED if name in body}
    params["max_tokens"] = max_tokens
    system, messages = _messages(body.get("messages"))
    if system:
        params["system"] = system
    params["messages"] = messages
    stop = body.get("stop")
    if stop is not None:
        params["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    if isinstance(body.get("user"), str):
        params["metadata"] = {"user_id": body["user"]}
    return params


def _messages(messages: Any) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """The system prompt (the system and developer messages' text blocks, in order) and the user/assistant
    turns."""
    if not isinstance(messages, list) or not messages:
        raise NotConvertible("messages must be a non-empty list")
    system: list[dict[str, str]] = []
    turns: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        extra = sorted(set(message) - {"role", "content", "name"}) if isinstance(message, dict) else []
        if extra:
            raise NotConvertible(f"messages[{index}] has {', '.join(extra)}, which the Messages API has no "
                                 "counterpart for here")
        content = _content(message.get("content") if isinstance(message, dict) else None, index)
        if role in _SYSTEM_ROLES:
            system.extend([{"type": "text", "text": content}] if isinstance(content, str) else content)
        elif role in ("user", "assistant"):
            turns.append({"role": role, "content": content})
        else:
            raise NotConvertible(f"messages[{index}] has role {role!r}; the Messages API takes user and assistant "
                                 "turns and a system prompt")
    if not turns:
        raise NotConvertible("the Messages API needs at least one user or assistant message")
    return system, turns


def _content(content: Any, index: int) -> str | list[dict[str, str]]:
    """A message's text: a string as it is, text parts as Anthropic's text blocks (any other part is refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(isinstance(p, dict) and set(p) == {"type", "text"} and p.get(
            "type") == "text" and isinstance(p.get("text"), str) for p in content):
        return [{"type": "text", "text": p["text"]} for p in content]
    raise NotConvertible(f"messages[{index}].content is not text (a string or text parts)")
