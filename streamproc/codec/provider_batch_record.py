"""Provider-batch records on the compacted ``<prefix>.provider-batches`` topic (issue 31), keyed by the gather id
(:mod:`streamproc.core.provider_batch_takeover`); the tombstone of a key drops a batch whose members all ended.

Small JSON with a version field ``v``, not Avro, for the reason the fleet beats and the batch summaries give: an
operations record no event decoder reads, which an older worker must still read after a newer one adds fields (a
JSON reader skips what it does not know); a reader that meets a higher ``v`` refuses the record rather than
misread it. A record must fit in one Kafka record (``core.record_size.RECORD_BYTES``): the members' ids are in
it, so the gatherer seals a batch before its members' ids (:func:`member_bytes`) pass that room
(:class:`RecordTooLarge` otherwise).

``attempts`` (each member's attempt, in line order) was added within version 1: a reader skips a field it does
not know, and a record written without it reads as attempts unknown (``None``: its lines match by request id).
"""

from __future__ import annotations

import json
from typing import Any, Final

from streamproc.core.provider_batch_takeover import ProviderBatchRecord, RecordState
from streamproc.core.record_size import RECORD_BYTES

VERSION: Final = 1
_PROVIDERS: Final = ("openai", "anthropic")


class RecordTooLarge(ValueError):
    """A record whose members' ids do not fit in one Kafka record: the batch must be gathered smaller."""


_ATTEMPT_BYTES: Final = 12  # an attempt in ``attempts`` and its comma


def member_bytes(request_id: str) -> int:
    """The most a member adds to its batch's record: its id as written in ``members``, its comma, its attempt."""
    return len(json.dumps(request_id, ensure_ascii=False).encode()) + 1 + _ATTEMPT_BYTES


def encode_provider_batch(record: ProviderBatchRecord) -> bytes:
    fields: dict[str, Any] = {"v": VERSION, "provider": record.provider, "model": record.model,
                              "partition": record.partition, "members": list(record.members),
                              "state": record.state.value, "created_ms": record.created_ms,
                              "updated_ms": record.updated_ms}
    for name in ("provider_batch_id", "input_file_id"):
        if (value := getattr(record, name)) is not None:
            fields[name] = value
    if record.attempts is not None:
        fields["attempts"] = list(record.attempts)
    data = json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()
    if len(data) + len(record.gather_id.encode()) > RECORD_BYTES:
        raise RecordTooLarge(f"provider batch {record.gather_id!r}: {len(record.members)} members make a "
                             f"{len(data):,}-byte record; a record holds {RECORD_BYTES:,}")
    return data


def decode_provider_batch(gather_id: bytes, raw: bytes) -> ProviderBatchRecord:
    """The record of key ``gather_id``; raises ValueError for a value this version cannot read."""
    try:
        fields = json.loads(raw)
        version = fields.get("v") if isinstance(fields, dict) else None
        if version != VERSION:
            raise ValueError(f"provider batch record of version {version!r} (this one reads {VERSION})")
        provider = fields["provider"]
        if provider not in _PROVIDERS:
            raise ValueError(f"unknown provider {provider!r}")
        members = fields["members"]
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise ValueError("members is not a list of request ids")
        attempts = fields.get("attempts")
        if attempts is not None and (not isinstance(attempts, list) or len(attempts) != len(members) or not all(
                isinstance(a, int) and not isinstance(a, bool) and a >= 1 for a in attempts)):
            raise ValueError("attempts is not one attempt number per member")
        return ProviderBatchRecord(
            gather_id=gather_id.decode(), provider=provider, model=_text(fields, "model"),
            partition=_int(fields, "partition"), members=tuple(members), state=RecordState(fields["state"]),
            created_ms=_int(fields, "created_ms"), updated_ms=_int(fields, "updated_ms"),
            provider_batch_id=_optional_text(fields, "provider_batch_id"),
            input_file_id=_optional_text(fields, "input_file_id"),
            attempts=None if attempts is None else tuple(attempts))
    except (KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a provider batch record: {exc!r}") from exc


def _text(fields: dict[str, Any], name: str) -> str:
    value = fields[name]
    if not isinstance(value, str):
        raise ValueError(f"{name} is not a string: {value!r}")
    return value


def _optional_text(fields: dict[str, Any], name: str) -> str | None:
    return None if fields.get(name) is None else _text(fields, name)


def _int(fields: dict[str, Any], name: str) -> int:
    value = fields[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} is not an integer: {value!r}")
    return value
