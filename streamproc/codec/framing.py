"""Avro encoding of the events on streamproc's topics, framed so that a reader can find the writer's schema.

Two framings (DESIGN §3):

* Avro single-object encoding, written by default: ``C3 01`` + the 8-byte CRC-64-AVRO fingerprint of the
  writer schema's Parsing Canonical Form (little-endian, as the Java implementation writes it) + the Avro
  binary body. No registry needed: the fingerprint names the schema.
* Confluent wire format, for deployments with a schema registry: ``00`` + a 4-byte big-endian schema id +
  the body. Decoding it needs a lookup ``schema id -> schema``.

The contract is ``schemas/*.avsc``; the package ships a byte-identical copy in ``streamproc/schemas/`` so that
an installed (non-editable) package can load it. Schemas are parsed and fingerprinted once, at import.

Evolution: a reader decodes with the *current* schema of the record type, resolving from whatever writer
schema the fingerprint names. Add fields with defaults; to keep reading records written by an older schema,
register that schema with :func:`register_writer_schema` (its fingerprint is what those records carry).

Every decoding problem raises :class:`CodecError` with a machine-readable ``code`` and a precise message: the
worker turns poison records into business failures (or dead letters, when :func:`peek_request_id` cannot
recover an id) and the message is what a person reads to fix the producer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from io import BytesIO
from typing import Any, TypeAlias, TypeVar, cast

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError
from fastavro.schema import fingerprint, to_parsing_canonical_form

from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RepairContext, RequestState
from streamproc.core.vocabulary import FailureLayer, RequestStatus

__all__ = [
    "CONFLUENT_MAGIC",
    "FINGERPRINT_ALGORITHM",
    "SINGLE_OBJECT_MAGIC",
    "Codec",
    "CodecError",
    "CodecErrorCode",
    "Event",
    "SchemaLookup",
    "avro_schema",
    "decode",
    "encode",
    "encode_confluent",
    "from_avro",
    "peek_request_id",
    "register_writer_schema",
    "schema_fingerprint",
    "to_avro",
]

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
FINGERPRINT_ALGORITHM = "CRC-64-AVRO"
_SINGLE_OBJECT_HEADER_SIZE = len(SINGLE_OBJECT_MAGIC) + 8
_CONFLUENT_HEADER_SIZE = len(CONFLUENT_MAGIC) + 4
_MAX_CONFLUENT_SCHEMA_ID = 2**31 - 1  # Confluent writes the id as a Java int
_CONFLUENT_CACHE_LIMIT = 1024

Event: TypeAlias = InferenceRequest | InferenceResult | FailureEvent | RequestState
E = TypeVar("E", bound=Event)
AvroRecord: TypeAlias = dict[str, Any]
SchemaLookup: TypeAlias = Callable[[int], Mapping[str, Any] | str]
"""Resolves a Confluent schema id to the writer's schema (a parsed JSON object or its JSON text)."""


class CodecErrorCode(StrEnum):
    """Why a payload could not be encoded or decoded; stable strings, usable as a failure's ``error_code``."""

    EMPTY_PAYLOAD = "empty_payload"  # 0 bytes or a null value (tombstone)
    UNKNOWN_FRAMING = "unknown_framing"  # neither C3 01 nor 00 first: not Avro from a known producer
    NO_SCHEMA_LOOKUP = "no_schema_lookup"  # Confluent framing, but no registry configured
    UNKNOWN_SCHEMA = "unknown_schema"  # fingerprint not known / schema id not found
    INVALID_SCHEMA = "invalid_schema"  # the writer schema itself is unusable (not JSON, not a record, bad Avro)
    TRUNCATED = "truncated"  # the header or the body ends early
    WRONG_RECORD_TYPE = "wrong_record_type"  # a readable record, of another type than expected
    MISSING_FIELDS = "missing_fields"  # the writer lacks fields the current schema requires (no default)
    INCOMPATIBLE_SCHEMA = "incompatible_schema"  # other resolution failures: changed types, unknown symbols
    CORRUPT_BODY = "corrupt_body"  # bytes that do not follow the writer schema (bad UTF-8, index, leftovers)
    UNENCODABLE = "unencodable"  # encode: a field value of the wrong type


class CodecError(ValueError):
    """A payload that is not a readable streamproc event (or a record that cannot be written), and why."""

    def __init__(self, code: CodecErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"CodecError({self.code.value!r}, {self.message!r})"


# --- dataclass <-> Avro record (pure) -------------------------------------------------------------------


def _repair_to_avro(repair: RepairContext | None) -> AvroRecord | None:
    if repair is None:
        return None
    return {"bad_output": repair.bad_output, "reason": repair.reason}


def _request_to_avro(request: InferenceRequest) -> AvroRecord:
    return {
        "request_id": request.request_id,
        "body_json": request.body_json,
        "url": request.url,
        "batch_id": request.batch_id,
        "submitted_ms": request.submitted_ms,
        "repair": _repair_to_avro(request.repair),
        "metadata": request.metadata,
    }


def _request_from_avro(datum: AvroRecord) -> InferenceRequest:
    repair = datum["repair"]
    return InferenceRequest(
        request_id=datum["request_id"],
        body_json=datum["body_json"],
        url=datum["url"],
        batch_id=datum["batch_id"],
        submitted_ms=datum["submitted_ms"],
        repair=None if repair is None else RepairContext(repair["bad_output"], repair["reason"]),
        metadata=datum["metadata"],
    )


def _result_to_avro(result: InferenceResult) -> AvroRecord:
    return {
        "request_id": result.request_id,
        "batch_id": result.batch_id,
        "model": result.model,
        "response_json": result.response_json,
        "content": result.content,
        "attempts": result.attempts,
        "latency_ms": result.latency_ms,
        "completed_ms": result.completed_ms,
        "input_hash": result.input_hash,
    }


def _result_from_avro(datum: AvroRecord) -> InferenceResult:
    return InferenceResult(
        request_id=datum["request_id"],
        batch_id=datum["batch_id"],
        model=datum["model"],
        response_json=datum["response_json"],
        content=datum["content"],
        attempts=datum["attempts"],
        latency_ms=datum["latency_ms"],
        completed_ms=datum["completed_ms"],
        input_hash=datum["input_hash"],
    )


def _failure_to_avro(failure: FailureEvent) -> AvroRecord:
    return {
        "request": _request_to_avro(failure.request),
        "layer": failure.layer.value,
        "error_code": failure.error_code,
        "message": failure.message,
        "attempt": failure.attempt,
        "terminal": failure.terminal,
        "first_failure_ms": failure.first_failure_ms,
        "last_failure_ms": failure.last_failure_ms,
        "http_status": failure.http_status,
        "retry_after_ms": failure.retry_after_ms,
    }


def _failure_from_avro(datum: AvroRecord) -> FailureEvent:
    return FailureEvent(
        request=_request_from_avro(datum["request"]),
        layer=FailureLayer(datum["layer"]),
        error_code=datum["error_code"],
        message=datum["message"],
        attempt=datum["attempt"],
        terminal=datum["terminal"],
        first_failure_ms=datum["first_failure_ms"],
        last_failure_ms=datum["last_failure_ms"],
        http_status=datum["http_status"],
        retry_after_ms=datum["retry_after_ms"],
    )


def _state_to_avro(state: RequestState) -> AvroRecord:
    return {
        "request_id": state.request_id,
        "status": state.status.value,
        "input_hash": state.input_hash,
        "attempts": state.attempts,
        "batch_id": state.batch_id,
        "last_layer": None if state.last_layer is None else state.last_layer.value,
        "last_error_code": state.last_error_code,
        "created_ms": state.created_ms,
        "updated_ms": state.updated_ms,
        "source_topic": state.source_topic,
        "source_offset": state.source_offset,
    }


def _state_from_avro(datum: AvroRecord) -> RequestState:
    last_layer = datum["last_layer"]
    return RequestState(
        request_id=datum["request_id"],
        status=RequestStatus(datum["status"]),
        input_hash=datum["input_hash"],
        attempts=datum["attempts"],
        batch_id=datum["batch_id"],
        last_layer=None if last_layer is None else FailureLayer(last_layer),
        last_error_code=datum["last_error_code"],
        created_ms=datum["created_ms"],
        updated_ms=datum["updated_ms"],
        source_topic=datum["source_topic"],
        source_offset=datum["source_offset"],
    )


# --- schemas, parsed once -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _WriterSchema:
    """A schema records may have been written with, with what decoding needs precomputed."""

    name: str  # the record's full name, e.g. io.streamproc.InferenceRequest
    fingerprint: bytes  # CRC-64-AVRO bytes, as framed
    parsed: AvroRecord
    missing_fields: tuple[str, ...]  # reader fields this writer lacks that have no default (dotted paths)
    request_id_path: tuple[str, ...]  # where request_id sits, e.g. ("request", "request_id"); () if nowhere
    request_id_prefix: AvroRecord | None  # the writer schema cut just after request_id: reads only that far


@dataclass(frozen=True, slots=True)
class _RecordType:
    """A current record type: its reader (= writer) schema and its conversions."""

    cls: type[Any]
    name: str
    schema: AvroRecord  # the .avsc as loaded, unparsed
    writer: _WriterSchema
    header: bytes  # single-object header for this schema
    to_avro: Callable[[Any], AvroRecord]
    from_avro: Callable[[AvroRecord], Any]


def _load_schema(name: str) -> AvroRecord:
    """Read a shipped ``.avsc`` through importlib.resources, so it works from a wheel or a zip as well."""
    text = resources.files("streamproc.codec").joinpath("schemas", f"{name}.avsc").read_text(encoding="utf-8")
    return cast(AvroRecord, json.loads(text))


def _fingerprint(schema: Mapping[str, Any]) -> bytes:
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(dict(schema)), FINGERPRINT_ALGORITHM))


def _is_record(avro_type: Any) -> bool:
    return isinstance(avro_type, dict) and avro_type.get("type") == "record"


def _record_of(avro_type: Any) -> AvroRecord | None:
    """The record a type stands for: a record, or a union with exactly one inline record branch."""
    if _is_record(avro_type):
        return cast(AvroRecord, avro_type)
    if isinstance(avro_type, list):
        records = [branch for branch in avro_type if _is_record(branch)]
        if len(records) == 1:
            return cast(AvroRecord, records[0])
    return None


def _missing_fields(writer: Any, reader: Any, prefix: str = "") -> list[str]:
    """Reader fields the writer lacks that have no default: all of them (fastavro names only the first)."""
    written, read = _record_of(writer), _record_of(reader)
    if written is None or read is None:
        return []
    writer_fields = {field["name"]: field["type"] for field in written["fields"]}
    missing: list[str] = []
    for field in read["fields"]:
        name = field["name"]
        match = next((n for n in (name, *field.get("aliases", ())) if n in writer_fields), None)
        if match is None:
            if "default" not in field:
                missing.append(prefix + name)
        else:
            missing.extend(_missing_fields(writer_fields[match], field["type"], f"{prefix}{name}."))
    return missing


def _find_request_id(record: Mapping[str, Any]) -> tuple[str, ...]:
    """Path to a string ``request_id`` at the top or inside a nested ``request`` record; () when absent."""
    for field in record["fields"]:
        if field["name"] == "request_id" and field["type"] in ("string", {"type": "string"}):
            return ("request_id",)
    for field in record["fields"]:
        if field["name"] == "request" and _is_record(field["type"]):
            path = _find_request_id(field["type"])
            if path:
                return ("request", *path)
    return ()


def _cut_after(record: Mapping[str, Any], path: tuple[str, ...]) -> AvroRecord:
    """The record with only its fields up to ``path``: Avro bodies are sequential, so it reads a prefix."""
    fields: list[Any] = []
    for field in record["fields"]:
        if field["name"] == path[0]:
            if len(path) > 1:
                field = {**field, "type": _cut_after(field["type"], path[1:])}
            fields.append(field)
            break
        fields.append(field)
    return {**record, "fields": fields}


def _writer_schema(schema: Mapping[str, Any], readers: Mapping[str, AvroRecord]) -> _WriterSchema:
    """Parse and fingerprint a writer schema once; raises CodecError(INVALID_SCHEMA) when it is not usable.

    ``readers`` are the current parsed schemas by full name, to list the fields this writer cannot supply.
    """
    try:
        parsed: Any = parse_schema(dict(schema))
        fp = _fingerprint(schema)
        path = _find_request_id(parsed) if _is_record(parsed) else ()
        prefix: Any = parse_schema(_cut_after(schema, path)) if path else None
    except Exception as exc:  # fastavro raises several exception types for a bad schema
        raise CodecError(CodecErrorCode.INVALID_SCHEMA, f"invalid Avro schema: {exc}") from exc
    if not _is_record(parsed):
        raise CodecError(
            CodecErrorCode.INVALID_SCHEMA,
            f"writer schema is a {_describe_type(parsed)}, not a record: streamproc events are records",
        )
    reader = readers.get(parsed["name"])
    return _WriterSchema(
        name=parsed["name"],
        fingerprint=fp,
        parsed=parsed,
        missing_fields=tuple(_missing_fields(parsed, reader)) if reader is not None else (),
        request_id_path=path,
        request_id_prefix=prefix,
    )


def _describe_type(parsed: Any) -> str:
    if isinstance(parsed, dict):
        return str(parsed.get("type"))
    if isinstance(parsed, list):
        return "union"
    return str(parsed)


def _record_type(
    cls: type[Any], to_avro: Callable[[Any], AvroRecord], from_avro: Callable[[AvroRecord], Any]
) -> _RecordType:
    schema = _load_schema(cls.__name__)
    writer = _writer_schema(schema, {})  # its own reader: nothing can be missing
    return _RecordType(
        cls=cls,
        name=writer.name,
        schema=schema,
        writer=writer,
        header=SINGLE_OBJECT_MAGIC + writer.fingerprint,
        to_avro=to_avro,
        from_avro=from_avro,
    )


_RECORD_TYPES: dict[type[Any], _RecordType] = {
    record_type.cls: record_type
    for record_type in (
        _record_type(InferenceRequest, _request_to_avro, _request_from_avro),
        _record_type(InferenceResult, _result_to_avro, _result_from_avro),
        _record_type(FailureEvent, _failure_to_avro, _failure_from_avro),
        _record_type(RequestState, _state_to_avro, _state_from_avro),
    )
}
_READERS_BY_NAME: dict[str, AvroRecord] = {rt.name: rt.writer.parsed for rt in _RECORD_TYPES.values()}


def _record_type_of(cls: type[Any]) -> _RecordType:
    try:
        return _RECORD_TYPES[cls]
    except KeyError:
        known = ", ".join(sorted(c.__name__ for c in _RECORD_TYPES))
        raise TypeError(f"{cls.__name__} is not a streamproc event type (known: {known})") from None


# --- public pure conversions ----------------------------------------------------------------------------


def to_avro(record: Event) -> AvroRecord:
    """The Avro record (a plain dict, enums as their symbols) that fastavro writes for an event."""
    return _record_type_of(type(record)).to_avro(record)


def from_avro(datum: AvroRecord, record_type: type[E]) -> E:
    """The event for an Avro record read with the current schema of ``record_type`` (all fields present)."""
    return cast(E, _record_type_of(record_type).from_avro(datum))


def avro_schema(record_type: type[Event]) -> AvroRecord:
    """The current schema of an event type as JSON data (a fresh copy), e.g. to register in a registry."""
    return cast(AvroRecord, json.loads(json.dumps(_record_type_of(record_type).schema)))


def schema_fingerprint(record_type: type[Event]) -> bytes:
    """The 8 CRC-64-AVRO bytes that single-object framing puts after ``C3 01`` for this type's schema."""
    return _record_type_of(record_type).writer.fingerprint


# --- framing --------------------------------------------------------------------------------------------


class Codec:
    """Encoder/decoder with its own set of known writer schemas (the current ones plus registered old ones).

    The module-level functions use one shared instance; a separate instance keeps registrations apart (tests).
    """

    def __init__(self) -> None:
        current = (record_type.writer for record_type in _RECORD_TYPES.values())
        self._writers: dict[bytes, _WriterSchema] = {writer.fingerprint: writer for writer in current}
        self._confluent_writers: dict[tuple[SchemaLookup, int], _WriterSchema] = {}

    def register_writer_schema(self, schema: Mapping[str, Any] | str) -> bytes:
        """Make records written with ``schema`` (e.g. an older version) decodable; returns its fingerprint."""
        writer = self._new_writer(schema)
        self._writers.setdefault(writer.fingerprint, writer)
        return writer.fingerprint

    def encode(self, record: Event) -> bytes:
        """Avro single-object encoding of ``record`` with the current schema of its type."""
        record_type = _record_type_of(type(record))
        buffer = BytesIO()
        buffer.write(record_type.header)
        self._write_body(buffer, record_type, record)
        return buffer.getvalue()

    def encode_confluent(self, record: Event, schema_id: int) -> bytes:
        """Confluent wire format of ``record``; ``schema_id`` is the registry's id of its current schema."""
        if not 0 <= schema_id <= _MAX_CONFLUENT_SCHEMA_ID:
            raise ValueError(f"Confluent schema id {schema_id} is outside 0..{_MAX_CONFLUENT_SCHEMA_ID}")
        record_type = _record_type_of(type(record))
        buffer = BytesIO()
        buffer.write(CONFLUENT_MAGIC + schema_id.to_bytes(4, "big"))
        self._write_body(buffer, record_type, record)
        return buffer.getvalue()

    def decode(
        self, data: bytes | None, expected: type[E], *, schema_lookup: SchemaLookup | None = None
    ) -> E:
        """Decode a framed record into ``expected``, resolving from the writer's schema to the current one."""
        reader = _record_type_of(expected)
        data = _non_empty(data)
        writer, offset = self._writer_of(data, schema_lookup)
        if writer.name != reader.name:
            raise CodecError(
                CodecErrorCode.WRONG_RECORD_TYPE,
                f"expected record {reader.name} but the payload is a {writer.name} "
                f"({self._describe(writer, data)})",
            )
        if writer.fingerprint == reader.writer.fingerprint:
            datum = self._read(data, offset, writer, None)
        else:
            if writer.missing_fields:
                raise CodecError(
                    CodecErrorCode.MISSING_FIELDS,
                    f"{writer.name} ({self._describe(writer, data)}) lacks required field(s) "
                    f"{', '.join(writer.missing_fields)}, and the current schema has no default for them",
                )
            datum = self._read(data, offset, writer, reader.writer.parsed)
        return cast(E, reader.from_avro(datum))

    def peek_request_id(self, data: bytes | None, *, schema_lookup: SchemaLookup | None = None) -> str | None:
        """The request id of a payload that may not decode as expected, or None when it cannot be known.

        Reads only as far as the ``request_id`` field of any known writer schema (so a wrong record type or a
        body truncated after the id still yields it), and JSON text with ``request_id`` or ``custom_id``.
        It never guesses: an id read from an unknown schema could name another request.
        """
        if not data:
            return None
        try:
            writer, offset = self._writer_of(data, schema_lookup)
        except CodecError as exc:
            return _request_id_from_json(data) if exc.code is CodecErrorCode.UNKNOWN_FRAMING else None
        if writer.request_id_prefix is None:
            return None
        buffer = BytesIO(data)
        buffer.seek(offset)
        try:
            value: Any = schemaless_reader(buffer, writer.request_id_prefix, None)
        except Exception:  # any failure to read that far means the id cannot be known
            return None
        for name in writer.request_id_path:
            value = value[name]
        return value if isinstance(value, str) and value else None

    # -- internals --

    def _new_writer(self, schema: Mapping[str, Any] | str) -> _WriterSchema:
        if isinstance(schema, str):
            try:
                schema = cast(Mapping[str, Any], json.loads(schema))
            except ValueError as exc:
                raise CodecError(CodecErrorCode.INVALID_SCHEMA, f"schema is not valid JSON: {exc}") from exc
        if not isinstance(schema, Mapping):
            raise CodecError(
                CodecErrorCode.INVALID_SCHEMA,
                f"writer schema is {_shorten(json.dumps(schema), 80)}, not a record: streamproc events are records",
            )
        return _writer_schema(schema, _READERS_BY_NAME)

    @staticmethod
    def _write_body(buffer: BytesIO, record_type: _RecordType, record: Event) -> None:
        try:
            schemaless_writer(buffer, record_type.writer.parsed, record_type.to_avro(record))
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise CodecError(CodecErrorCode.UNENCODABLE, f"cannot encode {record_type.name}: {exc}") from exc

    def _writer_of(self, data: bytes, schema_lookup: SchemaLookup | None) -> tuple[_WriterSchema, int]:
        """The writer schema named by the framing, and where the body starts."""
        if data[:2] == SINGLE_OBJECT_MAGIC:
            if len(data) < _SINGLE_OBJECT_HEADER_SIZE:
                raise CodecError(
                    CodecErrorCode.TRUNCATED,
                    f"truncated single-object header: {len(data)} bytes, need {_SINGLE_OBJECT_HEADER_SIZE} "
                    "(C3 01 + 8-byte schema fingerprint)",
                )
            fp = bytes(data[2:_SINGLE_OBJECT_HEADER_SIZE])
            writer = self._writers.get(fp)
            if writer is None:
                raise CodecError(
                    CodecErrorCode.UNKNOWN_SCHEMA,
                    f"unknown writer schema fingerprint {fp.hex()} (CRC-64-AVRO, bytes as framed): not a "
                    "current streamproc schema nor a registered older one",
                )
            return writer, _SINGLE_OBJECT_HEADER_SIZE
        if data[:1] == CONFLUENT_MAGIC:
            return self._confluent_writer(data, schema_lookup), _CONFLUENT_HEADER_SIZE
        hint = " (the payload looks like JSON text, not Avro)" if data.lstrip()[:1] in (b"{", b"[") else ""
        raise CodecError(
            CodecErrorCode.UNKNOWN_FRAMING,
            f"unknown framing magic {data[:2].hex(' ')}: expected c3 01 (Avro single-object encoding) "
            f"or 00 (Confluent wire format){hint}",
        )

    def _confluent_writer(self, data: bytes, schema_lookup: SchemaLookup | None) -> _WriterSchema:
        if len(data) < _CONFLUENT_HEADER_SIZE:
            raise CodecError(
                CodecErrorCode.TRUNCATED,
                f"truncated Confluent header: {len(data)} bytes, need {_CONFLUENT_HEADER_SIZE} "
                "(00 + 4-byte schema id)",
            )
        schema_id = int.from_bytes(data[1:_CONFLUENT_HEADER_SIZE], "big")
        if schema_lookup is None:
            raise CodecError(
                CodecErrorCode.NO_SCHEMA_LOOKUP,
                f"Confluent wire format (schema id {schema_id}) but no schema registry lookup is configured",
            )
        key = (schema_lookup, schema_id)
        try:
            writer = self._confluent_writers.get(key)
            cacheable = True
        except TypeError:  # an unhashable lookup object: look the id up every time
            writer, cacheable = None, False
        if writer is not None:
            return writer
        try:
            schema = schema_lookup(schema_id)
        except Exception as exc:  # a registry client may raise anything for an unknown id
            raise CodecError(
                CodecErrorCode.UNKNOWN_SCHEMA,
                f"Confluent schema id {schema_id} could not be looked up: {exc!r}",
            ) from exc
        new = self._new_writer(schema)
        writer = self._writers.get(new.fingerprint, new)  # same schema as a known one: share its entry
        if cacheable:
            if len(self._confluent_writers) >= _CONFLUENT_CACHE_LIMIT:  # ids never change: bound memory only
                self._confluent_writers.clear()
            self._confluent_writers[key] = writer
        return writer

    @staticmethod
    def _describe(writer: _WriterSchema, data: bytes) -> str:
        if data[:1] == CONFLUENT_MAGIC:
            return f"Confluent schema id {int.from_bytes(data[1:_CONFLUENT_HEADER_SIZE], 'big')}"
        return f"schema fingerprint {writer.fingerprint.hex()}"

    @staticmethod
    def _read(data: bytes, offset: int, writer: _WriterSchema, reader: AvroRecord | None) -> AvroRecord:
        """Read the body; every fastavro failure becomes a CodecError naming what went wrong."""
        buffer = BytesIO(data)
        buffer.seek(offset)
        size = len(data) - offset
        try:
            datum = schemaless_reader(buffer, writer.parsed, reader)
        except SchemaResolutionError as exc:
            raise CodecError(
                CodecErrorCode.INCOMPATIBLE_SCHEMA,
                f"cannot resolve the writer's {writer.name} schema to the current one: {_shorten(str(exc))}",
            ) from exc
        except UnicodeDecodeError as exc:
            raise CodecError(
                CodecErrorCode.CORRUPT_BODY,
                f"corrupt {writer.name} body: a string is not valid UTF-8 ({exc})",
            ) from exc
        except (EOFError, ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError) as exc:
            # fastavro reports running out of bytes as EOFError, or IndexError inside a varint or boolean
            if buffer.tell() >= len(data):
                raise CodecError(
                    CodecErrorCode.TRUNCATED,
                    f"truncated {writer.name} body: its {size} bytes end in the middle of a value "
                    f"({type(exc).__name__}: {exc or 'no more data'})",
                ) from exc
            raise CodecError(
                CodecErrorCode.CORRUPT_BODY,
                f"corrupt {writer.name} body at byte {buffer.tell() - offset} of {size}: "
                f"{type(exc).__name__}: {exc}",
            ) from exc
        unread = len(data) - buffer.tell()
        if unread:
            raise CodecError(
                CodecErrorCode.CORRUPT_BODY,
                f"corrupt {writer.name} body: {unread} unread bytes after the record (of {size})",
            )
        return cast(AvroRecord, datum)


def _shorten(text: str, limit: int = 300) -> str:
    """fastavro's resolution errors can print whole schemas; a failure message must stay readable."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _non_empty(data: bytes | None) -> bytes:
    if not data:
        what = "null payload (a tombstone?)" if data is None else "empty payload (0 bytes)"
        raise CodecError(CodecErrorCode.EMPTY_PAYLOAD, f"{what}: no framing, schema or body to decode")
    return data


def _request_id_from_json(data: bytes) -> str | None:
    """``request_id`` (or OpenAI batch ``custom_id``) of a JSON object, also inside ``request``."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    for candidate in (value, value.get("request") if isinstance(value, dict) else None):
        if isinstance(candidate, dict):
            for key in ("request_id", "custom_id"):
                found = candidate.get(key)
                if isinstance(found, str) and found:
                    return found
    return None


_DEFAULT_CODEC = Codec()


def register_writer_schema(schema: Mapping[str, Any] | str) -> bytes:
    """Make records written with ``schema`` decodable by :func:`decode`; returns its fingerprint."""
    return _DEFAULT_CODEC.register_writer_schema(schema)


def encode(record: Event) -> bytes:
    """Avro single-object encoding (``C3 01`` + fingerprint + body) of ``record`` with its current schema."""
    return _DEFAULT_CODEC.encode(record)


def encode_confluent(record: Event, schema_id: int) -> bytes:
    """Confluent wire format (``00`` + schema id + body); ``schema_id`` names the current schema."""
    return _DEFAULT_CODEC.encode_confluent(record, schema_id)


def decode(data: bytes | None, expected: type[E], *, schema_lookup: SchemaLookup | None = None) -> E:
    """Decode a framed record as ``expected``; :class:`CodecError` says precisely why when it cannot."""
    return _DEFAULT_CODEC.decode(data, expected, schema_lookup=schema_lookup)


def peek_request_id(data: bytes | None, *, schema_lookup: SchemaLookup | None = None) -> str | None:
    """The request id of a payload that did not decode as expected, or None when it cannot be known."""
    return _DEFAULT_CODEC.peek_request_id(data, schema_lookup=schema_lookup)
