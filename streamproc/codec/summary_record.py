"""Batch summaries on the compacted ``<prefix>.summaries`` topic (design §4): one record per (batch, partition of
the request topics), written by the worker that owns the partition, with that partition's counts of the batch.

The key is ``<partition>:<batch_id>`` (a batch id may hold any character, a partition number none of ``:``), so
compaction keeps the latest counts of each pair and a tombstone (the batch forgotten) drops one pair; the stream
(requests that name no batch) is ``stream:<partition>``, which a reader of before the stream's summary skips with a
warning. The value is
small JSON with a version field ``v``, like the manifests and the fleet beats: an operations record that an older
reader must still read after fields are added; a reader that meets a higher ``v`` refuses the record rather than
miscount.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Final

from streamproc.core.batch_summary import BatchCounts, SummaryKey

VERSION: Final = 1


_STREAM = "stream"


def encode_summary_key(key: SummaryKey) -> bytes:
    if key.batch_id is None:
        return f"{_STREAM}:{key.partition}".encode()
    return f"{key.partition}:{key.batch_id}".encode()


def decode_summary_key(raw: bytes) -> SummaryKey:
    """Raises ValueError for a key that is not ``<partition>:<batch_id>`` nor ``stream:<partition>``."""
    partition, separator, batch_id = raw.decode().partition(":")
    if partition == _STREAM and batch_id.isdigit():
        return SummaryKey(None, int(batch_id))
    if not separator or not partition.isdigit() or not batch_id:
        raise ValueError(f"not a batch summary key: {raw!r}")
    return SummaryKey(batch_id, int(partition))


def encode_summary(counts: BatchCounts, at_ms: int) -> bytes:
    fields: dict[str, Any] = {"v": VERSION, "at_ms": at_ms, "counts": _positive(counts.by_status)}
    for name, counter in (("failed", counts.failed), ("parked", counts.parked), ("tenants", counts.tenants),
                          ("priorities", counts.priorities), ("codes", counts.codes)):
        if positive := _positive(counter):
            fields[name] = positive
    for name, by_hour in (("arrived", counts.arrived), ("succeeded_in", counts.succeeded_in),
                          ("failed_in", counts.failed_in)):
        if positive := {str(hour): count for hour, count in sorted(by_hour.items()) if count}:
            fields[name] = positive
    for name, usage in (("usage", counts.usage), ("batched_usage", counts.batched_usage)):
        if usage:
            fields[name] = {model: list(tokens) for model, tokens in usage.items()}
    for name, value in (("reused", counts.reused), ("first_created_ms", counts.first_created_ms),
                        ("last_ended_ms", counts.last_ended_ms)):
        if value:
            fields[name] = value
    return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()


def decode_summary(raw: bytes) -> tuple[BatchCounts, int]:
    """The counts and when they were written (ms); raises ValueError for a value this version cannot read."""
    try:
        fields = json.loads(raw)
        if not isinstance(fields, dict) or fields.get("v") != VERSION:
            raise ValueError(f"batch summary of version {fields.get('v') if isinstance(fields, dict) else None!r}"
                             f" (this one reads {VERSION})")
        counts = BatchCounts(
            by_status=Counter({str(k): int(v) for k, v in fields["counts"].items()}),
            failed=Counter({str(k): int(v) for k, v in fields.get("failed", {}).items()}),
            parked=Counter({str(k): int(v) for k, v in fields.get("parked", {}).items()}),
            tenants=Counter({str(k): int(v) for k, v in fields.get("tenants", {}).items()}),
            priorities=Counter({str(k): int(v) for k, v in fields.get("priorities", {}).items()}),
            usage=_usage(fields.get("usage", {})), batched_usage=_usage(fields.get("batched_usage", {})),
            reused=int(fields.get("reused", 0)), first_created_ms=int(fields.get("first_created_ms", 0)),
            last_ended_ms=int(fields.get("last_ended_ms", 0)),
            codes=Counter({str(k): int(v) for k, v in fields.get("codes", {}).items()}),
            arrived=_by_hour(fields.get("arrived", {})), succeeded_in=_by_hour(fields.get("succeeded_in", {})),
            failed_in=_by_hour(fields.get("failed_in", {})))
        return counts, int(fields["at_ms"])
    except (KeyError, TypeError, AttributeError, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a batch summary: {exc!r}") from exc


def _usage(field: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {str(model): (int(tokens[0]), int(tokens[1])) for model, tokens in field.items()}


def _by_hour(field: dict[str, Any]) -> Counter[int]:
    return Counter({int(hour): int(count) for hour, count in field.items()})


def _positive(counter: Counter[str]) -> dict[str, int]:
    return {key: count for key, count in sorted(counter.items()) if count}
