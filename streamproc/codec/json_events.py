"""Results and failure events as JSON, for consumers without Avro (design §3, "JSON out").

With ``STREAMPROC_RECORD_FORMAT=json`` the worker writes the results and failure topics as one JSON object per
record: the Avro record of the event (:mod:`streamproc.codec.records`) as plain JSON, a nullable field as its
value or ``null``, an enum as its symbol, ``metadata`` as an object of strings. The contract is
``schemas/<Name>.schema.json`` (JSON Schema, derived from the ``.avsc`` by :mod:`streamproc.codec.json_schema`).

Every reader reads both formats, a topic that holds both included: :func:`streamproc.codec.decode` sends a value
whose first byte is ``{`` here. A reader takes what it knows: fields it does not know are ignored, a field the
object lacks takes the current Avro schema's default, and one without a default is ``missing_fields``, as
Avro's schema resolution does.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Final

from fastavro.validation import ValidationError, validate

from streamproc.codec.codec_error import CodecError, CodecErrorCode, shorten
from streamproc.codec.records import AvroRecord, E, Event, from_avro, to_avro
from streamproc.codec.writer_schemas import current_schema, record_of
from streamproc.core.events import FailureEvent, InferenceResult

__all__ = ["JSON_EVENT_TYPES", "JSON_START", "decode_json", "encode_json"]

JSON_START: Final = b"{"
JSON_EVENT_TYPES: Final[tuple[type[Any], ...]] = (InferenceResult, FailureEvent)
"""The events a worker may write as JSON: those of the topics its consumers read."""


def encode_json(record: Event) -> bytes:
    """The event as one compact JSON object (UTF-8), fields in the order of its Avro schema."""
    try:
        return json.dumps(to_avro(record), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:  # an unpaired surrogate, a value JSON cannot hold
        name = type(record).__name__
        raise CodecError(CodecErrorCode.UNENCODABLE, f"cannot encode {name} as JSON: {exc}") from exc


def decode_json(data: bytes, expected: type[E]) -> E:
    """The event a JSON object holds, read with the current schema of ``expected``; :class:`CodecError` if not."""
    name = expected.__name__
    if expected not in JSON_EVENT_TYPES:  # a programming error: the framing decides before calling
        raise TypeError(f"a {name} is never JSON (only {', '.join(t.__name__ for t in JSON_EVENT_TYPES)} are)")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CodecError(CodecErrorCode.CORRUPT_BODY, f"corrupt {name} JSON: {shorten(str(exc))}") from exc
    reader = current_schema(expected).writer.parsed
    missing: list[str] = []
    datum = _resolved(value, reader, "", missing)
    if missing:
        raise CodecError(CodecErrorCode.MISSING_FIELDS,
                         f"{name} JSON lacks required field(s) {', '.join(missing)}, which have no default")
    try:
        validate(datum, reader, raise_errors=True)
    except ValidationError as exc:
        raise CodecError(CodecErrorCode.CORRUPT_BODY,
                         f"{name} JSON does not follow its schema: {shorten(str(exc))}") from exc
    return from_avro(datum, expected)


def _resolved(value: Any, schema: Any, path: str, missing: list[str]) -> Any:
    """``value`` with the defaults of the fields it lacks, nested records included, and only the schema's
    fields; the names of required fields it lacks are added to ``missing``."""
    record = record_of(schema)
    if record is None or not isinstance(value, dict):
        return value  # not a record here: the validation judges it
    datum: AvroRecord = {}
    for field in record["fields"]:
        field_name = field["name"]
        if field_name in value:
            datum[field_name] = _resolved(value[field_name], field["type"], f"{path}{field_name}.", missing)
        elif "default" in field:
            datum[field_name] = copy.deepcopy(field["default"])  # a {} default must not be shared
        else:
            missing.append(path + field_name)
    return datum
