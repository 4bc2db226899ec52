"""How events look on Kafka: Avro schemas (the top-level ``schemas/``), records, framing, batch manifests,
fleet beats.

One concept a module: ``records`` (events as Avro records), ``writer_schemas`` (the schemas, parsed once),
``framing`` (the bytes on the wire, and the ``Codec``), ``codec_error`` (why a payload does not decode),
``json_events`` (results and failures as JSON), ``json_schema`` (their JSON Schemas), ``json_request`` (a
request a producer wrote as JSON), ``manifest`` (batch manifests) and ``fleet_beat`` (the workers' beats). The
public API is re-exported here, so callers write
``from streamproc import codec`` and ``codec.decode``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamproc.codec.codec_error import CodecError, CodecErrorCode
    from streamproc.codec.framing import (
        CONFLUENT_MAGIC,
        SINGLE_OBJECT_MAGIC,
        Codec,
        SchemaLookup,
        confluent_schema_id,
        decode,
        encode,
        encode_confluent,
        peek_request_id,
        register_writer_schema,
        writing_schema,
    )
    from streamproc.codec.json_events import JSON_EVENT_TYPES, encode_json
    from streamproc.codec.json_request import InvalidJsonRequest, is_json, read_json_request
    from streamproc.codec.records import Event, from_avro, to_avro
    from streamproc.codec.writer_schemas import FINGERPRINT_ALGORITHM, avro_schema, schema_fingerprint

# The re-exports load on first use (PEP 562): importing a small module of the package (``manifest``,
# ``summary_record``) runs this file, and the Avro side (fastavro, every schema parsed) would cost each such
# command, ``status`` included, a tenth of a second it never uses.
_EXPORTED_FROM = {
    "CodecError": "codec_error", "CodecErrorCode": "codec_error",
    **dict.fromkeys(("CONFLUENT_MAGIC", "SINGLE_OBJECT_MAGIC", "Codec", "SchemaLookup", "confluent_schema_id",
                     "decode", "encode", "encode_confluent", "peek_request_id", "register_writer_schema",
                     "writing_schema"), "framing"),
    "JSON_EVENT_TYPES": "json_events", "encode_json": "json_events",
    "InvalidJsonRequest": "json_request", "is_json": "json_request", "read_json_request": "json_request",
    "Event": "records", "from_avro": "records", "to_avro": "records",
    "FINGERPRINT_ALGORITHM": "writer_schemas", "avro_schema": "writer_schemas", "schema_fingerprint": "writer_schemas",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTED_FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next use is a plain lookup
    return value


__all__ = [
    "CONFLUENT_MAGIC",
    "FINGERPRINT_ALGORITHM",
    "JSON_EVENT_TYPES",
    "SINGLE_OBJECT_MAGIC",
    "Codec",
    "CodecError",
    "CodecErrorCode",
    "Event",
    "InvalidJsonRequest",
    "SchemaLookup",
    "avro_schema",
    "confluent_schema_id",
    "decode",
    "encode",
    "encode_confluent",
    "encode_json",
    "from_avro",
    "is_json",
    "peek_request_id",
    "read_json_request",
    "register_writer_schema",
    "schema_fingerprint",
    "to_avro",
    "writing_schema",
]
