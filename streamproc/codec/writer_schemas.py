"""The writer schemas a record may carry: the shipped ones, parsed once, and older ones, analysed for decoding.

The contract is ``schemas/*.avsc``; the package reads it through ``streamproc/codec/schemas`` (a link to that
folder) with importlib.resources, so that an installed (non-editable) package can load it. Schemas are parsed
and fingerprinted once, at import, and so is what decoding needs from a writer schema: the fields it cannot
supply, and how to read only as far as its ``request_id``.

Evolution: a reader decodes with the *current* schema of the record type, resolving from whatever writer
schema the fingerprint names. Add fields with defaults; to keep reading records written by an older schema,
register that schema with ``register_writer_schema`` (its fingerprint is what those records carry). The
schemas this project shipped before are kept in ``schemas/history/<Name>-<n>.avsc`` and known to every codec
(``PAST_WRITERS``), so a table or topic written by an older release still decodes after an upgrade.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from streamproc.codec.codec_error import CodecError, CodecErrorCode, shorten
from streamproc.codec.records import EVENT_TYPES, AvroRecord, Event, not_an_event_type

__all__ = [
    "CURRENT_WRITERS",
    "FINGERPRINT_ALGORITHM",
    "PAST_WRITERS",
    "CurrentSchema",
    "WriterSchema",
    "avro_schema",
    "current_schema",
    "parse_writer_schema",
    "record_of",
    "schema_fingerprint",
]

FINGERPRINT_ALGORITHM = "CRC-64-AVRO"


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """A schema records may have been written with, with what decoding needs precomputed."""

    name: str  # the record's full name, e.g. io.streamproc.InferenceRequest
    schema: AvroRecord = dataclasses.field(repr=False)  # as written, unparsed: what a registry is given
    fingerprint: bytes  # CRC-64-AVRO bytes, as framed
    parsed: AvroRecord = dataclasses.field(repr=False)
    missing_fields: tuple[str, ...]  # reader fields this writer lacks that have no default (dotted paths)
    request_id_path: tuple[str, ...]  # where request_id sits, e.g. ("request", "request_id"); () if nowhere
    # the writer schema cut just after request_id: reads only that far
    request_id_prefix: AvroRecord | None = dataclasses.field(repr=False)


@dataclass(frozen=True, slots=True)
class CurrentSchema:
    """The current schema of an event type: the reader schema, and the writer schema of what it encodes."""

    schema: AvroRecord  # the .avsc as loaded, unparsed
    writer: WriterSchema


def _load_schema(name: str) -> AvroRecord:
    """Read a shipped ``.avsc`` through importlib.resources, so it works from a wheel or a zip as well."""
    text = resources.files("streamproc.codec").joinpath("schemas", f"{name}.avsc").read_text(encoding="utf-8")
    return cast(AvroRecord, json.loads(text))


def _past_schemas() -> list[AvroRecord]:
    """The schemas earlier releases wrote with (``schemas/history``), oldest name first."""
    history = resources.files("streamproc.codec").joinpath("schemas", "history")
    if not history.is_dir():
        return []
    return [cast(AvroRecord, json.loads(entry.read_text(encoding="utf-8")))
            for entry in sorted(history.iterdir(), key=lambda e: e.name) if entry.name.endswith(".avsc")]


def _fingerprint(schema: Mapping[str, Any]) -> bytes:
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(dict(schema)), FINGERPRINT_ALGORITHM))


def _is_record(avro_type: Any) -> bool:
    return isinstance(avro_type, dict) and avro_type.get("type") == "record"


def record_of(avro_type: Any) -> AvroRecord | None:
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
    written, read = record_of(writer), record_of(reader)
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


def _writer_schema(schema: Mapping[str, Any], readers: Mapping[str, AvroRecord]) -> WriterSchema:
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
    return WriterSchema(
        name=parsed["name"],
        schema=cast(AvroRecord, dict(schema)),
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


def _load_current(cls: type[Any]) -> CurrentSchema:
    schema = _load_schema(cls.__name__)
    return CurrentSchema(schema=schema, writer=_writer_schema(schema, {}))  # its own reader: nothing missing


_CURRENT_SCHEMAS: dict[type[Any], CurrentSchema] = {cls: _load_current(cls) for cls in EVENT_TYPES}
_READERS_BY_NAME: dict[str, AvroRecord] = {c.writer.name: c.writer.parsed for c in _CURRENT_SCHEMAS.values()}
CURRENT_WRITERS: tuple[WriterSchema, ...] = tuple(c.writer for c in _CURRENT_SCHEMAS.values())
"""The writer schemas of the current event types, which every codec knows."""
PAST_WRITERS: tuple[WriterSchema, ...] = tuple(_writer_schema(schema, _READERS_BY_NAME) for schema in _past_schemas())
"""The writer schemas of earlier releases, which every codec knows too."""


def current_schema(cls: type[Any]) -> CurrentSchema:
    """The current schema of an event type; TypeError for a class that is not one."""
    try:
        return _CURRENT_SCHEMAS[cls]
    except KeyError:
        raise not_an_event_type(cls) from None


def parse_writer_schema(schema: Mapping[str, Any] | str) -> WriterSchema:
    """A writer schema given as JSON data or text (e.g. an older version, or a registry's answer), analysed.

    Raises CodecError(INVALID_SCHEMA) when it is not usable.
    """
    if isinstance(schema, str):
        try:
            schema = cast(Mapping[str, Any], json.loads(schema))
        except ValueError as exc:
            raise CodecError(CodecErrorCode.INVALID_SCHEMA, f"schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, Mapping):
        raise CodecError(
            CodecErrorCode.INVALID_SCHEMA,
            f"writer schema is {shorten(json.dumps(schema), 80)}, not a record: streamproc events are records",
        )
    return _writer_schema(schema, _READERS_BY_NAME)


def avro_schema(record_type: type[Event]) -> AvroRecord:
    """The current schema of an event type as JSON data (a fresh copy), e.g. to register in a registry."""
    return cast(AvroRecord, json.loads(json.dumps(current_schema(record_type).schema)))


def schema_fingerprint(record_type: type[Event]) -> bytes:
    """The 8 CRC-64-AVRO bytes that single-object framing puts after ``C3 01`` for this type's schema."""
    return current_schema(record_type).writer.fingerprint
