"""How events look on Kafka: Avro schemas (the top-level ``schemas/``), records, framing, batch manifests.

The public API is re-exported here, so callers write ``from streamproc import codec`` and ``codec.decode``.
"""

from __future__ import annotations

from streamproc.codec.framing import (
    CONFLUENT_MAGIC,
    FINGERPRINT_ALGORITHM,
    SINGLE_OBJECT_MAGIC,
    Codec,
    CodecError,
    CodecErrorCode,
    Event,
    SchemaLookup,
    avro_schema,
    decode,
    encode,
    encode_confluent,
    from_avro,
    peek_request_id,
    register_writer_schema,
    schema_fingerprint,
    to_avro,
)

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
