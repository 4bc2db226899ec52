"""The bytes on the wire: an Avro body framed so that a reader can find the writer's schema.

Two framings (design §3):

* Avro single-object encoding, written by default: ``C3 01`` + the 8-byte CRC-64-AVRO fingerprint of the
  writer schema's Parsing Canonical Form (little-endian, as the Java implementation writes it) + the Avro
  binary body. No registry needed: the fingerprint names the schema.
* Confluent wire format, for deployments with a schema registry: ``00`` + a 4-byte big-endian schema id +
  the body. Decoding it needs a lookup ``schema id -> schema``.

A result or a failure event may also be a JSON object (first byte ``{``, :mod:`streamproc.codec.json_events`),
which :meth:`Codec.decode` reads too.

The :class:`Codec` keeps the writer schemas it knows; the module-level functions share one instance.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from io import BytesIO
from typing import Any, TypeAlias, cast

from fastavro import schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError

from streamproc.codec.codec_error import CodecError, CodecErrorCode, shorten
from streamproc.codec.json_events import JSON_EVENT_TYPES, JSON_START, decode_json
from streamproc.codec.records import AvroRecord, E, Event, from_avro, to_avro
from streamproc.codec.writer_schemas import (
    CURRENT_WRITERS,
    PAST_WRITERS,
    WriterSchema,
    current_schema,
    parse_writer_schema,
)

__all__ = [
    "CONFLUENT_MAGIC",
    "SINGLE_OBJECT_MAGIC",
    "Codec",
    "SchemaLookup",
    "confluent_schema_id",
    "decode",
    "encode",
    "encode_confluent",
    "peek_request_id",
    "register_writer_schema",
    "write_with",
    "writing_schema",
]

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
_SINGLE_OBJECT_HEADER_SIZE = len(SINGLE_OBJECT_MAGIC) + 8
_CONFLUENT_HEADER_SIZE = len(CONFLUENT_MAGIC) + 4
_MAX_CONFLUENT_SCHEMA_ID = 2**31 - 1  # Confluent writes the id as a Java int
_CONFLUENT_CACHE_LIMIT = 1024

SchemaLookup: TypeAlias = Callable[[int], Mapping[str, Any] | str]
"""Resolves a Confluent schema id to the writer's schema (a parsed JSON object or its JSON text)."""


def confluent_schema_id(data: bytes | None) -> int | None:
    """The schema id a Confluent-framed payload names, or None for any other payload (or a truncated header)."""
    if not data or data[:1] != CONFLUENT_MAGIC or len(data) < _CONFLUENT_HEADER_SIZE:
        return None
    return int.from_bytes(data[1:_CONFLUENT_HEADER_SIZE], "big")


class Codec:
    """Encoder/decoder with its own set of known writer schemas (the current ones plus registered old ones).

    The module-level functions use one shared instance; a separate instance keeps registrations apart (tests).
    """

    def __init__(self) -> None:
        self._writers: dict[bytes, WriterSchema] = {writer.fingerprint: writer
                                                    for writer in (*PAST_WRITERS, *CURRENT_WRITERS)}
        self._confluent_writers: dict[tuple[SchemaLookup, int], WriterSchema] = {}
        self._writing: dict[str, WriterSchema] = {}  # by record name: an older release's, during an upgrade

    def write_with(self, writers: Iterable[WriterSchema]) -> None:
        """Encode each record type these name with that schema instead of the current one (none: all current).

        A rolling upgrade writes what the release it upgrades from reads (design §6, "Releases"); fields that
        schema lacks are not written.
        """
        self._writing = {writer.name: writer for writer in writers}
        for writer in self._writing.values():
            self._writers.setdefault(writer.fingerprint, writer)

    def writing_schema(self, record_type: type[Event]) -> WriterSchema:
        """The schema records of this type are encoded with: the current one, unless :meth:`write_with` said."""
        current = current_schema(record_type).writer
        return self._writing.get(current.name, current)

    def register_writer_schema(self, schema: Mapping[str, Any] | str) -> bytes:
        """Make records written with ``schema`` (e.g. an older version) decodable; returns its fingerprint."""
        writer = parse_writer_schema(schema)
        self._writers.setdefault(writer.fingerprint, writer)
        return writer.fingerprint

    def encode(self, record: Event) -> bytes:
        """Avro single-object encoding of ``record`` with its type's writing schema (the current one by default)."""
        writer = self.writing_schema(type(record))
        buffer = BytesIO()
        buffer.write(SINGLE_OBJECT_MAGIC)
        buffer.write(writer.fingerprint)
        self._write_body(buffer, writer, record)
        return buffer.getvalue()

    def encode_confluent(self, record: Event, schema_id: int) -> bytes:
        """Confluent wire format of ``record``; ``schema_id`` is the registry's id of its writing schema."""
        if not 0 <= schema_id <= _MAX_CONFLUENT_SCHEMA_ID:
            raise ValueError(f"Confluent schema id {schema_id} is outside 0..{_MAX_CONFLUENT_SCHEMA_ID}")
        buffer = BytesIO()
        buffer.write(CONFLUENT_MAGIC + schema_id.to_bytes(4, "big"))
        self._write_body(buffer, self.writing_schema(type(record)), record)
        return buffer.getvalue()

    def decode(
        self, data: bytes | None, expected: type[E], *, schema_lookup: SchemaLookup | None = None
    ) -> E:
        """Decode a framed record into ``expected``, resolving from the writer's schema to the current one; a result
        or a failure event may also be JSON (:mod:`streamproc.codec.json_events`)."""
        reader = current_schema(expected).writer  # the current schema, as a writer schema
        data = _non_empty(data)
        if data[:1] == JSON_START and expected in JSON_EVENT_TYPES:  # a JSON outcome (design §3, "JSON out")
            return decode_json(data, expected)
        writer, offset = self._writer_of(data, schema_lookup)
        if writer.name != reader.name:
            raise CodecError(
                CodecErrorCode.WRONG_RECORD_TYPE,
                f"expected record {reader.name} but the payload is a {writer.name} "
                f"({self._describe(writer, data)})",
            )
        if writer.fingerprint == reader.fingerprint:
            datum = self._read(data, offset, writer, None)
        else:
            if writer.missing_fields:
                raise CodecError(
                    CodecErrorCode.MISSING_FIELDS,
                    f"{writer.name} ({self._describe(writer, data)}) lacks required field(s) "
                    f"{', '.join(writer.missing_fields)}, and the current schema has no default for them",
                )
            datum = self._read(data, offset, writer, reader.parsed)
        return from_avro(datum, expected)

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

    @staticmethod
    def _write_body(buffer: BytesIO, writer: WriterSchema, record: Event) -> None:
        try:
            # our datums hold no tuples, so fastavro need not look for its (branch, value) union notation
            schemaless_writer(buffer, writer.parsed, to_avro(record), disable_tuple_notation=True)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise CodecError(CodecErrorCode.UNENCODABLE, f"cannot encode {writer.name}: {exc}") from exc

    def _writer_of(self, data: bytes, schema_lookup: SchemaLookup | None) -> tuple[WriterSchema, int]:
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

    def _confluent_writer(self, data: bytes, schema_lookup: SchemaLookup | None) -> WriterSchema:
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
        new = parse_writer_schema(schema)
        writer = self._writers.get(new.fingerprint, new)  # same schema as a known one: share its entry
        if cacheable:
            if len(self._confluent_writers) >= _CONFLUENT_CACHE_LIMIT:  # ids never change: bound memory only
                self._confluent_writers.clear()
            self._confluent_writers[key] = writer
        return writer

    @staticmethod
    def _describe(writer: WriterSchema, data: bytes) -> str:
        if data[:1] == CONFLUENT_MAGIC:
            return f"Confluent schema id {int.from_bytes(data[1:_CONFLUENT_HEADER_SIZE], 'big')}"
        return f"schema fingerprint {writer.fingerprint.hex()}"

    @staticmethod
    def _read(data: bytes, offset: int, writer: WriterSchema, reader: AvroRecord | None) -> AvroRecord:
        """Read the body; every fastavro failure becomes a CodecError naming what went wrong."""
        buffer = BytesIO(data)
        buffer.seek(offset)
        size = len(data) - offset
        try:
            datum = schemaless_reader(buffer, writer.parsed, reader)
        except SchemaResolutionError as exc:
            raise CodecError(
                CodecErrorCode.INCOMPATIBLE_SCHEMA,
                f"cannot resolve the writer's {writer.name} schema to the current one: {shorten(str(exc))}",
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


def write_with(writers: Iterable[WriterSchema]) -> None:
    """Make :func:`encode` and :func:`encode_confluent` write these schemas for their record types."""
    _DEFAULT_CODEC.write_with(writers)


def writing_schema(record_type: type[Event]) -> WriterSchema:
    """The schema :func:`encode` writes records of this type with."""
    return _DEFAULT_CODEC.writing_schema(record_type)


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
