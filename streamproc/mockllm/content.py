"""Deterministic answer content derived from the request, clean or spoiled by a semantic fault.

Every answer carries the request's fingerprint (text answers show it, JSON answers put it in their
strings), so a test can check that a result belongs to its request. JSON is asked with ``response_format``
``json_object`` (any object) or ``json_schema`` (a value that satisfies the schema).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamproc.mockllm.injected_faults import FaultKind
from streamproc.mockllm.schemafill import fill_schema
from streamproc.mockllm.token_count import text_tokens

_WORDS = (
    "alpha", "batch", "stream", "token", "signal", "vector", "result", "answer", "model", "request",
    "kafka", "topic", "record", "offset", "label", "summary", "report", "insight", "sample", "metric",
    "cluster", "window", "context", "prompt", "value", "theme", "review", "detail", "source", "output",
    "steady", "quick", "clear", "brief", "exact", "plain", "solid", "fresh", "broad", "early",
    "shows", "finds", "notes", "marks", "keeps", "reads", "lists", "holds", "gives", "makes",
    "of", "and", "the", "with", "for", "from", "into", "over", "under", "near",
    "positive", "neutral", "negative", "mixed",
)  # fmt: skip

TEXT = "text"
JSON_OBJECT = "json_object"
JSON_SCHEMA = "json_schema"
PROMPT_HEAD_WORDS = 6


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class AnswerRequest:
    """What the answer depends on: the request's fingerprint, its prompt and the format asked for."""

    key: bytes  # the request's content key (identity.request_key)
    fingerprint: str
    prompt: str
    response_format: str = TEXT
    schema: Mapping[str, Any] | None = None
    max_tokens: int | None = None
    huge_bytes: int = 0  # the length of a huge_answer, in UTF-8 bytes


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class Answer:
    content: str
    finish_reason: str  # "stop" or "length"


def _phrases(seed: int) -> tuple[str, ...]:
    rng = random.Random(seed)
    return tuple(" ".join(rng.choices(_WORDS, k=rng.randint(4, 16))) for _ in range(256))


# Built once: an answer's words are two table look-ups by bytes of the request key (already a hash), which
# keeps the server's hot path cheap while 65,536 texts per choice are still possible.
_HEADS = _phrases(1)
_TAILS = _phrases(2)


def _words(key: bytes, index: int) -> str:
    at = (2 * index) % len(key)
    return f"{_HEADS[key[at]]} {_TAILS[key[(at + 1) % len(key)]]}"


def prompt_head(prompt: str) -> str:
    """The first words of the prompt (only its start is looked at: prompts can be long)."""
    return " ".join(prompt[:200].split()[:PROMPT_HEAD_WORDS])


def clean_text(request: AnswerRequest, index: int) -> str:
    """A plain-text answer: fingerprint, the first words of the prompt, then some stable words."""
    tag = request.fingerprint if index == 0 else f"{request.fingerprint}.{index}"
    return f'[{tag}] Re: "{prompt_head(request.prompt)}": {_words(request.key, index)}.'


def clean_json_value(request: AnswerRequest, index: int) -> Any:
    tag = request.fingerprint if index == 0 else f"{request.fingerprint}.{index}"
    if request.response_format == JSON_SCHEMA and request.schema is not None:
        return fill_schema(request.schema, tag)
    return {"answer": _words(request.key, index), "request": tag}


_ANSWER_ENCODER = json.JSONEncoder(ensure_ascii=False)  # the spacing a model writes: ", " and ": "


def _dump(value: Any) -> str:
    return _ANSWER_ENCODER.encode(value)


def break_schema(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """Valid JSON that fails the schema: a required field dropped, else the wrong top-level type."""
    required = schema.get("required") if schema is not None else None
    if isinstance(value, dict) and isinstance(required, list) and required:
        return {k: v for k, v in value.items() if k != required[0]}
    if schema is None:
        return {}
    return [] if isinstance(value, dict) else {}


def compose(request: AnswerRequest, index: int, fault: FaultKind | None) -> Answer:
    """The content and finish reason of choice ``index``, with a semantic fault or ``huge_answer`` applied (others
    ignored).

    A clean answer longer than ``max_tokens`` is cut and ends with ``length``, as a real model's would (a huge
    answer too).
    """
    if fault is FaultKind.EMPTY_CONTENT:
        return Answer("", "stop")
    wants_json = request.response_format in (JSON_OBJECT, JSON_SCHEMA)
    if wants_json:
        value = clean_json_value(request, index)
        if fault is FaultKind.SCHEMA_MISMATCH:
            value = break_schema(value, request.schema if request.response_format == JSON_SCHEMA else None)
        text = _dump(value)
        if fault is FaultKind.INVALID_JSON:
            text = text[:-1] + ","
    else:
        text = clean_text(request, index)
        if fault is FaultKind.INVALID_JSON:
            text = '{"answer": "' + text.replace('"', "'")
        elif fault is FaultKind.SCHEMA_MISMATCH:
            text = "{}"
    if fault is FaultKind.LENGTH:
        return Answer(text[: max(1, len(text) // 2)], "length")
    if fault is FaultKind.HUGE_ANSWER:
        text = _grown(text, request.huge_bytes, wants_json)
    limit = request.max_tokens
    if limit is not None and text_tokens(text) > limit:
        return Answer(text[: limit * 4], "length")
    return Answer(text, "stop")


def _grown(text: str, size: int, wants_json: bool) -> str:
    """``text`` grown to ``size`` bytes of UTF-8: a text answer repeated, a JSON answer followed by spaces (still
    the same value)."""
    missing = size - len(text.encode())
    if missing <= 0:
        return text
    if wants_json:
        return text + " " * missing
    unit = (text + " ").encode()
    return (unit * (size // len(unit) + 1))[:size].decode("utf-8", "ignore")
