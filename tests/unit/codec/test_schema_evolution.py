"""Schema evolution: records written with another version of a schema are read with the current one.

The rule the contract follows (Avro schema resolution): a field may be added only with a default; a reader
fills the defaults of fields the writer did not have and skips the writer's fields it does not know. These
tests write with an "old" (or "future") schema and read with the current one through the codec.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form

from streamproc import codec
from streamproc.codec import Codec, CodecError, CodecErrorCode, Event, avro_schema, framing, to_avro, writer_schemas
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RepairContext, RequestState
from streamproc.core.vocabulary import FailureLayer, RequestStatus

EVENT_TYPES: list[type[Event]] = [InferenceRequest, InferenceResult, FailureEvent, RequestState]
REQUEST = InferenceRequest(
    request_id="req-1",
    body_json='{"model": "m", "messages": []}',
    batch_id="batch-1",
    submitted_ms=1_735_689_600_000,
    repair=RepairContext("{", "invalid JSON"),
    metadata={"k": "v"},
)
RESULT = InferenceResult("req-1", "batch-1", "m", "{}", "ok", 1, 250, 1_735_689_601_000, "hash")
FAILURE = FailureEvent(REQUEST, FailureLayer.SEMANTIC, "invalid_json", "not JSON", 1, False, 10, 10, 200, None)
STATE = RequestState("req-1", RequestStatus.IN_FLIGHT, "hash", 1, "batch-1", None, None, 5, 6, "llm.requests", 41)
SAMPLES: dict[type[Event], Event] = {
    InferenceRequest: REQUEST, InferenceResult: RESULT, FailureEvent: FAILURE, RequestState: STATE,
}


def _without(schema: dict[str, Any], *names: str) -> dict[str, Any]:
    """A copy of ``schema`` as an older version would have it: without the named (later added) fields."""
    old = copy.deepcopy(schema)
    old["fields"] = [field for field in old["fields"] if field["name"] not in names]
    return old


def _with_field(schema: dict[str, Any], field: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(schema)
    new["fields"].append(field)
    return new


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(field for field in schema["fields"] if field["name"] == name)


def _avro_body(schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), datum)
    return body.getvalue()


def _single_object(schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    """What a producer holding ``schema`` writes: C3 01 + that schema's fingerprint + the Avro body."""
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    return b"\xc3\x01" + fp + _avro_body(schema, datum)


# --- old writer, current reader: added fields with defaults --------------------------------------------

REQUEST_V1 = _without(avro_schema(InferenceRequest), "url", "submitted_ms", "repair", "metadata")
OLD_REQUEST_DATUM = {"request_id": "old-1", "body_json": '{"model": "m"}', "batch_id": "b-0"}
OLD_REQUEST_DECODED = InferenceRequest(request_id="old-1", body_json='{"model": "m"}', batch_id="b-0")


def test_an_old_writer_schema_is_unknown_until_registered() -> None:
    data = _single_object(REQUEST_V1, OLD_REQUEST_DATUM)

    with pytest.raises(CodecError) as caught:
        Codec().decode(data, InferenceRequest)

    assert caught.value.code is CodecErrorCode.UNKNOWN_SCHEMA
    assert data[2:10].hex() in str(caught.value)


def test_a_registered_old_request_reads_with_the_defaults_of_the_fields_added_since() -> None:
    local = Codec()
    fp = local.register_writer_schema(REQUEST_V1)
    data = _single_object(REQUEST_V1, OLD_REQUEST_DATUM)

    decoded = local.decode(data, InferenceRequest)

    assert fp == data[2:10]
    assert fp != codec.schema_fingerprint(InferenceRequest)
    assert decoded == OLD_REQUEST_DECODED
    assert (decoded.url, decoded.submitted_ms, decoded.repair, decoded.metadata) == (
        "/v1/chat/completions", 0, None, {},
    )
    assert local.peek_request_id(data) == "old-1"


def test_the_module_level_codec_accepts_registrations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(framing, "_DEFAULT_CODEC", Codec())  # keep the registration out of other tests
    data = _single_object(REQUEST_V1, OLD_REQUEST_DATUM)

    codec.register_writer_schema(REQUEST_V1)

    assert codec.decode(data, InferenceRequest) == OLD_REQUEST_DECODED


def test_an_old_failure_event_with_an_old_embedded_request_reads_with_defaults() -> None:
    failure_v1 = _without(avro_schema(FailureEvent), "http_status", "retry_after_ms")
    _field(failure_v1, "request")["type"] = copy.deepcopy(REQUEST_V1)
    datum = {
        "request": OLD_REQUEST_DATUM, "layer": "business", "error_code": "context_length_exceeded",
        "message": "too long", "attempt": 1, "terminal": True, "first_failure_ms": 1, "last_failure_ms": 1,
    }
    local = Codec()
    local.register_writer_schema(failure_v1)

    decoded = local.decode(_single_object(failure_v1, datum), FailureEvent)

    assert decoded == FailureEvent(
        request=OLD_REQUEST_DECODED, layer=FailureLayer.BUSINESS, error_code="context_length_exceeded",
        message="too long", attempt=1, terminal=True, first_failure_ms=1, last_failure_ms=1,
        http_status=None, retry_after_ms=None,
    )


def test_a_state_written_before_the_source_fields_existed_reads_them_as_none() -> None:
    state_v1 = _without(avro_schema(RequestState), "source_topic", "source_offset")
    datum = {k: v for k, v in to_avro(STATE).items() if k not in ("source_topic", "source_offset")}
    local = Codec()
    local.register_writer_schema(state_v1)

    decoded = local.decode(_single_object(state_v1, datum), RequestState)

    assert (decoded.source_topic, decoded.source_offset) == (None, None)
    assert decoded == dataclasses.replace(STATE, source_topic=None, source_offset=None)


def test_an_old_schema_from_a_registry_needs_no_registration() -> None:
    def lookup(schema_id: int) -> dict[str, Any]:
        return {7: REQUEST_V1}[schema_id]

    data = b"\x00" + (7).to_bytes(4, "big") + _avro_body(REQUEST_V1, OLD_REQUEST_DATUM)

    assert Codec().decode(data, InferenceRequest, schema_lookup=lookup) == OLD_REQUEST_DECODED


@pytest.mark.parametrize("record_type", EVENT_TYPES, ids=lambda t: t.__name__)
@pytest.mark.parametrize(
    "added",
    [
        {"name": "added_later", "type": ["null", "string"], "default": None},
        {"name": "added_rank", "type": "int", "default": 5},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": ["a"]},
    ],
    ids=["nullable", "int", "array"],
)
def test_a_next_version_with_an_added_defaulted_field_reads_todays_records(
    record_type: type[Event], added: dict[str, Any]
) -> None:
    current = avro_schema(record_type)
    next_version = _with_field(current, added)
    record = SAMPLES[record_type]
    body = codec.encode(record)[10:]

    read = fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(current),
                                      fastavro.parse_schema(next_version))

    assert read == {**to_avro(record), added["name"]: added["default"]}


# --- fields without defaults ---------------------------------------------------------------------------


def test_a_writer_lacking_fields_the_reader_requires_fails_naming_every_one() -> None:
    result_v0 = _without(avro_schema(InferenceResult), "model", "input_hash")
    datum = {k: v for k, v in to_avro(RESULT).items() if k not in ("model", "input_hash")}
    local = Codec()
    local.register_writer_schema(result_v0)

    with pytest.raises(CodecError) as caught:
        local.decode(_single_object(result_v0, datum), InferenceResult)

    assert caught.value.code is CodecErrorCode.MISSING_FIELDS
    assert "lacks required field(s) model, input_hash" in str(caught.value)
    assert "no default" in str(caught.value)


def test_a_missing_field_inside_the_embedded_request_is_named_by_its_path() -> None:
    failure = avro_schema(FailureEvent)
    _field(failure, "request")["type"] = _without(_field(failure, "request")["type"], "body_json")
    datum = to_avro(FAILURE)
    del datum["request"]["body_json"]
    local = Codec()
    local.register_writer_schema(failure)

    with pytest.raises(CodecError) as caught:
        local.decode(_single_object(failure, datum), FailureEvent)

    assert caught.value.code is CodecErrorCode.MISSING_FIELDS
    assert "request.body_json" in str(caught.value)


def test_a_poison_request_from_a_foreign_producer_missing_fields_still_yields_its_id() -> None:
    foreign = {
        "type": "record", "name": "InferenceRequest", "namespace": "io.streamproc",
        "fields": [{"name": "request_id", "type": "string"}, {"name": "prompt", "type": "string"}],
    }
    data = b"\x00" + (99).to_bytes(4, "big") + _avro_body(foreign, {"request_id": "r-9", "prompt": "hi"})
    lookup: Callable[[int], Any] = {99: foreign}.__getitem__
    local = Codec()

    with pytest.raises(CodecError) as caught:
        local.decode(data, InferenceRequest, schema_lookup=lookup)

    assert caught.value.code is CodecErrorCode.MISSING_FIELDS
    assert "body_json" in str(caught.value) and "Confluent schema id 99" in str(caught.value)
    assert local.peek_request_id(data, schema_lookup=lookup) == "r-9"


# --- newer writer, current reader ----------------------------------------------------------------------


def test_fields_a_newer_writer_added_are_skipped() -> None:
    newer = _with_field(avro_schema(InferenceResult), {"name": "cost_usd", "type": "double", "default": 0.0})
    local = Codec()
    local.register_writer_schema(newer)

    decoded = local.decode(_single_object(newer, {**to_avro(RESULT), "cost_usd": 0.0042}), InferenceResult)

    assert decoded == RESULT


def test_a_newer_failure_layer_symbol_is_an_incompatible_schema_but_known_symbols_still_read() -> None:
    newer = avro_schema(FailureEvent)
    _field(newer, "layer")["type"]["symbols"].append("quota")
    local = Codec()
    local.register_writer_schema(newer)

    assert local.decode(_single_object(newer, to_avro(FAILURE)), FailureEvent) == FAILURE
    with pytest.raises(CodecError) as caught:
        local.decode(_single_object(newer, {**to_avro(FAILURE), "layer": "quota"}), FailureEvent)

    assert caught.value.code is CodecErrorCode.INCOMPATIBLE_SCHEMA
    assert "quota" in str(caught.value)


def test_numeric_promotion_int_to_long_is_allowed() -> None:
    narrower = avro_schema(InferenceResult)
    _field(narrower, "latency_ms")["type"] = "int"
    local = Codec()
    local.register_writer_schema(narrower)

    assert local.decode(_single_object(narrower, to_avro(RESULT)), InferenceResult) == RESULT


def test_a_changed_field_type_is_an_incompatible_schema_with_a_readable_message() -> None:
    changed = avro_schema(InferenceResult)
    _field(changed, "attempts")["type"] = "string"
    local = Codec()
    local.register_writer_schema(changed)

    with pytest.raises(CodecError) as caught:
        local.decode(_single_object(changed, {**to_avro(RESULT), "attempts": "one"}), InferenceResult)

    assert caught.value.code is CodecErrorCode.INCOMPATIBLE_SCHEMA
    assert "io.streamproc.InferenceResult" in str(caught.value)
    assert len(str(caught.value)) < 450  # fastavro's own message prints whole schemas


# --- registration --------------------------------------------------------------------------------------


def test_registering_the_current_schema_is_harmless_and_returns_its_fingerprint() -> None:
    local = Codec()

    assert local.register_writer_schema(avro_schema(RequestState)) == codec.schema_fingerprint(RequestState)
    assert local.decode(local.encode(STATE), RequestState) == STATE


def test_registrations_stay_in_their_codec() -> None:
    Codec().register_writer_schema(REQUEST_V1)

    with pytest.raises(CodecError) as caught:
        Codec().decode(_single_object(REQUEST_V1, OLD_REQUEST_DATUM), InferenceRequest)
    assert caught.value.code is CodecErrorCode.UNKNOWN_SCHEMA


@pytest.mark.parametrize(
    "schema",
    [
        '"string"',
        "{",
        ["null", "string"],
        {"type": "record", "name": "X", "fields": [{"name": "a", "type": "NoSuchType"}]},
        {"type": "record", "fields": []},
    ],
)
def test_registering_an_unusable_schema_is_an_invalid_schema_error(schema: Any) -> None:
    with pytest.raises(CodecError) as caught:
        Codec().register_writer_schema(schema)

    assert caught.value.code is CodecErrorCode.INVALID_SCHEMA


def test_avro_schema_returns_a_copy_that_callers_may_change() -> None:
    changed = avro_schema(InferenceRequest)
    changed["fields"].clear()

    assert avro_schema(InferenceRequest)["fields"]
    assert codec.decode(codec.encode(REQUEST), InferenceRequest) == REQUEST


def test_a_renamed_field_found_through_its_alias_is_not_missing() -> None:
    writer = {"type": "record", "name": "R", "fields": [{"name": "old_name", "type": "string"}]}
    reader = {"type": "record", "name": "R", "fields": [
        {"name": "new_name", "type": "string", "aliases": ["old_name"]},
        {"name": "required", "type": "int"},
    ]}

    assert writer_schemas._missing_fields(writer, reader) == ["required"]


def test_a_state_written_by_the_previous_release_still_decodes() -> None:
    """``schemas/history/RequestState-1.avsc`` is the schema before ``next_topic``/``next_offset``: a table
    written by that release must decode after the upgrade, with no registration by the user."""
    import json
    from pathlib import Path

    old = json.loads((Path(__file__).parents[3] / "schemas/history/RequestState-1.avsc").read_text())
    buffer = io.BytesIO()
    old_state = {"request_id": "req-1", "status": "retrying", "input_hash": "h", "attempts": 2, "batch_id": None,
                 "last_layer": "service", "last_error_code": "rate_limited", "created_ms": 5, "updated_ms": 6,
                 "source_topic": None, "source_offset": None}
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(old), old_state)
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(old), "CRC-64-AVRO"))
    decoded = codec.decode(b"\xc3\x01" + fp + buffer.getvalue(), RequestState)
    assert decoded == RequestState("req-1", RequestStatus.RETRYING, "h", 2, None, FailureLayer.SERVICE,
                                   "rate_limited", 5, 6)
    assert (decoded.next_topic, decoded.next_offset) == (None, None)


# --- every schema an earlier release wrote with (schemas/history) still decodes -------------------------

_HISTORY = sorted((Path(__file__).parents[3] / "schemas" / "history").glob("*.avsc"))
_BY_NAME: dict[str, type[Event]] = {cls.__name__: cls for cls in EVENT_TYPES}
_NEW_SAMPLES: dict[type[Event], Event] = {
    **SAMPLES,
    InferenceRequest: dataclasses.replace(REQUEST, tenant="team-a", priority="high"),
    InferenceResult: dataclasses.replace(RESULT, provider_request_id="req_abc", reused_from="batch-0/req-1",
                                         tenant="team-a", priority="high"),
    FailureEvent: dataclasses.replace(FAILURE, response_body='{"choices": []}', provider_request_id="req_abc",
                                      run=2, deployment="gpt@2",
                                      request=dataclasses.replace(FAILURE.request, tenant="team-a", priority="low")),
    RequestState: dataclasses.replace(STATE, next_topic="llm.retry.5s", next_offset=3, retries_spent=2,
                                      model="m", prompt_tokens=5, completion_tokens=7, reused=True, run=3,
                                      replay_topic="llm.requests", replay_offset=41, tenant="team-a",
                                      priority="low"),
}


@pytest.mark.parametrize("path", _HISTORY, ids=[path.stem for path in _HISTORY])
def test_a_record_written_with_a_past_schema_decodes_with_the_defaults_of_later_fields(path: Path) -> None:
    """No registration: ``PAST_WRITERS`` knows every file in schemas/history, and each one's fields that the
    current schema has kept their values, the fields added since read as their defaults."""
    old = json.loads(path.read_text())
    record_type = _BY_NAME[old["name"]]
    datum, defaults = _kept_and_added(old, avro_schema(record_type), to_avro(_NEW_SAMPLES[record_type]))

    decoded = codec.decode(_single_object(old, datum), record_type)

    assert defaults, f"{path.name} is the current schema: nothing was added since"
    assert to_avro(decoded) == _merged(datum, defaults)


def _kept_and_added(old: dict[str, Any], current: dict[str, Any],
                    value: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``value`` cut to the fields the old schema has, and the defaults of the fields added since, both nested
    where a field is itself a record (a failure event's request)."""
    old_fields = {field["name"]: field for field in old["fields"]}
    kept: dict[str, Any] = {}
    added: dict[str, Any] = {}
    for field in current["fields"]:
        name = field["name"]
        if name not in old_fields:
            added[name] = field["default"]
        elif isinstance(field["type"], dict) and field["type"].get("type") == "record":
            kept[name], nested = _kept_and_added(old_fields[name]["type"], field["type"], value[name])
            if nested:
                added[name] = nested
        else:
            kept[name] = value[name]
    return kept, added


def _merged(kept: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    return {**kept, **{name: _merged(kept[name], default) if name in kept else default
                       for name, default in added.items()}}


def test_the_current_schemas_are_not_in_the_history() -> None:
    """A history file that equals a current schema would hide a field added without a new history file."""
    current = {writer.fingerprint for writer in writer_schemas.CURRENT_WRITERS}
    assert not current & {writer.fingerprint for writer in writer_schemas.PAST_WRITERS}
