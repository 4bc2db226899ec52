"""The JSON Schemas of the events written as JSON, derived from their Avro schemas so the two never drift.

``schemas/<Name>.schema.json`` (JSON Schema 2020-12) is what a JSON consumer validates against; it is made from
``schemas/<Name>.avsc`` here, and a test checks the files against it. After changing an ``.avsc``, write them
again with ``python -m streamproc.codec.json_schema``.

The mapping follows how :mod:`streamproc.codec.json_events` writes an event: a record is an object whose fields
without an Avro default are required (a reader ignores fields it does not know, so more are allowed), a
nullable field is its value or ``null``, an enum its symbol, a map an object, ``int`` and ``long`` integers
within their Avro range.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from streamproc.codec.json_events import JSON_EVENT_TYPES
from streamproc.codec.records import Event
from streamproc.codec.writer_schemas import avro_schema

__all__ = ["json_schema", "json_schema_text", "schema_file_name"]

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
_PRIMITIVES: Final[dict[str, dict[str, Any]]] = {
    "null": {"type": "null"},
    "boolean": {"type": "boolean"},
    "int": {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1},
    "long": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
    "float": {"type": "number"},
    "double": {"type": "number"},
    "string": {"type": "string"},
}


def schema_file_name(record_type: type[Event]) -> str:
    """The file beside ``<Name>.avsc`` in ``schemas/``."""
    return f"{record_type.__name__}.schema.json"


def json_schema(record_type: type[Event]) -> dict[str, Any]:
    """The JSON Schema of an event as :func:`streamproc.codec.json_events.encode_json` writes it."""
    if record_type not in JSON_EVENT_TYPES:
        raise TypeError(f"{record_type.__name__} is not written as JSON")
    return {"$schema": DIALECT, "title": record_type.__name__, **_type(avro_schema(record_type))}


def json_schema_text(record_type: type[Event]) -> str:
    """The schema file's text: indented, keys in the Avro order, a final newline."""
    return json.dumps(json_schema(record_type), indent=2, ensure_ascii=False) + "\n"


def _type(avro: Any) -> dict[str, Any]:
    if isinstance(avro, str):
        if avro not in _PRIMITIVES:
            raise ValueError(f"Avro type {avro!r} has no JSON form here (a named type is written inline)")
        return dict(_PRIMITIVES[avro])
    if isinstance(avro, list):
        return {"anyOf": [_type(branch) for branch in avro]}
    kind = avro["type"]
    match kind:
        case "record":
            return _record(avro)
        case "enum":
            return {"type": "string", "enum": list(avro["symbols"])}
        case "map":
            return {"type": "object", "additionalProperties": _type(avro["values"])}
        case "array":
            return {"type": "array", "items": _type(avro["items"])}
        case _:
            return _type(kind)


def _record(avro: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for field in avro["fields"]:
        prop = _type(field["type"])
        if "doc" in field:
            prop["description"] = field["doc"]
        if "default" in field:
            prop["default"] = field["default"]
        properties[field["name"]] = prop
    schema: dict[str, Any] = {"type": "object"}
    if "doc" in avro:
        schema["description"] = avro["doc"]
    schema["properties"] = properties
    schema["required"] = [field["name"] for field in avro["fields"] if "default" not in field]
    return schema


def main(folder: Path = Path(__file__).parent / "schemas") -> None:
    """Write every JSON event's schema file into ``folder`` (the top-level ``schemas/``)."""
    for record_type in JSON_EVENT_TYPES:
        path = folder / schema_file_name(record_type)
        path.write_text(json_schema_text(record_type), encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
