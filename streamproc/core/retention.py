"""Forgetting finished batches (design §8, "State size"): which batches may go, and what is kept of one that went.

The state table keeps one entry per request ever handled, so its changelog, every restore from scratch and every
fold of ``status`` grow with all history. ``streamproc forget`` (and the workers' automatic retention) removes a
finished batch's states; its manifest keeps a :class:`Forgotten` summary, so the batch is still reported, as
forgotten, and a request that arrives for it later is refused (``batch_forgotten``) instead of started again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from streamproc.core.batch_status import BatchStatus, counted_status
from streamproc.core.batch_summary import BatchCounts
from streamproc.core.durations import parse_duration_ms

BATCH_FORGOTTEN: Final = "batch_forgotten"
"""The business failure of a request whose batch was forgotten: it is refused, never called nor given a state."""

_DAYS: Final = re.compile(r"(\d+(?:\.\d+)?)d")
_DAY_MS: Final = 86_400_000
OUTCOMES_MARGIN_MS: Final = 7 * _DAY_MS
"""How much longer than a batch's retention its results and failures are kept: a week to export it after it is
forgotten, and room for a batch that ran for days (a record's retention counts from when it was written)."""


@dataclass(frozen=True)
class Forgotten:
    """What the manifest of a forgotten batch keeps of it: when it was forgotten, when it had finished, its counts."""

    at_ms: int
    finished_ms: int
    succeeded: int
    failed: Mapping[str, int] = field(default_factory=dict)  # terminal failures by layer
    usage: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # per model: prompt, completion tokens
    batched_usage: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # of usage, provider batches' lines

    def status(self, batch_id: str) -> BatchStatus:
        """The batch's counts and usage as they were when it was forgotten: nothing waits any more."""
        failed = dict(self.failed)
        return BatchStatus(batch_id=batch_id, submitted=self.succeeded + sum(failed.values()),
                           succeeded=self.succeeded, failed=failed, retrying=0, in_flight=0, pending=0,
                           last_progress_ms=self.finished_ms, usage=dict(self.usage),
                           batched_usage=dict(self.batched_usage))


def forgotten_at(status: BatchStatus, now_ms: int) -> Forgotten:
    """The summary a batch's manifest keeps once it is forgotten at ``now_ms``."""
    return Forgotten(now_ms, status.last_progress_ms, status.succeeded,
                     {layer: count for layer, count in status.failed.items() if count}, dict(status.usage),
                     dict(status.batched_usage))


def refusal(status: BatchStatus, force: bool) -> str | None:
    """Why the batch may not be forgotten (its requests are not all ended), or None; ``force`` forgets it anyway."""
    if force or status.converged:
        return None
    return (f"batch {status.batch_id!r} has not finished ({status.ended} of {status.submitted} requests ended): "
            "only a finished batch is forgotten, unless --force")


def finished_before(status: BatchStatus, cutoff_ms: int) -> bool:
    """Whether the batch finished (every request ended) before ``cutoff_ms``."""
    return status.converged and status.last_progress_ms < cutoff_ms


class Submitted(NamedTuple):
    """What a batch's manifest tells retention: how many requests it submitted, when, and whether it is forgotten."""

    requests: int
    created_ms: int
    forgotten: bool = False


def finished_by_counts(counts: Mapping[str, BatchCounts], manifests: Mapping[str, Submitted],
                       cutoff_ms: int) -> list[BatchStatus]:
    """The batches not forgotten yet whose summed counts (the workers' summaries) say every request ended before
    ``cutoff_ms``, by batch id: automatic retention's choice, without a read of any request's state.

    A batch is counted as ``status`` counts it (``counted_status``), so a batch with a manifest and no summary
    yet is pending, not finished; one without a manifest (produced without ``submit``) has the requests its
    counts hold. The summaries lag the states, never the other way: an ended request stays ended, so a batch
    they call finished is.
    """
    due = []
    for batch_id in sorted(counts.keys() | manifests.keys()):
        manifest = manifests.get(batch_id, Submitted(0, 0))
        if manifest.forgotten:
            continue
        status = counted_status(batch_id, counts.get(batch_id, BatchCounts()), manifest.requests, manifest.created_ms)
        if finished_before(status, cutoff_ms):
            due.append(status)
    return due


def parse_retention_ms(text: str) -> int | None:
    """A retention such as ``30d``, ``12h``, ``90m`` or bare seconds, in ms; None when it is none of these."""
    text = text.strip()
    days = _DAYS.fullmatch(text)
    if days is not None:
        return round(float(days.group(1)) * _DAY_MS)
    return parse_duration_ms(text)


def check_interval_s(retain_ms: int) -> float:
    """How often automatic retention looks for batches to forget: a tenth of the retention, at least every hour and
    at most every 10 s (each look reads the summaries and manifests: their size grows with the batches kept)."""
    return min(3600.0, max(10.0, retain_ms / 10_000))


def outcomes_retention_ms(retain_ms: int | None) -> int | None:
    """The retention the results and failure topics are created with: longer than a finished batch is kept (None: no
    automatic retention, the broker's default)."""
    return None if retain_ms is None else retain_ms + OUTCOMES_MARGIN_MS
