"""The Avro codec: round trips, the framing bytes on the wire, precise errors, and the schema files as contract."""

from __future__ import annotations

import dataclasses
import io
import json
import random
import types
import typing
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form

from streamproc import codec
from streamproc.codec import (
    Codec,
    CodecError,
    CodecErrorCode,
    Event,
    decode,
    encode,
    encode_confluent,
    from_avro,
    peek_request_id,
    to_avro,
    writer_schemas,
)
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RepairContext, RequestState
from streamproc.core.vocabulary import FailureLayer, RequestStatus

SCHEMA_DIR = Path(__file__).resolve().parents[3] / "schemas"
EVENT_TYPES: list[type[Event]] = [InferenceRequest, InferenceResult, FailureEvent, RequestState]

BODY_1KB = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 960}]})
UNICODE = "Grüße, 世界 🌍 — e\u0301 \u0000 \u202e right-to-left \U0001f9ea"


def _request(**changes: Any) -> InferenceRequest:
    return dataclasses.replace(InferenceRequest(request_id="req-1", body_json=BODY_1KB), **changes)


FULL_REQUEST = InferenceRequest(
    request_id="batch-7/req-00042",
    body_json=BODY_1KB,
    url="/v1/chat/completions",
    batch_id="batch-7",
    submitted_ms=1_735_689_600_123,
    repair=RepairContext(bad_output='{"answer": ', reason="invalid JSON: unexpected end of input"),
    metadata={"team": "labelling", "priority": "high"},
)
RESULT = InferenceResult(
    request_id="req-1",
    batch_id="batch-7",
    model="gpt-4o-mini",
    response_json='{"id": "chatcmpl-1", "choices": [{"message": {"content": "ok"}}]}',
    content="ok",
    attempts=2,
    latency_ms=812,
    completed_ms=1_735_689_601_000,
    input_hash="sha256:" + "ab" * 32,
)
FAILURE = FailureEvent(
    request=FULL_REQUEST,
    layer=FailureLayer.SERVICE,
    error_code="rate_limit_exceeded",
    message="429 Too Many Requests: try again in 1.2s",
    attempt=3,
    terminal=False,
    first_failure_ms=1_735_689_600_500,
    last_failure_ms=1_735_689_602_500,
    http_status=429,
    retry_after_ms=1200,
    deployment="gpt-4o-mini@2",
)
STATE = RequestState(
    request_id="req-1",
    status=RequestStatus.RETRYING,
    input_hash="sha256:" + "cd" * 32,
    attempts=3,
    batch_id="batch-7",
    last_layer=FailureLayer.SEMANTIC,
    last_error_code="invalid_json",
    created_ms=1_735_689_600_000,
    updated_ms=1_735_689_603_000,
    source_topic="llm.retry.30s",
    source_offset=2**40,
)

ROUND_TRIP_CASES: dict[str, Event] = {
    "request-minimal": InferenceRequest(request_id="r", body_json="{}"),
    "request-full": FULL_REQUEST,
    "request-unicode": _request(
        request_id=UNICODE, body_json=json.dumps({"content": UNICODE}, ensure_ascii=False),
        batch_id=UNICODE, repair=RepairContext(bad_output=UNICODE, reason=UNICODE), metadata={UNICODE: UNICODE},
    ),
    "request-empty-strings": _request(request_id="", body_json="", url="", batch_id="", metadata={"": ""}),
    "request-large-body": _request(body_json=json.dumps({"content": "é" * 2_000_000})),
    "request-extreme-ints": _request(submitted_ms=-(2**63)),
    "result": RESULT,
    "result-no-batch": dataclasses.replace(RESULT, batch_id=None, content=UNICODE, latency_ms=2**63 - 1),
    "failure": FAILURE,
    "failure-optional-null": dataclasses.replace(
        FAILURE, request=InferenceRequest(request_id="r", body_json="{}"), layer=FailureLayer.TRANSPORT,
        http_status=None, retry_after_ms=None, terminal=True,
    ),
    "state": STATE,
    "state-defaults": RequestState(request_id="r", status=RequestStatus.PENDING, input_hash="h"),
}
ROUND_TRIP_CASES.update(
    {f"failure-{layer.value}": dataclasses.replace(FAILURE, layer=layer) for layer in FailureLayer}
)
ROUND_TRIP_CASES.update(
    {f"state-{status.value}": dataclasses.replace(STATE, status=status) for status in RequestStatus}
)


def _schema_file(record_type: type[Any]) -> dict[str, Any]:
    return typing.cast(dict[str, Any], json.loads((SCHEMA_DIR / f"{record_type.__name__}.avsc").read_text()))


def _expected_fingerprint(record_type: type[Any]) -> bytes:
    canonical = to_parsing_canonical_form(_schema_file(record_type))
    return bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


def _lookup(schemas: Mapping[int, Any]) -> Callable[[int], Any]:
    """An in-memory schema registry: id -> schema; raises KeyError for an unknown id, as a registry would."""
    return schemas.__getitem__


def _error(data: bytes | None, expected: type[Event] = InferenceRequest, **kwargs: Any) -> CodecError:
    with pytest.raises(CodecError) as caught:
        decode(data, expected, **kwargs)
    return caught.value


# --- round trips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("record", ROUND_TRIP_CASES.values(), ids=ROUND_TRIP_CASES.keys())
def test_every_record_survives_a_round_trip(record: Event) -> None:
    decoded = decode(encode(record), type(record))

    assert decoded == record
    assert type(decoded) is type(record)


def test_decoded_enums_are_the_python_enums_not_bare_strings() -> None:
    failure = decode(encode(FAILURE), FailureEvent)
    state = decode(encode(STATE), RequestState)

    assert type(failure.layer) is FailureLayer
    assert type(state.status) is RequestStatus
    assert type(state.last_layer) is FailureLayer


def test_optional_nested_record_is_none_or_a_repair_context() -> None:
    assert decode(encode(_request(repair=None)), InferenceRequest).repair is None
    repaired = decode(encode(FULL_REQUEST), InferenceRequest).repair
    assert repaired == RepairContext(bad_output='{"answer": ', reason="invalid JSON: unexpected end of input")


@pytest.mark.parametrize("record", [FULL_REQUEST, RESULT, FAILURE, STATE], ids=lambda r: type(r).__name__)
def test_avro_dict_conversion_is_lossless(record: Event) -> None:
    datum = to_avro(record)

    assert from_avro(datum, type(record)) == record
    assert json.loads(json.dumps(datum)) == datum  # plain data: strings, numbers, None, dicts


def test_enums_are_written_as_their_avro_symbols() -> None:
    assert to_avro(FAILURE)["layer"] == "service"
    assert to_avro(STATE)["status"] == "retrying"
    assert to_avro(STATE)["last_layer"] == "semantic"


# --- the bytes on the wire -----------------------------------------------------------------------------


@pytest.mark.parametrize("record", [FULL_REQUEST, RESULT, FAILURE, STATE], ids=lambda r: type(r).__name__)
def test_single_object_framing_is_c3_01_then_the_crc64_fingerprint_then_plain_avro(record: Event) -> None:
    data = encode(record)
    schema = _schema_file(type(record))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), to_avro(record))

    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == _expected_fingerprint(type(record))
    assert data[2:10] == codec.schema_fingerprint(type(record))
    assert data[10:] == body.getvalue()
    # any Avro reader with the .avsc file reads the body: nothing streamproc-specific inside
    assert fastavro.schemaless_reader(io.BytesIO(data[10:]), schema, None) == to_avro(record)


def test_fingerprint_bytes_are_little_endian_as_in_the_avro_reference_implementations() -> None:
    # The Avro test suites give CRC-64-AVRO("int") = 0x7275d51a3f395c8f, framed as C3 01 8F 5C 39 3F 1A D5 75 72.
    assert bytes.fromhex(fingerprint('"int"', "CRC-64-AVRO")) == bytes.fromhex("8f5c393f1ad57572")


def _rabin_fingerprint_per_spec(data: bytes) -> bytes:
    """The 64-bit Rabin fingerprint exactly as the Avro specification describes it, written out independently."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


@pytest.mark.parametrize("record_type", EVENT_TYPES, ids=lambda t: t.__name__)
def test_framed_fingerprint_matches_an_independent_rabin_of_the_canonical_form(record_type: type[Event]) -> None:
    canonical = to_parsing_canonical_form(_schema_file(record_type))

    assert canonical.startswith('{"name":"io.streamproc.' + record_type.__name__ + '"')
    assert '"doc"' not in canonical and '"default"' not in canonical  # canonical form drops both
    assert codec.schema_fingerprint(record_type) == _rabin_fingerprint_per_spec(canonical.encode())


def test_the_four_schemas_have_distinct_fingerprints() -> None:
    assert len({codec.schema_fingerprint(t) for t in EVENT_TYPES}) == 4


def test_confluent_framing_is_zero_then_big_endian_schema_id() -> None:
    data = encode_confluent(RESULT, 0x01020304)

    assert data[:5] == b"\x00\x01\x02\x03\x04"
    assert data[5:] == encode(RESULT)[10:]


@pytest.mark.parametrize("schema_id", [-1, 2**31])
def test_confluent_schema_id_must_fit_a_java_int(schema_id: int) -> None:
    with pytest.raises(ValueError, match="schema id"):
        encode_confluent(RESULT, schema_id)


# --- Confluent wire format -----------------------------------------------------------------------------


@pytest.mark.parametrize("record", [FULL_REQUEST, RESULT, FAILURE, STATE], ids=lambda r: type(r).__name__)
def test_confluent_round_trip_with_an_in_memory_registry(record: Event) -> None:
    lookup = _lookup({17: codec.avro_schema(type(record))})

    assert decode(encode_confluent(record, 17), type(record), schema_lookup=lookup) == record


def test_confluent_lookup_may_return_schema_json_text() -> None:
    lookup = _lookup({5: json.dumps(codec.avro_schema(InferenceResult))})

    assert decode(encode_confluent(RESULT, 5), InferenceResult, schema_lookup=lookup) == RESULT


def test_confluent_schema_is_looked_up_once_per_id() -> None:
    calls: list[int] = []
    schema = codec.avro_schema(InferenceRequest)

    def lookup(schema_id: int) -> dict[str, Any]:
        calls.append(schema_id)
        return schema

    local = Codec()
    for _ in range(3):
        assert local.decode(local.encode_confluent(FULL_REQUEST, 9), InferenceRequest, schema_lookup=lookup)
    assert calls == [9]


def test_confluent_without_a_lookup_says_a_registry_is_needed() -> None:
    error = _error(encode_confluent(FULL_REQUEST, 42))

    assert error.code is CodecErrorCode.NO_SCHEMA_LOOKUP
    assert "schema id 42" in str(error) and "no schema registry lookup" in str(error)


def test_confluent_unknown_schema_id() -> None:
    error = _error(encode_confluent(FULL_REQUEST, 42), schema_lookup=_lookup({1: codec.avro_schema(InferenceRequest)}))

    assert error.code is CodecErrorCode.UNKNOWN_SCHEMA
    assert "schema id 42" in str(error) and "KeyError" in str(error)


def test_confluent_truncated_header() -> None:
    error = _error(b"\x00\x00\x01", schema_lookup=_lookup({}))

    assert error.code is CodecErrorCode.TRUNCATED
    assert "3 bytes, need 5" in str(error)


@pytest.mark.parametrize(
    ("schema", "detail"),
    [
        ('"string"', 'is "string", not a record'),
        ('["null", "string"]', "not a record"),
        ("{not json", "not valid JSON"),
        ({"type": "record", "name": "X", "fields": [{"name": "a", "type": "NoSuchType"}]}, "invalid Avro schema"),
    ],
)
def test_confluent_unusable_writer_schema(schema: Any, detail: str) -> None:
    error = _error(encode_confluent(FULL_REQUEST, 3), schema_lookup=_lookup({3: schema}))

    assert error.code is CodecErrorCode.INVALID_SCHEMA
    assert detail in str(error)


def test_confluent_wrong_record_type_names_the_schema_id() -> None:
    error = _error(encode_confluent(RESULT, 8), schema_lookup=_lookup({8: codec.avro_schema(InferenceResult)}))

    assert error.code is CodecErrorCode.WRONG_RECORD_TYPE
    assert "io.streamproc.InferenceResult" in str(error) and "Confluent schema id 8" in str(error)


# --- precise errors ------------------------------------------------------------------------------------


def test_codec_error_is_a_value_error_with_a_code_and_a_message() -> None:
    error = _error(b"")

    assert isinstance(error, ValueError)
    assert error.code is CodecErrorCode.EMPTY_PAYLOAD
    assert error.message == str(error)
    assert "empty_payload" in repr(error)


@pytest.mark.parametrize(("data", "what"), [(b"", "empty payload (0 bytes)"), (None, "null payload")])
def test_empty_payload(data: bytes | None, what: str) -> None:
    error = _error(data)

    assert error.code is CodecErrorCode.EMPTY_PAYLOAD
    assert what in str(error)


def test_random_bytes_have_unknown_framing_and_the_message_shows_the_magic() -> None:
    rng = random.Random(4)
    for _ in range(200):
        data = rng.randbytes(rng.randint(1, 64))
        if data[:1] == b"\x00" or data[:2] == b"\xc3\x01":
            continue
        error = _error(data)
        assert error.code is CodecErrorCode.UNKNOWN_FRAMING
        assert f"unknown framing magic {data[:2].hex(' ')}" in str(error)


def test_json_text_is_recognised_as_not_avro() -> None:
    error = _error(b'  {"custom_id": "req-1", "body": {}}')

    assert error.code is CodecErrorCode.UNKNOWN_FRAMING
    assert "looks like JSON" in str(error)


def test_unknown_fingerprint_is_printed_in_hex() -> None:
    error = _error(b"\xc3\x01" + bytes.fromhex("0123456789abcdef") + b"\x02x")

    assert error.code is CodecErrorCode.UNKNOWN_SCHEMA
    assert "fingerprint 0123456789abcdef" in str(error)


@pytest.mark.parametrize("size", range(2, 10))
def test_truncated_single_object_header(size: int) -> None:
    error = _error(encode(FULL_REQUEST)[:size])

    assert error.code is CodecErrorCode.TRUNCATED
    assert f"{size} bytes, need 10" in str(error)


@pytest.mark.parametrize("record", [FULL_REQUEST, RESULT, FAILURE, STATE], ids=lambda r: type(r).__name__)
def test_every_truncation_of_the_body_is_reported_as_truncated(record: Event) -> None:
    data = encode(record)
    step = max(1, (len(data) - 10) // 300)  # every cut for small records; ~300 cuts of the 1 KB bodies
    for cut in [*range(10, len(data), step), len(data) - 1]:
        error = _error(data[:cut], type(record))
        assert error.code is CodecErrorCode.TRUNCATED, (cut, error)
        assert f"truncated io.streamproc.{type(record).__name__} body: its {cut - 10} bytes" in str(error)


def test_trailing_bytes_mean_a_corrupt_body() -> None:
    error = _error(encode(FULL_REQUEST) + b"\x00\x00")

    assert error.code is CodecErrorCode.CORRUPT_BODY
    assert "2 unread bytes" in str(error)


def test_invalid_utf8_in_a_string_is_a_corrupt_body() -> None:
    data = encode(_request(request_id="abc"))
    corrupt = data[:11] + b"\xff" + data[12:]  # first byte of request_id's text

    error = _error(corrupt)

    assert error.code is CodecErrorCode.CORRUPT_BODY
    assert "not valid UTF-8" in str(error)


def test_enum_index_out_of_range_is_a_corrupt_body() -> None:
    data = bytearray(encode(dataclasses.replace(FAILURE, layer=FailureLayer.TRANSPORT)))
    layer_at = len(encode(FULL_REQUEST))  # the layer follows the embedded request in the body
    assert data[layer_at] == 0  # zigzag 0 = transport
    data[layer_at] = 0x10  # index 8: no such layer

    error = _error(bytes(data), FailureEvent)

    assert error.code is CodecErrorCode.CORRUPT_BODY


def test_random_bodies_behind_a_valid_header_only_ever_raise_codec_errors() -> None:
    rng = random.Random(7)
    header = encode(FULL_REQUEST)[:10]
    codes = set()
    for _ in range(500):
        data = header + rng.randbytes(rng.randint(0, 200))
        try:
            decode(data, InferenceRequest)
        except CodecError as error:
            codes.add(error.code)
    assert codes <= {CodecErrorCode.TRUNCATED, CodecErrorCode.CORRUPT_BODY}
    assert CodecErrorCode.TRUNCATED in codes


@pytest.mark.parametrize(
    ("written", "expected"),
    [(w, e) for w in EVENT_TYPES for e in EVENT_TYPES if w is not e],
    ids=lambda t: t.__name__,
)
def test_wrong_record_type_names_both_types(written: type[Event], expected: type[Event]) -> None:
    record: dict[type[Event], Event] = {
        InferenceRequest: FULL_REQUEST, InferenceResult: RESULT, FailureEvent: FAILURE, RequestState: STATE,
    }

    error = _error(encode(record[written]), expected)

    assert error.code is CodecErrorCode.WRONG_RECORD_TYPE
    assert f"expected record io.streamproc.{expected.__name__}" in str(error)
    assert f"payload is a io.streamproc.{written.__name__}" in str(error)
    assert codec.schema_fingerprint(written).hex() in str(error)


def test_encoding_a_value_of_the_wrong_type_is_an_unencodable_codec_error() -> None:
    bad = _request(metadata={"attempt": 3})

    with pytest.raises(CodecError) as caught:
        encode(bad)

    assert caught.value.code is CodecErrorCode.UNENCODABLE
    assert "io.streamproc.InferenceRequest" in str(caught.value) and "metadata" in str(caught.value)


def test_a_type_that_is_not_an_event_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="RepairContext is not a streamproc event type"):
        encode(RepairContext("x", "y"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dict is not a streamproc event type"):
        decode(encode(RESULT), dict)  # type: ignore[type-var]


# --- peek_request_id -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "request_id"),
    [(FULL_REQUEST, "batch-7/req-00042"), (RESULT, "req-1"), (FAILURE, "batch-7/req-00042"), (STATE, "req-1")],
    ids=lambda value: type(value).__name__,
)
def test_peek_reads_the_request_id_of_every_known_record_type(record: Event, request_id: str) -> None:
    assert peek_request_id(encode(record)) == request_id


def test_peek_recovers_the_id_when_the_body_is_cut_after_it() -> None:
    data = encode(FAILURE)
    id_end = 10 + 1 + len(FULL_REQUEST.request_id)  # header, zigzag length (< 64 chars: one byte), text

    assert peek_request_id(data[:id_end]) == FULL_REQUEST.request_id
    assert peek_request_id(data[: id_end - 1]) is None


def test_peek_reads_unicode_ids() -> None:
    assert peek_request_id(encode(_request(request_id=UNICODE))) == UNICODE


def test_peek_gives_up_on_an_empty_id() -> None:
    assert peek_request_id(encode(_request(request_id=""))) is None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        None,
        b"\xc3\x01" + bytes(8) + b"\x06abc",  # unknown fingerprint: never guess from an unknown schema
        b"\xc3\x01\x01",
        b"\x00\x00\x00\x00\x01\x06abc",  # Confluent without a lookup
        b"random \x00 bytes",
        b"{not json",
        b'{"id": "no request_id here"}',
        b'{"request_id": 42}',
        b"[1, 2]",
    ],
)
def test_peek_returns_none_when_the_id_cannot_be_known(data: bytes | None) -> None:
    assert peek_request_id(data) is None


def test_peek_reads_invalid_utf8_ids_as_unknown() -> None:
    data = encode(_request(request_id="abc"))

    assert peek_request_id(data[:11] + b"\xff" + data[12:]) is None


@pytest.mark.parametrize(
    ("text", "request_id"),
    [
        (b'{"custom_id": "req-9", "method": "POST", "url": "/v1/chat/completions", "body": {}}', "req-9"),
        (b'{"request_id": "req-8", "body_json": "{}"}', "req-8"),
        (b'{"request": {"request_id": "req-7"}, "layer": "business"}', "req-7"),
    ],
)
def test_peek_reads_json_text_produced_by_mistake(text: bytes, request_id: str) -> None:
    assert peek_request_id(text) == request_id


def test_peek_with_a_confluent_lookup() -> None:
    lookup = _lookup({3: codec.avro_schema(FailureEvent)})

    assert peek_request_id(encode_confluent(FAILURE, 3), schema_lookup=lookup) == FULL_REQUEST.request_id
    assert peek_request_id(encode_confluent(FAILURE, 4), schema_lookup=lookup) is None


def test_peek_uses_registered_foreign_schemas_with_a_request_id() -> None:
    foreign = {
        "type": "record",
        "name": "LegacyJob",
        "namespace": "com.example",
        "fields": [{"name": "priority", "type": "int"}, {"name": "request_id", "type": "string"}],
    }
    local = Codec()
    fp = local.register_writer_schema(foreign)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(foreign), {"priority": 5, "request_id": "legacy-1"})
    data = b"\xc3\x01" + fp + body.getvalue()

    assert local.peek_request_id(data) == "legacy-1"
    assert peek_request_id(data) is None  # the shared codec has not registered it
    with pytest.raises(CodecError) as caught:
        local.decode(data, InferenceRequest)
    assert caught.value.code is CodecErrorCode.WRONG_RECORD_TYPE


# --- the schema files are the contract -----------------------------------------------------------------


def test_the_package_loads_the_top_level_schemas_the_single_source() -> None:
    """``streamproc/codec/schemas`` is a link to ``schemas/``: one hand-kept copy, which a built wheel ships
    as files (setuptools follows the link)."""
    shipped = Path(str(resources.files("streamproc.codec").joinpath("schemas")))

    assert shipped.is_symlink()
    assert shipped.resolve() == SCHEMA_DIR.resolve()
    assert sorted(path.name for path in shipped.glob("*.avsc")) == [
        "FailureEvent.avsc", "InferenceRequest.avsc", "InferenceResult.avsc", "RequestState.avsc"]


def _walk_records(schema: Any) -> list[dict[str, Any]]:
    if isinstance(schema, list):
        return [record for branch in schema for record in _walk_records(branch)]
    if isinstance(schema, dict) and schema.get("type") == "record":
        nested = [record for field in schema["fields"] for record in _walk_records(field["type"])]
        return [schema, *nested]
    return []


@pytest.mark.parametrize("record_type", EVENT_TYPES, ids=lambda t: t.__name__)
def test_schema_fields_match_the_dataclass_fields_in_order(record_type: type[Event]) -> None:
    for record in _walk_records(_schema_file(record_type)):
        cls = {"InferenceRequest": InferenceRequest, "RepairContext": RepairContext}.get(
            record["name"], record_type
        )
        assert [f["name"] for f in record["fields"]] == [f.name for f in dataclasses.fields(cls)], record["name"]


@pytest.mark.parametrize("record_type", EVENT_TYPES, ids=lambda t: t.__name__)
def test_every_record_and_field_is_documented_and_namespaced(record_type: type[Event]) -> None:
    schema = _schema_file(record_type)

    assert schema["namespace"] == "io.streamproc"
    for record in _walk_records(schema):
        assert record.get("doc"), record["name"]
        for field in record["fields"]:
            assert field.get("doc"), f"{record['name']}.{field['name']}"


@pytest.mark.parametrize("record_type", [*EVENT_TYPES, RepairContext], ids=lambda t: t.__name__)
def test_optional_fields_are_null_first_unions_defaulting_to_null_and_defaults_match(
    record_type: type[Any],
) -> None:
    schema = next(r for t in EVENT_TYPES for r in _walk_records(_schema_file(t)) if r["name"] == record_type.__name__)
    hints = typing.get_type_hints(record_type)
    for field in dataclasses.fields(record_type):
        avro = next(f for f in schema["fields"] if f["name"] == field.name)
        optional = isinstance(hints[field.name], types.UnionType) and type(None) in typing.get_args(hints[field.name])
        if optional:
            assert isinstance(avro["type"], list) and avro["type"][0] == "null", field.name
            assert "default" in avro and avro["default"] is None, field.name
        else:
            assert not (isinstance(avro["type"], list) and "null" in avro["type"]), field.name
        if field.default is not dataclasses.MISSING:
            assert avro["default"] == field.default, field.name
        elif field.default_factory is not dataclasses.MISSING:
            assert avro["default"] == field.default_factory(), field.name
        elif not optional:
            assert "default" not in avro, field.name


def test_enum_symbols_are_the_python_enum_values() -> None:
    enums = {
        node["name"]: node["symbols"]
        for t in EVENT_TYPES
        for record in _walk_records(_schema_file(t))
        for field in record["fields"]
        for node in (field["type"] if isinstance(field["type"], list) else [field["type"]])
        if isinstance(node, dict) and node.get("type") == "enum"
    }

    assert enums == {
        "FailureLayer": [layer.value for layer in FailureLayer],
        "RequestStatus": [status.value for status in RequestStatus],
    }


def test_failure_event_embeds_exactly_the_inference_request_schema() -> None:
    failure = _schema_file(FailureEvent)
    embedded = next(f["type"] for f in failure["fields"] if f["name"] == "request")

    assert embedded == _schema_file(InferenceRequest)


def test_state_and_failure_share_one_failure_layer_enum() -> None:
    layer = next(f["type"] for f in _schema_file(FailureEvent)["fields"] if f["name"] == "layer")
    last_layer = next(f["type"] for f in _schema_file(RequestState)["fields"] if f["name"] == "last_layer")

    assert last_layer == ["null", layer]


def test_schemas_are_parsed_once_at_import_not_per_record(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("schema parsed or fingerprinted per record")

    for name in ("parse_schema", "to_parsing_canonical_form", "fingerprint"):
        monkeypatch.setattr(writer_schemas, name, forbidden)  # the module that parses and fingerprints
    for record in (FULL_REQUEST, RESULT, FAILURE, STATE):
        assert decode(encode(record), type(record)) == record
        assert peek_request_id(encode(record))
