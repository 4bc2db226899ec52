"""A JSON request on the request topic: read by the rules submit reads a line with, plus its batch, tenant and
priority (design §3, "JSON requests")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamproc import codec
from streamproc.codec.json_request import BATCH_HEADER
from streamproc.core.events import InferenceRequest
from streamproc.core.request_line import LineLimits
from streamproc.core.tenancy import PRIORITY_HEADER, TENANT_HEADER
from streamproc.ops.input_lines import BatchLimits, LineError, parse_line

LIMITS = LineLimits(max_body_bytes=4096, default_model="default-model")
NOW = 1_700_000_000_000
BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
BATCH_LINE = {"custom_id": "r-1", "method": "POST", "url": "/v1/chat/completions", "body": BODY}


def read(value: dict[str, Any] | bytes, hdrs: dict[str, bytes] | None = None
         ) -> InferenceRequest | codec.InvalidJsonRequest:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return codec.read_json_request(raw, hdrs or {}, LIMITS, NOW)


def test_the_first_byte_tells_json_from_both_avro_framings() -> None:
    avro = codec.encode(InferenceRequest("r", "{}"))
    assert codec.is_json(b'{"id": "x"}')
    assert not codec.is_json(avro) and not codec.is_json(codec.encode_confluent(InferenceRequest("r", "{}"), 7))
    assert not codec.is_json(b' {"id": "x"}') and not codec.is_json(b"") and not codec.is_json(None)


def test_an_openai_batch_line_with_a_batch_field_is_keyed_as_submit_keys_it() -> None:
    request = read({**BATCH_LINE, "batch_id": "b-1"})
    assert request == InferenceRequest("b-1/r-1", json.dumps(BODY, separators=(",", ":")), batch_id="b-1",
                                       submitted_ms=NOW)


def test_a_request_without_a_batch_is_a_stream_request_keyed_by_its_custom_id() -> None:
    request = read({"id": "s-1", "prompt": "Label this", "max_tokens": 5})
    assert isinstance(request, InferenceRequest)
    assert (request.request_id, request.batch_id) == ("s-1", None)
    assert json.loads(request.body_json) == {"model": "default-model", "max_tokens": 5,
                                             "messages": [{"role": "user", "content": "Label this"}]}


def test_batch_tenant_and_priority_come_from_fields_or_headers_and_are_carried() -> None:
    from_fields = read({**BATCH_LINE, "batch_id": "b", "tenant": "team-a", "priority": "high"})
    from_headers = read(BATCH_LINE, {BATCH_HEADER: b"b", TENANT_HEADER: b"team-a", PRIORITY_HEADER: b"high"})
    assert from_fields == from_headers
    assert isinstance(from_fields, InferenceRequest)
    assert (from_fields.request_id, from_fields.tenant, from_fields.priority) == ("b/r-1", "team-a", "high")
    assert from_fields.metadata == {}
    plain = read(BATCH_LINE)
    assert isinstance(plain, InferenceRequest)
    assert (plain.tenant, plain.priority) == ("default", "normal")  # neither given


@pytest.mark.parametrize(("value", "hdrs", "reason"), [
    ({**BATCH_LINE, "batch_id": "a"}, {BATCH_HEADER: b"b"}, "batch_id 'a' and header x-batch-id 'b' differ; give one"),
    ({**BATCH_LINE, "tenant": 7}, {}, "tenant must be a string, got number"),
    ({**BATCH_LINE, "priority": " "}, {}, "priority is empty"),
    (BATCH_LINE, {TENANT_HEADER: b"\xff"}, "header x-tenant is not valid UTF-8"),
    ({**BATCH_LINE, "tenant": "t" * 257}, {},
     f"tenant is 257 bytes in UTF-8, over the 256-byte limit (starts {'t' * 40!r})"),
    ({**BATCH_LINE, "tenant": "t" * 65}, {}, f"tenant is 65 characters, over the 64-character limit (starts "
                                             f"{'t' * 20!r})"),
    (BATCH_LINE, {TENANT_HEADER: b"team a"}, "tenant 'team a' is not a tenant name: letters, digits, '.', '_' "
                                             "and '-', starting with a letter or digit"),
    ({**BATCH_LINE, "priority": "urgent"}, {}, "priority 'urgent' is not a priority (one of high, normal, low)"),
])
def test_bad_carried_fields_are_refused_with_the_reason(value: dict[str, Any], hdrs: dict[str, bytes],
                                                        reason: str) -> None:
    invalid = read(value, hdrs)
    assert isinstance(invalid, codec.InvalidJsonRequest)
    assert invalid.reason == reason


BAD_LINES: list[dict[str, Any] | str] = [
    {**BATCH_LINE, "method": "GET"},
    {**BATCH_LINE, "url": "/v1/completions"},
    {**BATCH_LINE, "url": "https://evil.example/v1/chat/completions"},
    {**BATCH_LINE, "body": {"model": "gpt-test", "messages": []}},
    {**BATCH_LINE, "body": {"messages": [{"role": "user", "content": "x"}]}},
    {**BATCH_LINE, "body": {**BODY, "model": "bad name"}},
    {**BATCH_LINE, "body": {**BODY, "stream": True}},
    {**BATCH_LINE, "body": {**BODY, "pad": "x" * 5000}},
    {**BATCH_LINE, "custom-id": "typo"},
    {**BATCH_LINE, "prompt": "mixed"},
    {"id": "s", "prompt": ""},
    {"id": "s", "prompt": "p", "max_tokens": 0},
    {"id": 5, "prompt": "p"},
    {"custom_id": "c" * 600, "method": "POST"},
    {},
    '{"id": "s", "prompt": NaN}',
    '{"id": "s", "prompt": "p"',
]


@pytest.mark.parametrize("line", BAD_LINES)
def test_an_invalid_request_gets_the_reason_submit_gives_its_line(line: dict[str, Any] | str) -> None:
    text = line if isinstance(line, str) else json.dumps(line)
    refused = parse_line(text, 1, BatchLimits(max_body_bytes=LIMITS.max_body_bytes,
                                              default_model=LIMITS.default_model), "b", NOW)
    invalid = read(text.encode())
    assert isinstance(refused, LineError) and isinstance(invalid, codec.InvalidJsonRequest)
    if "unknown field" in refused.reason:  # a record also allows its batch, and says so
        assert invalid.reason == refused.reason.replace("beside either: tenant, priority)",
                                                        "beside either: batch_id, tenant, priority)")
    else:
        assert invalid.reason == refused.reason


@pytest.mark.parametrize(("value", "hdrs", "request_id"), [
    ({**BATCH_LINE, "method": "GET"}, {}, "r-1"),  # a stream request: its custom_id
    ({**BATCH_LINE, "method": "GET", "batch_id": "b"}, {}, "b/r-1"),
    ({**BATCH_LINE, "method": "GET"}, {BATCH_HEADER: b"b"}, "b/r-1"),
    ({**BATCH_LINE, "bogus": 1, "batch_id": "b"}, {}, "b/r-1"),  # named even beside an unknown field
    ({**BATCH_LINE, "batch_id": "a/b"}, {}, None),  # a batch id that is none: the scope is unknown
    ({**BATCH_LINE, "batch_id": "b", "tenant": 1}, {}, "b/r-1"),
    ({"method": "POST"}, {}, None),
])
def test_an_invalid_request_names_the_id_its_failure_is_filed_under_when_it_can_be_known(
        value: dict[str, Any], hdrs: dict[str, bytes], request_id: str | None) -> None:
    invalid = read(value, hdrs)
    assert isinstance(invalid, codec.InvalidJsonRequest)
    assert invalid.request_id == request_id
    assert invalid.batch_id == (request_id.partition("/")[0] if request_id and "/" in request_id else None)


def test_invalid_utf8_and_text_that_is_no_json_name_no_id() -> None:
    assert read(b'{"id": "\xff"}') == codec.InvalidJsonRequest(None, "not valid UTF-8: byte 0xff at byte 9")
    assert read(b"{not json").request_id is None
