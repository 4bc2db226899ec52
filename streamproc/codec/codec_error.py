"""The one error the codec raises, so that a bad payload is a failure a person can act on, not a crash.

Every decoding problem raises :class:`CodecError` with a machine-readable ``code`` and a precise message: the
worker turns poison records into business failures (or dead letters, when ``peek_request_id`` cannot recover
an id) and the message is what a person reads to fix the producer.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["CodecError", "CodecErrorCode", "shorten"]


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


def shorten(text: str, limit: int = 300) -> str:
    """fastavro's resolution errors can print whole schemas; a failure message must stay readable."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
