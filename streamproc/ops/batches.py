"""``batches``: every batch of this deployment with its counts and state, newest first, like OpenAI's batch list.

Batches come from their manifests (``submit`` writes one per batch) and from the workers' summaries (a batch
produced without ``submit`` has none); counts are the summaries' as ``status`` has them, or with ``verify`` folded
from the state changelog.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from streamproc.app.summary_reader import read_summaries
from streamproc.app.topic_reader import TopicReader
from streamproc.codec.manifest import BatchManifest
from streamproc.core.batch_lifecycle import Lifecycle
from streamproc.core.batch_status import BatchesFold, BatchStatus, counted_status, parked_text
from streamproc.core.batch_summary import BatchCounts, SummaryView
from streamproc.core.spend_cap import Cap, spend_json, spend_of
from streamproc.core.topology import Topology
from streamproc.kafka.connection import KafkaConnection
from streamproc.ops.status import decode_caps, decode_records, lifecycle_of, read_status, status_of

COLUMNS = ("BATCH", "CREATED", "STATUS", "TENANT", "PRIORITY", "TOTAL", "SUCCEEDED", "FAILED", "WAITING", "SPEND")
_LEFT_ALIGNED = 5  # the first columns are words, the rest numbers


@dataclass(frozen=True)
class BatchEntry:
    """One row of the list: the batch's counts and when it was created (its manifest, else its first state)."""

    status: BatchStatus
    created_ms: int
    manifest: BatchManifest | None
    spend: dict[str, float | int | None] = field(default_factory=dict)  # what its results cost, and its cap

    @property
    def lifecycle(self) -> Lifecycle:
        """OpenAI's batch status and its times (core.batch_lifecycle): ``in_progress`` until every request ended
        (``cancelling`` after a cancel), then ``completed``, ``cancelled`` or ``expired``."""
        return lifecycle_of(self.status, self.manifest)

    @property
    def state(self) -> str:
        return self.lifecycle.status

    def as_json(self) -> dict[str, Any]:
        """OpenAI's batch object's keys (``id``, ``status``, the ``*_at`` times in seconds, ``request_counts``,
        ``usage``), plus our counts as ``status --json`` has them."""
        status = self.status
        return {"id": status.batch_id, "object": "batch", **self.lifecycle.as_json(),
                "request_counts": {"total": status.submitted, "completed": status.succeeded,
                                   "failed": status.terminal_failures},
                "usage": status.usage_json(),
                "source": None if self.manifest is None else self.manifest.source,
                "spend": self.spend, "counts": status.as_json()}


async def list_batches(kafka: KafkaConnection, topology: Topology,
                       prices: Mapping[str, tuple[float, float]] | None = None,
                       verify: bool = False) -> list[BatchEntry]:
    """Every batch of this deployment, newest first, with what its results cost at ``prices``; counted from the
    workers' summaries, or with ``verify`` from every state on the changelog."""
    fold = BatchesFold()
    summaries = SummaryView()
    manifests: dict[str, BatchManifest] = {}
    caps: dict[str, Cap] = {}
    counted = topology.state_changelog if verify else topology.summaries
    async with TopicReader(kafka, [counted, topology.batches]) as reader:
        async for chunk in reader.chunks_to_end():
            found, states = decode_records(chunk, topology)
            manifests.update((manifest.batch_id, manifest) for manifest in found)
            caps.update(decode_caps(chunk, topology))
            fold.apply(states)
            read_summaries(chunk, topology, summaries)
    summed = summaries.batches()
    entries = []
    for batch_id in manifests.keys() | fold.folds.keys() | summed.keys():
        manifest = manifests.get(batch_id)
        if verify:
            status = status_of(manifest, functools.partial(fold.status, batch_id))
            first_ms = fold.folds[batch_id].first_created_ms if batch_id in fold.folds else 0
        else:
            counts = summed.get(batch_id, (BatchCounts(), 0))[0]
            status = status_of(manifest, functools.partial(counted_status, batch_id, counts))
            first_ms = counts.first_created_ms
        created_ms = first_ms if manifest is None else manifest.created_ms
        spend = spend_json(spend_of(status.usage, prices or {}, status.batched_usage), caps.get(batch_id))
        entries.append(BatchEntry(status, created_ms, manifest, spend))
    return sorted(entries, key=lambda entry: (entry.created_ms, entry.status.batch_id), reverse=True)


async def batch_object(kafka: KafkaConnection, topology: Topology, batch_id: str, *, stall_after_s: float,
                       prices: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """One batch's object as ``batches --json`` lists it: the summary ``results --summary`` writes."""
    report = await read_status(kafka, topology, batch_id, stall_after_s=stall_after_s, prices=prices)
    spend = spend_json(report.spent, report.cap)
    return BatchEntry(report.status, report.lifecycle.created_ms, report.manifest, spend).as_json()


def format_batches(entries: list[BatchEntry]) -> str:
    """An aligned table for people; ``--json`` is the form for scripts."""
    rows = [COLUMNS] + [
        (entry.status.batch_id, _created(entry.created_ms), entry.state, _most(entry.status.tenants),
         _most(entry.status.priorities), str(entry.status.submitted),
         str(entry.status.succeeded), str(entry.status.terminal_failures),
         _waiting(entry.status), _spend(entry.spend))
        for entry in entries]
    widths = [max(len(row[column]) for row in rows) for column in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) if column < _LEFT_ALIGNED else cell.rjust(width)
                               for column, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
                     for row in rows)


def _waiting(status: BatchStatus) -> str:
    """The requests not ended, and of them those a guard parked, by why (``12 (12 tenant_paused)``): a batch that
    waits on a paused tenant or model says so in the list, not only in ``status``."""
    waiting = str(status.submitted - status.ended)
    return f"{waiting} ({parked_text(status.parked)})" if status.parked else waiting


def _most(counts: dict[str, int]) -> str:
    """The name most of the batch's requests have, ``+N`` for the N others (``status`` shows each)."""
    if not counts:
        return "-"
    most = min(counts.items(), key=lambda item: (-item[1], item[0]))[0]
    return most if len(counts) == 1 else f"{most} +{len(counts) - 1}"


def _spend(spend: dict[str, float | int | None]) -> str:
    """What the batch's results cost, and of which cap: ``$2.9031 of $3``; ``-`` when nothing is priced or capped."""
    cost, cap = spend.get("cost_usd") or 0, spend.get("max_cost_usd")
    tokens, token_cap = spend.get("tokens") or 0, spend.get("max_tokens")
    if cap is not None or (cost and token_cap is None):
        return f"${cost:.4f}" + (f" of ${cap:g}" if cap is not None else "")
    if token_cap is not None:
        return f"{tokens:,} of {token_cap:,} tokens"
    return "-"


def _created(created_ms: int) -> str:
    return "-" if created_ms <= 0 else datetime.fromtimestamp(created_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
