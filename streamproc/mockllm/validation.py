"""Check request bodies the way OpenAI does, and reduce them to what the mock needs to answer.

Every malformed body becomes an OpenAI-style 400 (``InvalidRequest``), never an exception that would turn
into a 500: a client's business-layer handling is tested against the real shapes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streamproc.mockllm import error_bodies as errors
from streamproc.mockllm.content import JSON_OBJECT, JSON_SCHEMA, TEXT
from streamproc.mockllm.error_bodies import ErrorReply
from streamproc.mockllm.injected_faults import RequestTraits

CHAT = "chat"
COMPLETIONS = "completions"
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_ROLE_SET = frozenset(ROLES)
MAX_N = 128


class InvalidRequest(Exception):
    """The request is not acceptable; ``reply`` is the 400 to send."""

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(reply.body)
        self.reply = reply


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class ParsedRequest:
    """A checked chat or completions request, reduced to what decides the answer."""

    endpoint: str  # CHAT or COMPLETIONS
    model: str
    texts: tuple[str, ...]  # every prompt text, for token counts and [mock:...] markers
    prompts: tuple[str, ...]  # what each answer responds to (the last user message; each completion prompt)
    message_count: int
    image_parts: int
    prompt_token_ids: int  # completions prompts given as token ids
    max_tokens: int | None
    stream: bool
    include_usage: bool
    n: int
    response_format: str
    schema: Mapping[str, Any] | None

    @property
    def traits(self) -> RequestTraits:
        required = self.schema.get("required") if self.schema is not None else None
        return RequestTraits(
            stream=self.stream,
            wants_json=self.response_format != TEXT,
            has_required_fields=isinstance(required, list) and bool(required),
        )


def _fail(reply: ErrorReply) -> InvalidRequest:
    return InvalidRequest(reply)


def _require_object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise _fail(errors.invalid_type("body", "an object", body))
    return body


def _model(body: Mapping[str, Any]) -> str:
    if "model" not in body:
        raise _fail(errors.missing_parameter("model"))
    model = body["model"]
    if not isinstance(model, str):
        raise _fail(errors.invalid_type("model", "a string", model))
    return model


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer_in(low: int | None, high: int | None = None) -> _Check:
    def check(key: str, value: Any) -> None:
        if not _is_int(value):
            raise _fail(errors.invalid_type(key, "an integer", value))
        if (low is not None and value < low) or (high is not None and value > high):
            bound = f"at least {low}" if high is None else f"between {low} and {high}"
            raise _fail(errors.invalid_value(key, f"{value} is not {bound}."))

    return check


def _number_in(low: float, high: float) -> _Check:
    def check(key: str, value: Any) -> None:
        if not _is_number(value):
            raise _fail(errors.invalid_type(key, "a number", value))
        if not (math.isfinite(value) and low <= value <= high):
            raise _fail(errors.invalid_value(key, f"{value} is not between {low:g} and {high:g}."))

    return check


def _check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _fail(errors.invalid_type(key, "a boolean", value))


def _check_stop(key: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _fail(errors.invalid_type(key, "a string or an array of strings", value))
    if len(value) > 4:
        raise _fail(errors.invalid_value(key, "at most 4 stop sequences are allowed."))


def _check_stream_options(key: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise _fail(errors.invalid_type(key, "an object", value))
    usage = value.get("include_usage")
    if usage is not None:
        _check_bool(f"{key}.include_usage", usage)


_Check = Callable[[str, Any], None]

# The optional parameters that are checked (null means absent); others are ignored, as vLLM does.
_OPTION_CHECKS: dict[str, _Check] = {
    "max_tokens": _integer_in(1),
    "max_completion_tokens": _integer_in(1),
    "n": _integer_in(1, MAX_N),
    "temperature": _number_in(0.0, 2.0),
    "top_p": _number_in(0.0, 1.0),
    "presence_penalty": _number_in(-2.0, 2.0),
    "frequency_penalty": _number_in(-2.0, 2.0),
    "seed": _integer_in(None),
    "stop": _check_stop,
    "stream": _check_bool,
    "stream_options": _check_stream_options,
}


def _options(obj: Mapping[str, Any]) -> tuple[int | None, int, bool, bool]:
    """max_tokens, n, stream and include_usage, after checking every optional parameter present.

    One pass over the body's keys: the hot path pays only for the parameters a request has.
    """
    checks = _OPTION_CHECKS
    for key, value in obj.items():
        if value is not None:
            check = checks.get(key)
            if check is not None:
                check(key, value)
    max_tokens: int | None = obj.get("max_completion_tokens") or obj.get("max_tokens")
    stream = obj.get("stream") is True
    options = obj.get("stream_options")
    if options is not None and not stream:
        raise _fail(
            errors.invalid_value("stream_options", "'stream_options' is only allowed when 'stream' is enabled.")
        )
    include_usage = options is not None and options.get("include_usage") is True
    return max_tokens, obj.get("n") or 1, stream, include_usage


def _response_format(body: Mapping[str, Any]) -> tuple[str, Mapping[str, Any] | None]:
    value = body.get("response_format")
    if value is None:
        return TEXT, None
    if not isinstance(value, dict):
        raise _fail(errors.invalid_type("response_format", "an object", value))
    kind = value.get("type")
    if kind is None:
        raise _fail(errors.missing_parameter("response_format.type"))
    if kind not in (TEXT, JSON_OBJECT, JSON_SCHEMA):
        raise _fail(
            errors.invalid_value(
                "response_format.type", f"'{kind}' is not one of ['text', 'json_object', 'json_schema']."
            )
        )
    if kind != JSON_SCHEMA:
        return kind, None
    spec = value.get("json_schema")
    if spec is None:
        raise _fail(errors.missing_parameter("response_format.json_schema"))
    if not isinstance(spec, dict):
        raise _fail(errors.invalid_type("response_format.json_schema", "an object", spec))
    name = spec.get("name")
    if name is None:
        raise _fail(errors.missing_parameter("response_format.json_schema.name"))
    if not isinstance(name, str):
        raise _fail(errors.invalid_type("response_format.json_schema.name", "a string", name))
    schema = spec.get("schema")
    if schema is None:
        return JSON_OBJECT, None
    if not isinstance(schema, dict):
        raise _fail(errors.invalid_type("response_format.json_schema.schema", "an object", schema))
    return JSON_SCHEMA, schema


def _content_parts(parts: list[Any], where: str) -> tuple[str, int]:
    """The text of a content-part array and its number of image parts."""
    pieces: list[str] = []
    images = 0
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise _fail(errors.invalid_type(f"{where}[{j}]", "an object", part))
        kind = part.get("type")
        if not isinstance(kind, str):
            raise _fail(errors.missing_parameter(f"{where}[{j}].type"))
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise _fail(errors.invalid_type(f"{where}[{j}].text", "a string", text))
            pieces.append(text)
        elif kind in ("image_url", "input_image", "image"):
            images += 1
    return "\n".join(pieces), images


def _role_problem(where: str, role: Any) -> ErrorReply:
    if role is None:
        return errors.missing_parameter(f"{where}.role")
    return errors.invalid_value(f"{where}.role", f"{json.dumps(role)} is not one of {list(ROLES)}.")


def _other_content(where: str, role: str, content: Any) -> tuple[str, int]:
    """Message content that is not a plain string: parts, or none at all (an assistant's tool calls)."""
    if isinstance(content, list):
        return _content_parts(content, f"{where}.content")
    if content is None and role == "assistant":
        return "", 0
    if content is None:
        raise _fail(errors.missing_parameter(f"{where}.content"))
    raise _fail(errors.invalid_type(f"{where}.content", "a string or an array of content parts", content))


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class _Messages:
    texts: tuple[str, ...]
    last_user: str
    images: int


def _messages(body: Mapping[str, Any]) -> _Messages:
    if "messages" not in body:
        raise _fail(errors.missing_parameter("messages"))
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _fail(errors.invalid_type("messages", "an array", messages))
    if not messages:
        raise _fail(errors.invalid_value("messages", "[] is too short - 'messages' needs at least one message."))
    texts: list[str] = []
    last_user = ""
    images = 0
    for i, message in enumerate(messages):  # the hot path: error texts are built only on failure
        if not isinstance(message, dict):
            raise _fail(errors.invalid_type(f"messages[{i}]", "an object", message))
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLE_SET:
            raise _fail(_role_problem(f"messages[{i}]", role))
        content = message.get("content")
        if isinstance(content, str):
            text = content
        else:
            text, found = _other_content(f"messages[{i}]", role, content)
            images += found
        name = message.get("name")
        if name is not None and not isinstance(name, str):
            raise _fail(errors.invalid_type(f"messages[{i}].name", "a string", name))
        texts.append(text)
        if role == "user":
            last_user = text
    return _Messages(tuple(texts), last_user, images)


def parse_chat(body: Any) -> ParsedRequest:
    """Check a ``POST /v1/chat/completions`` body."""
    obj = _require_object(body)
    model = _model(obj)
    scan = _messages(obj)
    max_tokens, n, stream, include_usage = _options(obj)
    response_format, schema = _response_format(obj) if "response_format" in obj else (TEXT, None)
    return ParsedRequest(
        CHAT,
        model,
        scan.texts,
        (scan.last_user or scan.texts[-1],),
        len(scan.texts),
        scan.images,
        0,
        max_tokens,
        stream,
        include_usage,
        n,
        response_format,
        schema,
    )


def _prompts(body: Mapping[str, Any]) -> tuple[tuple[str, ...], int]:
    """Completions prompts: a string, strings, token ids, or lists of token ids; returns (texts, token ids)."""
    if "prompt" not in body:
        raise _fail(errors.missing_parameter("prompt"))
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return (prompt,), 0
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt), 0
        if all(_is_int(p) for p in prompt):
            return (" ".join(str(p) for p in prompt),), len(prompt)
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
            return tuple(" ".join(str(t) for t in p) for p in prompt), sum(len(p) for p in prompt)
    if isinstance(prompt, list) and not prompt:
        raise _fail(errors.invalid_value("prompt", "[] is too short - 'prompt' needs at least one prompt."))
    raise _fail(errors.invalid_type("prompt", "a string, an array of strings or an array of token arrays", prompt))


def parse_completion(body: Any) -> ParsedRequest:
    """Check a ``POST /v1/completions`` body (the legacy text completions API that vLLM also serves)."""
    obj = _require_object(body)
    model = _model(obj)
    prompts, token_ids = _prompts(obj)
    max_tokens, n, stream, include_usage = _options(obj)
    texts = () if token_ids else prompts
    return ParsedRequest(
        COMPLETIONS, model, texts, prompts, 0, 0, token_ids, max_tokens, stream, include_usage, n, TEXT, None
    )
