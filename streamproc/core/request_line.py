"""One request as a JSON object, in OpenAI Batch form or the simple form, checked and turned into a chat body.

The same rules read a line of a ``submit`` input file (:mod:`streamproc.ops.input_lines`) and a JSON record on
the request topic (:mod:`streamproc.codec.json_request`), so both refuse the same things with the same reasons
(design §3, §6). Two forms are accepted, never mixed in one object:

* OpenAI Batch: ``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}``; the
  body is sent as is (unknown body fields allowed) and must name its ``model``, as OpenAI requires;
* simple: ``{"id", "prompt", optional "model", "system", "response_format", "max_tokens"}``, turned into
  a chat body (system message if given, then the prompt as the user message) with the default model
  filled in; ``null`` counts as absent for the optional fields.

Unknown top-level fields are an error (a misspelt ``custom-id`` should not pass as a line without an id); a
caller may allow a few more (``envelope``: a record's batch, tenant and priority). A ``url`` is checked by the
worker's own endpoint table (:mod:`streamproc.core.endpoints`). A ``custom_id`` is at most 512 UTF-8 bytes
(OpenAI's limit on its correlation header, where it travels).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from streamproc.core.endpoints import CHAT_COMPLETIONS, UrlRefused, endpoint_for
from streamproc.core.model_names import model_name_problem
from streamproc.core.sendable_json import loads_sendable

BATCH_FIELDS: Final = ("custom_id", "method", "url", "body")
SIMPLE_FIELDS: Final = ("id", "prompt", "model", "system", "response_format", "max_tokens")
MAX_CUSTOM_ID_BYTES: Final = 512


@dataclass(frozen=True)
class LineLimits:
    """What a request object may hold: the body size limit and the simple form's model."""

    max_body_bytes: int = 1_048_576
    default_model: str = "mock-small"


@dataclass(frozen=True)
class RequestLine:
    """A valid request object: its ``custom_id``, the endpoint ``url`` and the body as compact JSON text, and
    the ``envelope`` fields it carried, as given."""

    custom_id: str
    url: str
    body_json: str
    envelope: dict[str, Any]


class InvalidLine(Exception):
    """Why a request object cannot be sent; ``custom_id`` when it got far enough to name one."""

    def __init__(self, reason: str, custom_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.custom_id = custom_id


def loads_line(text: str) -> Any:
    """The JSON value of a line, read as a sender would have written it; :class:`InvalidLine` when it is not."""
    try:
        return loads_sendable(text)
    except json.JSONDecodeError as exc:
        raise InvalidLine(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:  # not sendable (NaN, 1e400, too deep), or an integer over Python's digit limit
        raise InvalidLine(f"invalid JSON: {exc}") from None


def read_request(value: Any, limits: LineLimits, envelope: tuple[str, ...] = ()) -> RequestLine:
    """The request a parsed JSON value asks for, or :class:`InvalidLine` with the first reason it is refused."""
    if not isinstance(value, dict):
        raise InvalidLine(f"expected a JSON object, got {json_type(value)}")
    fields = set(value).difference(envelope)
    unknown = sorted(fields.difference(BATCH_FIELDS, SIMPLE_FIELDS))
    if unknown:
        also = f"; beside either: {', '.join(envelope)}" if envelope else ""
        raise InvalidLine(
            f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} (OpenAI batch form: "
            f"{', '.join(BATCH_FIELDS)}; simple form: {', '.join(SIMPLE_FIELDS)}{also})",
            plausible_id(value),
        )
    batch_fields, simple_fields = fields.intersection(BATCH_FIELDS), fields.intersection(SIMPLE_FIELDS)
    if batch_fields and simple_fields:
        raise InvalidLine(
            f"mixes the OpenAI batch form ({', '.join(sorted(batch_fields))}) with the simple form "
            f"({', '.join(sorted(simple_fields))}); use one",
            plausible_id(value),
        )
    if batch_fields:
        custom_id = _required_id(value, "custom_id")
        url, body = _batch_body(value, custom_id)
    elif simple_fields:
        custom_id = _required_id(value, "id")
        url, body = CHAT_COMPLETIONS.url, _simple_body(value, limits, custom_id)
    else:
        raise InvalidLine("empty object: expected custom_id (OpenAI batch form) or id (simple form)")
    if (model_problem := model_name_problem(body["model"])) is not None:  # a metric label and a guard's key
        raise InvalidLine(f"{'body.' if batch_fields else ''}model {model_problem}", custom_id)
    body_json = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    try:
        size = len(body_json.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidLine(f"body has an unpaired surrogate {body_json[exc.start]!r}, not valid UTF-8",
                          custom_id) from None
    if size > limits.max_body_bytes:
        raise InvalidLine(f"body is {size:,} bytes, over the {limits.max_body_bytes:,}-byte limit", custom_id)
    return RequestLine(custom_id, url, body_json, {name: value[name] for name in envelope if name in value})


def _batch_body(value: dict[str, Any], custom_id: str) -> tuple[str, dict[str, Any]]:
    method = value.get("method")
    if method != "POST":
        what = "missing method" if method is None else f"unsupported method {show(method)}"
        raise InvalidLine(f"{what} (only POST is supported)", custom_id)
    url = value.get("url")
    if url is None:
        raise InvalidLine(f"missing url (supported: {CHAT_COMPLETIONS.url})", custom_id)
    endpoint = endpoint_for(url)
    if isinstance(endpoint, UrlRefused):
        raise InvalidLine(str(endpoint), custom_id)
    body = value.get("body")
    if not isinstance(body, dict):
        raise InvalidLine("missing body" if body is None else f"body must be an object, got {json_type(body)}",
                          custom_id)
    messages = body.get("messages")
    if not isinstance(messages, list):
        what = "is missing" if messages is None else f"must be a list, got {json_type(messages)}"
        raise InvalidLine(f"body.messages {what}", custom_id)
    if not messages:
        raise InvalidLine("body.messages is empty", custom_id)
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidLine(f"body.messages[{index}] must be an object, got {json_type(message)}", custom_id)
    model = body.get("model")
    if model is None:
        raise InvalidLine("body.model is missing (the OpenAI batch form names its model)", custom_id)
    if not isinstance(model, str) or not model.strip():
        raise InvalidLine(f"body.model must be a non-empty string, got {show(model)}", custom_id)
    if body.get("stream") not in (None, False):  # OpenAI's Batch API refuses it too
        raise InvalidLine("body.stream must be false or absent: batch answers are read whole, not streamed",
                          custom_id)
    return endpoint.url, body


def _simple_body(value: dict[str, Any], limits: LineLimits, custom_id: str) -> dict[str, Any]:
    prompt = value.get("prompt")
    if prompt is None:
        raise InvalidLine("missing prompt", custom_id)
    if not isinstance(prompt, str):
        raise InvalidLine(f"prompt must be a string, got {json_type(prompt)}", custom_id)
    if not prompt.strip():
        raise InvalidLine("prompt is empty", custom_id)
    model = value.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise InvalidLine(f"model must be a non-empty string, got {show(model)}", custom_id)
    system = value.get("system")
    if system is not None and not isinstance(system, str):
        raise InvalidLine(f"system must be a string, got {json_type(system)}", custom_id)
    response_format = value.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise InvalidLine(f"response_format must be an object, got {json_type(response_format)}", custom_id)
    max_tokens = value.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise InvalidLine(f"max_tokens must be a positive integer, got {show(max_tokens)}", custom_id)
    messages = [] if system is None else [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": prompt})
    body: dict[str, Any] = {"model": model or limits.default_model, "messages": messages}
    if response_format is not None:
        body["response_format"] = response_format
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def _required_id(value: dict[str, Any], name: str) -> str:
    """The custom_id, part of the request's key on every topic: a non-blank string that UTF-8 can carry."""
    given = value.get(name)
    if given is None:
        raise InvalidLine(f"missing {name}")
    return text_field(given, name, MAX_CUSTOM_ID_BYTES)


def text_field(given: Any, name: str, max_bytes: int) -> str:
    """A non-blank string that UTF-8 can carry in at most ``max_bytes``, or :class:`InvalidLine` saying why not."""
    if not isinstance(given, str):
        raise InvalidLine(f"{name} must be a string, got {json_type(given)}")
    if not given.strip():
        raise InvalidLine(f"{name} is empty")
    try:
        size = len(given.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidLine(f"{name} {given!r} has an unpaired surrogate, not valid UTF-8") from None
    if size > max_bytes:
        raise InvalidLine(f"{name} is {size:,} bytes in UTF-8, over the {max_bytes}-byte limit "
                          f"(starts {given[:40]!r})")
    return given


def plausible_id(value: dict[str, Any]) -> str | None:
    """The id a broken object meant to have, to show with its error (and catch its duplicates)."""
    for name in ("custom_id", "id"):
        try:
            return _required_id(value, name)
        except InvalidLine:
            continue
    return None


def json_type(value: object) -> str:
    """The JSON type of a parsed value, as a reason names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def show(value: object) -> str:
    """A value as a reason quotes it, cut short."""
    return repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False)[:80]
