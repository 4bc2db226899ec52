"""Results and failure events as JSON (design §3, "JSON out"): written by STREAMPROC_RECORD_FORMAT=json, read by
``codec.decode`` beside Avro, and described by schemas/*.schema.json, which must follow the .avsc files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from streamproc import codec
from streamproc.codec import CodecError, CodecErrorCode
from streamproc.codec.json_schema import json_schema, json_schema_text, schema_file_name
from streamproc.codec.records import Event
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from tests.unit.codec.test_codec import FAILURE, RESULT, ROUND_TRIP_CASES, SCHEMA_DIR

JSON_CASES = {name: event for name, event in ROUND_TRIP_CASES.items() if type(event) in codec.JSON_EVENT_TYPES}


def _file_schema(record_type: type[Any]) -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / schema_file_name(record_type)).read_text(encoding="utf-8"))  # type: ignore[no-any-return]


@pytest.mark.parametrize("event", JSON_CASES.values(), ids=JSON_CASES.keys())
def test_json_round_trips_through_the_same_decode_as_avro(event: Event) -> None:
    encoded = codec.encode_json(event)
    assert encoded[:1] == b"{"
    assert codec.decode(encoded, type(event)) == event
    assert codec.decode(codec.encode(event), type(event)) == event  # Avro beside it, as on a mixed topic


@pytest.mark.parametrize("event", JSON_CASES.values(), ids=JSON_CASES.keys())
def test_every_json_event_follows_its_schema_file(event: Event) -> None:
    Draft202012Validator(_file_schema(type(event))).validate(json.loads(codec.encode_json(event)))


@pytest.mark.parametrize("record_type", codec.JSON_EVENT_TYPES)
def test_the_schema_files_are_in_step_with_the_avro_schemas(record_type: type[Event]) -> None:
    path = SCHEMA_DIR / schema_file_name(record_type)
    assert path.read_text(encoding="utf-8") == json_schema_text(record_type), (
        f"{path} does not follow {record_type.__name__}.avsc: run python -m streamproc.codec.json_schema")
    Draft202012Validator.check_schema(json_schema(record_type))


@pytest.mark.parametrize("record_type", codec.JSON_EVENT_TYPES)
def test_a_json_schema_names_every_avro_field_and_requires_those_without_a_default(record_type: type[Event]) -> None:
    avro = codec.avro_schema(record_type)
    schema = _file_schema(record_type)
    assert list(schema["properties"]) == [field["name"] for field in avro["fields"]]
    assert schema["required"] == [field["name"] for field in avro["fields"] if "default" not in field]


def test_a_field_the_object_lacks_takes_its_avro_default_and_unknown_fields_are_ignored() -> None:
    written = json.loads(codec.encode_json(RESULT))
    for name in ("provider_request_id", "reused_from", "deployment"):  # added later, with defaults
        del written[name]
    written["from_a_newer_writer"] = {"x": 1}
    assert codec.decode(json.dumps(written).encode(), InferenceResult) == RESULT


def test_nested_defaults_are_filled_and_not_shared() -> None:
    written = json.loads(codec.encode_json(FAILURE))
    del written["request"]["metadata"], written["run"]
    first = codec.decode(json.dumps(written).encode(), FailureEvent)
    second = codec.decode(json.dumps(written).encode(), FailureEvent)
    assert first.request.metadata == {} and first.run == 0
    assert first.request.metadata is not second.request.metadata


def test_missing_required_fields_are_all_named() -> None:
    written = json.loads(codec.encode_json(FAILURE))
    del written["layer"], written["request"]["body_json"]
    with pytest.raises(CodecError) as caught:
        codec.decode(json.dumps(written).encode(), FailureEvent)
    assert caught.value.code is CodecErrorCode.MISSING_FIELDS
    assert "request.body_json, layer" in caught.value.message


@pytest.mark.parametrize(("change", "expected"), [
    ({"attempts": "2"}, CodecErrorCode.CORRUPT_BODY),
    ({"attempts": 2**40}, CodecErrorCode.CORRUPT_BODY),
    ({"batch_id": 7}, CodecErrorCode.CORRUPT_BODY),
])
def test_a_value_of_the_wrong_type_is_a_corrupt_body(change: dict[str, Any], expected: CodecErrorCode) -> None:
    written = {**json.loads(codec.encode_json(RESULT)), **change}
    with pytest.raises(CodecError) as caught:
        codec.decode(json.dumps(written).encode(), InferenceResult)
    assert caught.value.code is expected


def test_an_unknown_layer_and_text_that_is_no_json_are_refused() -> None:
    written = {**json.loads(codec.encode_json(FAILURE)), "layer": "cosmic"}
    with pytest.raises(CodecError) as caught:
        codec.decode(json.dumps(written).encode(), FailureEvent)
    assert caught.value.code is CodecErrorCode.CORRUPT_BODY
    with pytest.raises(CodecError) as caught:
        codec.decode(b'{"request_id": ', InferenceResult)
    assert caught.value.code is CodecErrorCode.CORRUPT_BODY


def test_a_json_event_is_read_as_the_type_it_is_asked_for() -> None:
    with pytest.raises(CodecError) as caught:
        codec.decode(codec.encode_json(RESULT), FailureEvent)
    assert caught.value.code is CodecErrorCode.MISSING_FIELDS


def test_requests_and_states_are_never_json() -> None:
    with pytest.raises(CodecError) as caught:
        codec.decode(b'{"request_id": "r", "body_json": "{}"}', InferenceRequest)
    assert caught.value.code is CodecErrorCode.UNKNOWN_FRAMING
    with pytest.raises(TypeError):
        codec.encode_json(dataclasses.replace(RESULT)) and json_schema(InferenceRequest)


def test_the_schema_files_sit_beside_the_avro_schemas() -> None:
    assert {p.name for p in Path(SCHEMA_DIR).glob("*.schema.json")} == {
        schema_file_name(t) for t in codec.JSON_EVENT_TYPES}
