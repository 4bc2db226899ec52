"""One line of a batch input file: OpenAI Batch JSONL or the simple form, turned into a request (design §6).

Every problem is a :class:`LineError` with its line number and a reason precise enough to fix the line
without reading this code.

Two line forms are accepted, never mixed on one line:

* OpenAI Batch: ``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}``; the
  body is sent as is (unknown body fields allowed) and must name its ``model``, as OpenAI requires;
* simple: ``{"id", "prompt", optional "model", "system", "response_format", "max_tokens"}``, turned into
  a chat body (system message if given, then the prompt as the user message) with the default model
  filled in; ``null`` counts as absent for the optional fields.

Unknown top-level fields are an error (a misspelt ``custom-id`` should not pass as a line without an id).
A ``url`` is checked by the worker's own endpoint table (:mod:`streamproc.core.endpoints`), so submit refuses
what a worker would, with the same reason. A ``custom_id`` is at most 512 UTF-8 bytes (OpenAI's limit on its
correlation header, where it travels), and each line's record, encoded as the producer sends it (key, value,
headers), must fit the producer's max request size: a file that would be sent half is refused whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from streamproc import codec
from streamproc.core.endpoints import CHAT_COMPLETIONS, UrlRefused, endpoint_for
from streamproc.core.events import InferenceRequest
from streamproc.core.identity import request_id_for
from streamproc.core.model_names import model_name_problem
from streamproc.core.sendable_json import loads_sendable

_BATCH_FIELDS: Final = ("custom_id", "method", "url", "body")
_SIMPLE_FIELDS: Final = ("id", "prompt", "model", "system", "response_format", "max_tokens")
# A line may spell its body with whitespace and \uXXXX escapes (an emoji is 4 UTF-8 bytes, 12 escaped), so
# it can be a few times longer than the body it carries; past this factor it is refused unread, which keeps
# memory bounded even for a file that is one endless line.
LINE_CAP_FACTOR: Final = 8
_JSON_WHITESPACE: Final = " \t\r\n"
MAX_CUSTOM_ID_BYTES: Final = 512


@dataclass(frozen=True)
class LineError:
    """Why one input line cannot be sent; ``custom_id`` when the line got far enough to name one."""

    line: int
    custom_id: str | None
    reason: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.custom_id is None else f"line {self.line} (custom_id {self.custom_id!r})"
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class BatchLimits:
    """What a line may contain: the body size limit, the simple form's model, and the record the producer
    sends: its largest size (None: not checked) and the headers every record carries."""

    max_body_bytes: int = 1_048_576
    default_model: str = "mock-small"
    max_record_bytes: int | None = None
    record_headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def max_line_bytes(self) -> int:
        return self.max_body_bytes * LINE_CAP_FACTOR


class _Invalid(Exception):
    """A line's reason, raised from deep in the checks and turned into a LineError once."""

    def __init__(self, reason: str, custom_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.custom_id = custom_id


def parse_line(
    text: str, line: int, limits: BatchLimits, batch_id: str, submitted_ms: int
) -> InferenceRequest | LineError | None:
    """Turn one line (without its newline) into a request keyed by (batch, custom_id), or say why not;
    ``None`` for a blank line."""
    if not text.strip(_JSON_WHITESPACE):
        return None
    try:
        return _parse(text, limits, batch_id, submitted_ms)
    except _Invalid as invalid:
        return LineError(line, invalid.custom_id, invalid.reason)


def _parse(text: str, limits: BatchLimits, batch_id: str, submitted_ms: int) -> InferenceRequest:
    value = _loads(text)
    if not isinstance(value, dict):
        raise _Invalid(f"expected a JSON object, got {_json_type(value)}")
    fields = set(value)
    unknown = sorted(fields.difference(_BATCH_FIELDS, _SIMPLE_FIELDS))
    if unknown:
        raise _Invalid(
            f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} (OpenAI batch form: "
            f"{', '.join(_BATCH_FIELDS)}; simple form: {', '.join(_SIMPLE_FIELDS)})",
            _plausible_id(value),
        )
    batch_fields, simple_fields = fields.intersection(_BATCH_FIELDS), fields.intersection(_SIMPLE_FIELDS)
    if batch_fields and simple_fields:
        raise _Invalid(
            f"mixes the OpenAI batch form ({', '.join(sorted(batch_fields))}) with the simple form "
            f"({', '.join(sorted(simple_fields))}); use one",
            _plausible_id(value),
        )
    if batch_fields:
        custom_id = _required_id(value, "custom_id")
        url, body = _batch_body(value, limits, custom_id)
    elif simple_fields:
        custom_id = _required_id(value, "id")
        url, body = CHAT_COMPLETIONS.url, _simple_body(value, limits, custom_id)
    else:
        raise _Invalid("empty object: expected custom_id (OpenAI batch form) or id (simple form)")
    if (model_problem := model_name_problem(body["model"])) is not None:  # a metric label and a guard's key
        raise _Invalid(f"{'body.' if batch_fields else ''}model {model_problem}", custom_id)
    body_json = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    try:
        size = len(body_json.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise _Invalid(f"body has an unpaired surrogate {body_json[exc.start]!r}, not valid UTF-8", custom_id) from None
    if size > limits.max_body_bytes:
        raise _Invalid(f"body is {size:,} bytes, over the {limits.max_body_bytes:,}-byte limit", custom_id)
    request = InferenceRequest(request_id_for(batch_id, custom_id), body_json, url=url, batch_id=batch_id,
                               submitted_ms=submitted_ms)
    if limits.max_record_bytes is not None:
        record = record_bytes(request, limits.record_headers)
        if record > limits.max_record_bytes:
            raise _Invalid(f"its record is {record:,} bytes encoded (key, value and headers), over the producer's "
                           f"{limits.max_record_bytes:,}-byte max request size", custom_id)
    return request


def record_bytes(request: InferenceRequest, headers: tuple[tuple[str, bytes], ...] = ()) -> int:
    """The request's record as the producer sends it on ``llm.requests`` (key, Avro value, headers), with the
    record batch's own overhead: aiokafka's upper bound."""
    size: int = DefaultRecordBatchBuilder.estimate_size_in_bytes(
        request.request_id.encode("utf-8"), codec.encode(request), list(headers))
    return size


def _loads(text: str) -> Any:
    try:
        return loads_sendable(text)
    except json.JSONDecodeError as exc:
        raise _Invalid(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:  # not sendable (NaN, 1e400, too deep), or an integer over Python's digit limit
        raise _Invalid(f"invalid JSON: {exc}") from None


def _batch_body(value: dict[str, Any], limits: BatchLimits, custom_id: str) -> tuple[str, dict[str, Any]]:
    method = value.get("method")
    if method != "POST":
        what = "missing method" if method is None else f"unsupported method {_show(method)}"
        raise _Invalid(f"{what} (only POST is supported)", custom_id)
    url = value.get("url")
    if url is None:
        raise _Invalid(f"missing url (supported: {CHAT_COMPLETIONS.url})", custom_id)
    endpoint = endpoint_for(url)
    if isinstance(endpoint, UrlRefused):
        raise _Invalid(str(endpoint), custom_id)
    body = value.get("body")
    if not isinstance(body, dict):
        raise _Invalid("missing body" if body is None else f"body must be an object, got {_json_type(body)}", custom_id)
    messages = body.get("messages")
    if not isinstance(messages, list):
        what = "is missing" if messages is None else f"must be a list, got {_json_type(messages)}"
        raise _Invalid(f"body.messages {what}", custom_id)
    if not messages:
        raise _Invalid("body.messages is empty", custom_id)
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _Invalid(f"body.messages[{index}] must be an object, got {_json_type(message)}", custom_id)
    model = body.get("model")
    if model is None:
        raise _Invalid("body.model is missing (the OpenAI batch form names its model)", custom_id)
    if not isinstance(model, str) or not model.strip():
        raise _Invalid(f"body.model must be a non-empty string, got {_show(model)}", custom_id)
    if body.get("stream") not in (None, False):  # OpenAI's Batch API refuses it too
        raise _Invalid("body.stream must be false or absent: batch answers are read whole, not streamed", custom_id)
    return endpoint.url, body


def _simple_body(value: dict[str, Any], limits: BatchLimits, custom_id: str) -> dict[str, Any]:
    prompt = value.get("prompt")
    if prompt is None:
        raise _Invalid("missing prompt", custom_id)
    if not isinstance(prompt, str):
        raise _Invalid(f"prompt must be a string, got {_json_type(prompt)}", custom_id)
    if not prompt.strip():
        raise _Invalid("prompt is empty", custom_id)
    model = value.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise _Invalid(f"model must be a non-empty string, got {_show(model)}", custom_id)
    system = value.get("system")
    if system is not None and not isinstance(system, str):
        raise _Invalid(f"system must be a string, got {_json_type(system)}", custom_id)
    response_format = value.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise _Invalid(f"response_format must be an object, got {_json_type(response_format)}", custom_id)
    max_tokens = value.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise _Invalid(f"max_tokens must be a positive integer, got {_show(max_tokens)}", custom_id)
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
        raise _Invalid(f"missing {name}")
    if not isinstance(given, str):
        raise _Invalid(f"{name} must be a string, got {_json_type(given)}")
    if not given.strip():
        raise _Invalid(f"{name} is empty")
    try:
        size = len(given.encode("utf-8"))
    except UnicodeEncodeError:
        raise _Invalid(f"{name} {given!r} has an unpaired surrogate, not valid UTF-8") from None
    if size > MAX_CUSTOM_ID_BYTES:
        raise _Invalid(f"{name} is {size:,} bytes in UTF-8, over the {MAX_CUSTOM_ID_BYTES}-byte limit "
                       f"(starts {given[:40]!r})")
    return given


def _plausible_id(value: dict[str, Any]) -> str | None:
    """The id a broken line meant to have, to show with its error (and catch its duplicates)."""
    for name in ("custom_id", "id"):
        try:
            return _required_id(value, name)
        except _Invalid:
            continue
    return None


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False)[:80]
