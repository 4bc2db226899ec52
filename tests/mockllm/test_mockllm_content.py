"""Answer content: deterministic, tied to its request, valid against the asked JSON Schema unless spoiled."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import jsonschema
import pytest

from streamproc.mockllm.content import JSON_OBJECT, JSON_SCHEMA, AnswerRequest, compose
from streamproc.mockllm.content_key import fingerprint, request_fingerprint, request_key
from streamproc.mockllm.injected_faults import FaultKind
from streamproc.mockllm.responses import completion_json, split_content, stream_frames
from streamproc.mockllm.schemafill import fill_schema
from streamproc.mockllm.token_count import chat_prompt_tokens, text_tokens

LABEL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["positive", "neutral", "negative"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "reasons": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    },
    "required": ["label", "score", "reasons"],
    "additionalProperties": False,
}

SCHEMAS: list[dict[str, Any]] = [
    LABEL_SCHEMA,
    {"type": "string", "minLength": 40, "maxLength": 50},
    {"type": "integer", "minimum": 10, "maximum": 12, "multipleOf": 2},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3},
    {"type": "number", "exclusiveMinimum": 5},
    {"type": ["null", "boolean"]},
    {"enum": [1, "two", None]},
    {"const": {"fixed": True}},
    {"type": "array", "items": {"type": "integer"}, "minItems": 4, "uniqueItems": True},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "items": False},
    {
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "date-time"},
            "mail": {"type": "string", "format": "email"},
            "id": {"type": "string", "format": "uuid"},
        },
        "required": ["when", "mail", "id"],
    },
    {
        "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
        "type": "object",
        "properties": {"people": {"type": "array", "items": {"$ref": "#/$defs/person"}}},
        "required": ["people"],
    },
    {
        "definitions": {"leaf": {"type": "integer", "minimum": 3}},
        "anyOf": [{"type": "null"}, {"$ref": "#/definitions/leaf"}],
    },
    {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}]},
    {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "boolean"}}, "required": ["b"]},
        ]
    },
    {"type": "object", "required": ["only_named"]},
    {"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}},
    {
        "type": "object",
        "properties": {"tree": {"$ref": "#"}, "value": {"type": "integer"}},
        "required": ["value"],
    },
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[str(i) for i in range(len(SCHEMAS))])
def test_generated_values_validate(schema: dict[str, Any]) -> None:
    for seed in ("a1b2c3", "ffff00", "000000"):
        value = fill_schema(schema, seed)
        jsonschema.validate(value, schema)
        assert fill_schema(schema, seed) == value


def test_string_values_carry_the_seed() -> None:
    value = fill_schema({"type": "object", "properties": {"summary": {"type": "string"}}}, "abc123")
    assert value == {"summary": "summary-abc123"}


def request(fmt: str = "text", schema: dict[str, Any] | None = None, max_tokens: int | None = None) -> AnswerRequest:
    key = request_key({"prompt": "x"})
    return AnswerRequest(key, fingerprint(key), "Summarise the quarterly report for the board", fmt, schema, max_tokens)


def test_text_answers_are_stable_and_show_their_request() -> None:
    answer = compose(request(), 0, None)
    assert answer == compose(request(), 0, None)
    assert answer.finish_reason == "stop"
    assert answer.content.startswith(f'[{request().fingerprint}] Re: "Summarise the quarterly report for the"')
    assert compose(request(), 1, None).content != answer.content


def test_json_object_answers_are_objects() -> None:
    value = json.loads(compose(request(JSON_OBJECT), 0, None).content)
    assert isinstance(value, dict)
    assert value["request"] == request().fingerprint


def test_json_schema_answers_validate() -> None:
    value = json.loads(compose(request(JSON_SCHEMA, LABEL_SCHEMA), 0, None).content)
    jsonschema.validate(value, LABEL_SCHEMA)


def test_semantic_faults_spoil_the_answer_detectably() -> None:
    schema_request = request(JSON_SCHEMA, LABEL_SCHEMA)
    assert compose(schema_request, 0, FaultKind.EMPTY_CONTENT).content == ""
    with pytest.raises(json.JSONDecodeError):
        json.loads(compose(schema_request, 0, FaultKind.INVALID_JSON).content)
    mismatch = json.loads(compose(schema_request, 0, FaultKind.SCHEMA_MISMATCH).content)
    assert "label" not in mismatch
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(mismatch, LABEL_SCHEMA)
    cut = compose(schema_request, 0, FaultKind.LENGTH)
    assert cut.finish_reason == "length"
    assert compose(schema_request, 0, None).content.startswith(cut.content)
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.content)


def test_a_huge_answer_is_the_clean_answer_grown_to_its_size() -> None:
    size = 3_000_001
    text = compose(replace(request(), huge_bytes=size), 0, FaultKind.HUGE_ANSWER)
    assert (len(text.content.encode()), text.finish_reason) == (size, "stop")
    assert text.content.startswith(compose(request(), 0, None).content)
    as_json = compose(replace(request(JSON_SCHEMA, LABEL_SCHEMA), huge_bytes=size), 0, FaultKind.HUGE_ANSWER)
    assert len(as_json.content.encode()) == size
    jsonschema.validate(json.loads(as_json.content), LABEL_SCHEMA)  # the same value, spaces after it
    cut = compose(replace(request(max_tokens=10), huge_bytes=size), 0, FaultKind.HUGE_ANSWER)
    assert (len(cut.content), cut.finish_reason) == (40, "length")  # max_tokens bounds it, as a real model's


def test_transport_faults_leave_the_content_alone() -> None:
    assert compose(request(), 0, FaultKind.RESET) == compose(request(), 0, None)


def test_a_small_max_tokens_cuts_the_answer_like_a_real_model() -> None:
    answer = compose(request(max_tokens=3), 0, None)
    assert answer.finish_reason == "length"
    assert len(answer.content) == 12


def test_fingerprint_ignores_key_order_and_whitespace() -> None:
    assert request_fingerprint({"a": 1, "b": [1, 2]}) == request_fingerprint(json.loads('{ "b": [1,2], "a": 1 }'))
    assert request_fingerprint({"a": 1}) != request_fingerprint({"a": 2})
    assert request_fingerprint({"text": "h\u00e9llo \ud800"}) == request_fingerprint({"text": "h\u00e9llo \ud800"})


def test_token_estimates() -> None:
    assert text_tokens("") == 0
    assert text_tokens("abcd") == 1
    assert text_tokens("abcde") == 2
    assert chat_prompt_tokens(["a" * 400], 1) == 100 + 4 + 3
    assert chat_prompt_tokens(["x", "y"], 2, image_parts=1) == 2 + 8 + 85 + 3


def test_completion_json_has_the_openai_shape() -> None:
    answers = [compose(request(), 0, None), compose(request(), 1, FaultKind.LENGTH)]
    body = json.loads(completion_json("chat", "chatcmpl-x", 123, "mock-small", answers, 10, 20))
    assert body["object"] == "chat.completion"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": answers[0].content, "refusal": None}
    text = json.loads(completion_json("completions", "cmpl-x", 1, "m\u00e9", answers[:1], 1, 2))
    assert text["object"] == "text_completion"
    assert text["model"] == "m\u00e9"
    assert text["choices"][0]["text"] == answers[0].content


def test_split_content_joins_back() -> None:
    for text in ["", "a", "one two three four five six seven", "x" * 101]:
        parts = split_content(text)
        assert "".join(parts) == text
        assert len(parts) <= 5


def test_stream_frames_rebuild_the_answer() -> None:
    answer = compose(request(), 0, None)
    frames = stream_frames("chat", "chatcmpl-x", 1, "mock-small", [answer], 10, 20, include_usage=True)
    assert frames[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(f.removeprefix(b"data: ")) for f in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == answer.content
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 30
