"""Batch input lines: both line forms, every rejection reason, the body size limit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamproc.core.events import InferenceRequest
from streamproc.core.request_state import input_hash
from streamproc.core.tenancy import Tenancy
from streamproc.ops.input_lines import BatchLimits, LineError, parse_line

LIMITS = BatchLimits()
CHAT = "/v1/chat/completions"
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Label: Buy now!!!"}], "temperature": 0}


def batch_line(custom_id: Any = "req-1", **changes: Any) -> str:
    line = {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": BODY, **changes}
    return json.dumps({k: v for k, v in line.items() if v is not ...})


def parse(text: str, limits: BatchLimits = LIMITS) -> InferenceRequest | LineError | None:
    return parse_line(text, 7, limits, "batch-1", 1_700_000_000_000)


def sent(custom_id: str, body_json: str) -> InferenceRequest:
    """The request ``parse`` makes of a valid line with this id and body: keyed by (batch, custom_id)."""
    return InferenceRequest(f"batch-1/{custom_id}", body_json, url=CHAT, batch_id="batch-1",
                            submitted_ms=1_700_000_000_000)


# --- the OpenAI batch form ---------------------------------------------------------------------------------


def test_batch_form_keeps_the_body_compact_and_in_order() -> None:
    text = '{"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", ' \
           '"messages": [{"role": "user", "content": "Grüße 👋"}], "temperature": 0.5, "x_extra": [1, 2]}}'
    assert parse(text) == sent(
        "req-1", '{"model":"m","messages":[{"role":"user","content":"Grüße 👋"}],"temperature":0.5,"x_extra":[1,2]}'
    )


def test_same_body_spelt_differently_gives_the_same_body_json_and_hash() -> None:
    spaced = parse(batch_line())
    tight = parse(json.dumps(json.loads(batch_line()), separators=(",", ":")))
    escaped = parse(batch_line(body={**BODY, "messages": [{"role": "user", "content": "é"}]}))
    raw = parse(json.dumps(json.loads(batch_line(body={**BODY, "messages": [{"role": "user", "content": "é"}]})),
                           ensure_ascii=False))
    assert isinstance(spaced, InferenceRequest) and isinstance(tight, InferenceRequest)
    assert spaced.body_json == tight.body_json
    assert isinstance(escaped, InferenceRequest) and isinstance(raw, InferenceRequest)
    assert escaped.body_json == raw.body_json and '"content":"é"' in raw.body_json
    assert input_hash(escaped) == input_hash(raw)


def test_url_is_taken_from_the_line_among_the_supported_ones() -> None:
    request = parse(batch_line(url=CHAT))
    assert isinstance(request, InferenceRequest) and request.url == CHAT
    refused = parse(batch_line(url="/v1/completions"))
    assert isinstance(refused, LineError) and "not a supported endpoint" in refused.reason


# --- the simple form ---------------------------------------------------------------------------------------


def test_simple_form_minimal_gets_the_default_model() -> None:
    request = parse('{"id": "s-1", "prompt": "Say hi"}', BatchLimits(default_model="tiny"))
    assert request == sent("s-1", '{"model":"tiny","messages":[{"role":"user","content":"Say hi"}]}')


def test_simple_form_with_every_field() -> None:
    line = {"id": "s-2", "prompt": "Classify: spam?", "model": "big", "system": "Answer in JSON.",
            "response_format": {"type": "json_object"}, "max_tokens": 50}
    request = parse(json.dumps(line))
    assert isinstance(request, InferenceRequest)
    assert request.body_json == (
        '{"model":"big","messages":[{"role":"system","content":"Answer in JSON."},'
        '{"role":"user","content":"Classify: spam?"}],"response_format":{"type":"json_object"},"max_tokens":50}'
    )


def test_simple_form_null_optional_fields_count_as_absent() -> None:
    line = {"id": "s-3", "prompt": "p", "model": None, "system": None, "response_format": None, "max_tokens": None}
    request = parse(json.dumps(line))
    assert isinstance(request, InferenceRequest)
    assert json.loads(request.body_json) == {"model": "mock-small", "messages": [{"role": "user", "content": "p"}]}


@pytest.mark.parametrize("text", ["", "   ", "\t", "\r", " \r "])
def test_blank_lines_are_skipped(text: str) -> None:
    assert parse(text) is None


# --- rejection reasons -------------------------------------------------------------------------------------

NO_ID = None
REASONS: list[tuple[str, str | None, str]] = [
    ('{"custom_id": "a",', NO_ID, "invalid JSON: Expecting property name enclosed in double quotes (column 19)"),
    ("{'id': 'a'}", NO_ID, "invalid JSON: Expecting property name enclosed in double quotes (column 2)"),
    ('{"id": "a", "prompt": "p"} x', NO_ID, "invalid JSON: Extra data (column 28)"),
    ('{"id": "a", "prompt": NaN}', NO_ID, "invalid JSON: NaN is not a JSON value"),
    ('{"id": "a", "max_tokens": -Infinity}', NO_ID, "invalid JSON: -Infinity is not a JSON value"),
    ("[" * 100_000, NO_ID, "invalid JSON: nested too deeply"),
    ("\ufeff{}", NO_ID, "invalid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) (column 1)"),
    ('["custom_id", "a"]', NO_ID, "expected a JSON object, got array"),
    ('"hello"', NO_ID, "expected a JSON object, got string"),
    ("{}", NO_ID, "empty object: expected custom_id (OpenAI batch form) or id (simple form)"),
    ('{"custom-id": "a", "body": {}}', NO_ID,
     "unknown field 'custom-id' (OpenAI batch form: custom_id, method, url, body; "
     "simple form: id, prompt, model, system, response_format, max_tokens; beside either: tenant, priority)"),
    ('{"id": "a", "prompt": "p", "label": 1, "extra": 2}', "a",
     "unknown fields 'extra', 'label' (OpenAI batch form: custom_id, method, url, body; "
     "simple form: id, prompt, model, system, response_format, max_tokens; beside either: tenant, priority)"),
    (batch_line(model="gpt-4o"), "req-1",
     "mixes the OpenAI batch form (body, custom_id, method, url) with the simple form (model); use one"),
    ('{"id": "a", "prompt": "p", "body": {}}', "a",
     "mixes the OpenAI batch form (body) with the simple form (id, prompt); use one"),
    (batch_line(custom_id=...), NO_ID, "missing custom_id"),
    (batch_line(custom_id=None), NO_ID, "missing custom_id"),
    (batch_line(custom_id=17), NO_ID, "custom_id must be a string, got number"),
    (batch_line(custom_id=""), NO_ID, "custom_id is empty"),
    (batch_line(custom_id="  "), NO_ID, "custom_id is empty"),
    ('{"custom_id": "\\ud83d", "method": "POST"}', NO_ID,
     "custom_id '\\ud83d' has an unpaired surrogate, not valid UTF-8"),
    ('{"prompt": "p"}', NO_ID, "missing id"),
    ('{"id": ["a"], "prompt": "p"}', NO_ID, "id must be a string, got array"),
    ('{"id": "", "prompt": "p"}', NO_ID, "id is empty"),
    (batch_line(method=...), "req-1", "missing method (only POST is supported)"),
    (batch_line(method="GET"), "req-1", "unsupported method 'GET' (only POST is supported)"),
    (batch_line(method="post"), "req-1", "unsupported method 'post' (only POST is supported)"),
    (batch_line(method=1), "req-1", "unsupported method 1 (only POST is supported)"),
    (batch_line(url=...), "req-1", "missing url (supported: /v1/chat/completions)"),
    (batch_line(url="/v1/embeddings"), "req-1",
     "unsupported url '/v1/embeddings': not a supported endpoint (supported: /v1/chat/completions)"),
    (batch_line(url="/v1/chat/completions/"), "req-1",
     "unsupported url '/v1/chat/completions/': not a supported endpoint (supported: /v1/chat/completions)"),
    (batch_line(body=...), "req-1", "missing body"),
    (batch_line(body="{}"), "req-1", "body must be an object, got string"),
    (batch_line(body=[BODY]), "req-1", "body must be an object, got array"),
    (batch_line(body={"model": "m"}), "req-1", "body.messages is missing"),
    (batch_line(body={"model": "m", "messages": "hi"}), "req-1", "body.messages must be a list, got string"),
    (batch_line(body={"model": "m", "messages": {"role": "user"}}), "req-1",
     "body.messages must be a list, got object"),
    (batch_line(body={"model": "m", "messages": []}), "req-1", "body.messages is empty"),
    (batch_line(body={"model": "m", "messages": [{"role": "user", "content": "a"}, "b"]}), "req-1",
     "body.messages[1] must be an object, got string"),
    (batch_line(body={"messages": [{"role": "user", "content": "a"}]}), "req-1",
     "body.model is missing (the OpenAI batch form names its model)"),
    (batch_line(body={"model": "", "messages": [{"role": "user", "content": "a"}]}), "req-1",
     "body.model must be a non-empty string, got ''"),
    (batch_line(body={"model": 4, "messages": [{"role": "user", "content": "a"}]}), "req-1",
     "body.model must be a non-empty string, got 4"),
    (batch_line(body={"model": "m", "messages": [{"role": "user", "content": "a"}], "stream": True}), "req-1",
     "body.stream must be false or absent: batch answers are read whole, not streamed"),
    (batch_line(body={"model": "m", "messages": [{"role": "user", "content": "\ud800"}]}), "req-1",
     "body has an unpaired surrogate '\\ud800', not valid UTF-8"),
    ('{"id": "a"}', "a", "missing prompt"),
    ('{"id": "a", "prompt": null}', "a", "missing prompt"),
    ('{"id": "a", "prompt": ["p"]}', "a", "prompt must be a string, got array"),
    ('{"id": "a", "prompt": " \\n "}', "a", "prompt is empty"),
    ('{"id": "a", "prompt": "p", "model": ""}', "a", "model must be a non-empty string, got ''"),
    ('{"id": "a", "prompt": "p", "model": false}', "a", "model must be a non-empty string, got false"),
    ('{"id": "a", "prompt": "p", "system": 3}', "a", "system must be a string, got number"),
    ('{"id": "a", "prompt": "p", "response_format": "json"}', "a", "response_format must be an object, got string"),
    ('{"id": "a", "prompt": "p", "max_tokens": 0}', "a", "max_tokens must be a positive integer, got 0"),
    ('{"id": "a", "prompt": "p", "max_tokens": 1.5}', "a", "max_tokens must be a positive integer, got 1.5"),
    ('{"id": "a", "prompt": "p", "max_tokens": true}', "a", "max_tokens must be a positive integer, got true"),
    ('{"id": "a", "prompt": "p", "max_tokens": "9"}', "a", "max_tokens must be a positive integer, got '9'"),
]


@pytest.mark.parametrize(("text", "custom_id", "reason"), REASONS, ids=[r for _, _, r in REASONS])
def test_rejection_reason(text: str, custom_id: str | None, reason: str) -> None:
    assert parse(text) == LineError(7, custom_id, reason)


def test_line_error_reads_as_a_sentence() -> None:
    with_id = LineError(17, "abc", "body is 1,200,345 bytes, over the 1,048,576-byte limit")
    assert str(with_id) == "line 17 (custom_id 'abc'): body is 1,200,345 bytes, over the 1,048,576-byte limit"
    assert str(LineError(3, None, "expected a JSON object, got array")) == "line 3: expected a JSON object, got array"


# --- the body size limit -----------------------------------------------------------------------------------


def compact_size(body: dict[str, Any]) -> int:
    return len(json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode())


def test_body_exactly_at_the_limit_passes_one_byte_over_fails() -> None:
    size = compact_size(BODY)
    assert isinstance(parse(batch_line(), BatchLimits(max_body_bytes=size)), InferenceRequest)
    assert parse(batch_line(), BatchLimits(max_body_bytes=size - 1)) == LineError(
        7, "req-1", f"body is {size:,} bytes, over the {size - 1:,}-byte limit"
    )


def test_size_counts_utf8_bytes_of_the_compact_body_not_characters_or_spacing() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "é" * 10}]}
    size = compact_size(body)  # each é is 2 bytes
    assert size == len(json.dumps(body, separators=(",", ":"), ensure_ascii=False)) + 10
    line = json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": body}, indent=None)  # \u00e9 escapes
    assert len(line) > size + 30  # the line itself is much longer than the body it carries
    assert isinstance(parse(line, BatchLimits(max_body_bytes=size)), InferenceRequest)
    assert parse(line, BatchLimits(max_body_bytes=size - 1)) == LineError(
        7, "x", f"body is {size} bytes, over the {size - 1}-byte limit"
    )


def test_simple_form_size_is_measured_on_the_built_body() -> None:
    built = {"model": "mock-small", "messages": [{"role": "user", "content": "p" * 100}]}
    size = compact_size(built)
    line = json.dumps({"id": "s", "prompt": "p" * 100})
    assert isinstance(parse(line, BatchLimits(max_body_bytes=size)), InferenceRequest)
    assert parse(line, BatchLimits(max_body_bytes=size - 1)) == LineError(
        7, "s", f"body is {size} bytes, over the {size - 1}-byte limit"
    )


def test_the_default_limit_is_one_mebibyte_with_thousands_separators() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 1_048_576}]}
    reason = "body is 1,048,631 bytes, over the 1,048,576-byte limit"
    assert parse(batch_line(body=body)) == LineError(7, "req-1", reason)


def test_a_line_carries_the_submit_tenancy_unless_it_names_its_own() -> None:
    limits = BatchLimits(tenancy=Tenancy("team-a", "low"))
    plain = parse_line('{"id": "a", "prompt": "p"}', 1, limits, "b", 0)
    own = parse_line('{"id": "b", "prompt": "p", "tenant": "team-b", "priority": "high"}', 2, limits, "b", 0)
    nulls = parse_line('{"id": "c", "prompt": "p", "tenant": null}', 3, limits, "b", 0)
    assert isinstance(plain, InferenceRequest) and isinstance(own, InferenceRequest)
    assert isinstance(nulls, InferenceRequest)
    assert [(r.tenant, r.priority) for r in (plain, own, nulls)] == [("team-a", "low"), ("team-b", "high"),
                                                                     ("team-a", "low")]


def test_a_bad_tenant_on_a_line_is_refused_with_its_line_and_id() -> None:
    refused = parse_line('{"id": "a", "prompt": "p", "tenant": "no spaces"}', 7, BatchLimits(), "b", 0)
    assert isinstance(refused, LineError)
    assert str(refused) == ("line 7 (custom_id 'a'): tenant 'no spaces' is not a tenant name: letters, digits, '.', "
                            "'_' and '-', starting with a letter or digit")
