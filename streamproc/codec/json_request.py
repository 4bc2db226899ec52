"""A request written to the request topic as JSON by a producer of its own (design §3, "JSON requests").

A value whose first byte is ``{`` is JSON: Avro single-object encoding starts with ``C3 01`` and the Confluent
wire format with ``00``, so the first byte tells the three apart. The object is an OpenAI Batch line or the
simple form, checked by the rules ``submit`` checks a line with (:mod:`streamproc.core.request_line`, same
reasons), plus three fields of the record, each also accepted as a header: ``batch_id`` (``x-batch-id``),
``tenant`` (``x-tenant``) and ``priority`` (``x-priority``). A request with a batch is keyed
``<batch_id>/<custom_id>`` as ``submit`` keys it; one without is a stream request keyed by its ``custom_id``.
Tenant and priority are checked (:mod:`streamproc.core.tenancy`) and carried on the request's own fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from streamproc.codec.json_events import JSON_START
from streamproc.core.events import InferenceRequest
from streamproc.core.identity import batch_id_problem, request_id_for
from streamproc.core.request_line import (
    InvalidLine,
    LineLimits,
    loads_line,
    plausible_id,
    read_request,
    text_field,
)
from streamproc.core.tenancy import PRIORITY_HEADER, TENANT_HEADER, InvalidTenancy, tenancy_of

__all__ = ["BATCH_HEADER", "InvalidJsonRequest", "is_json", "read_json_request"]

BATCH_HEADER: Final = "x-batch-id"
_CARRIED: Final = {"batch_id": BATCH_HEADER, "tenant": TENANT_HEADER, "priority": PRIORITY_HEADER}
MAX_LABEL_BYTES: Final = 256  # a batch id, tenant or priority is read no further (each is checked after)


@dataclass(frozen=True)
class InvalidJsonRequest:
    """Why a JSON record is no request; ``request_id`` when the record names one (its failure is filed there), and
    the batch it names (its failure counts in that batch)."""

    request_id: str | None
    reason: str
    batch_id: str | None = None


def is_json(value: bytes | None) -> bool:
    """Whether a record's value is a JSON request (its first byte is ``{``), not an Avro frame."""
    return value is not None and value[:1] == JSON_START


def read_json_request(value: bytes, record_headers: Mapping[str, bytes], limits: LineLimits,
                      submitted_ms: int) -> InferenceRequest | InvalidJsonRequest:
    """The request a JSON record asks for, or why it is none."""
    parsed: Any = None
    batch_id: str | None = None
    batch_known = False  # the batch the record names, or that it names none: its id can be known
    try:
        parsed = loads_line(_text(value))
        batch_id = _carried(parsed, record_headers, "batch_id")
        if batch_id is not None and (problem := batch_id_problem(batch_id)) is not None:
            raise InvalidLine(f"batch_id {batch_id!r}: {problem}")
        batch_known = True
        try:
            tenancy = tenancy_of(_carried(parsed, record_headers, "tenant"), _carried(parsed, record_headers,
                                                                                       "priority"))
        except InvalidTenancy as invalid:
            raise InvalidLine(str(invalid)) from None
        asked = read_request(parsed, limits, envelope=tuple(_CARRIED))
    except InvalidLine as invalid:
        named = invalid.custom_id or (plausible_id(parsed) if isinstance(parsed, dict) else None)
        return InvalidJsonRequest(_request_id(batch_id, named) if batch_known and named is not None else None,
                                  invalid.reason, batch_id if batch_known else None)
    return InferenceRequest(_request_id(batch_id, asked.custom_id), asked.body_json, url=asked.url,
                            batch_id=batch_id, submitted_ms=submitted_ms, tenant=tenancy.tenant,
                            priority=tenancy.priority)


def _request_id(batch_id: str | None, custom_id: str) -> str:
    """Scoped by its batch as ``submit`` scopes it; a stream request's id is its custom_id."""
    return custom_id if batch_id is None else request_id_for(batch_id, custom_id)


def _text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidLine(f"not valid UTF-8: byte 0x{value[exc.start]:02x} at byte {exc.start + 1}") from None


def _carried(parsed: Any, record_headers: Mapping[str, bytes], name: str) -> str | None:
    """A record field given in the object or as its header (the same value when both), or None."""
    header = _CARRIED[name]
    field = parsed.get(name) if isinstance(parsed, dict) else None
    if field is not None:
        field = text_field(field, name, MAX_LABEL_BYTES)
    raw = record_headers.get(header)
    if raw is None:
        return field
    try:
        from_header = text_field(raw.decode("utf-8"), f"header {header}", MAX_LABEL_BYTES)
    except UnicodeDecodeError:
        raise InvalidLine(f"header {header} is not valid UTF-8") from None
    if field is not None and field != from_header:
        raise InvalidLine(f"{name} {field!r} and header {header} {from_header!r} differ; give one")
    return from_header
