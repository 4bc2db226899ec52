"""A batch's counts as a sum that can be kept per partition and merged: what ``status`` and ``batches`` read.

The fold of the changelog (core.batch_status) keeps one entry per request ever made; a worker keeps instead, per
partition it owns, one :class:`BatchCounts` per batch, moved by each state write (the old state's share out, the
new one's in), and publishes it to the summary topic (app/batch_summaries). Readers add up the partitions' latest
counts. The fold and the summary share :meth:`BatchCounts.status`, so both say the same for the same states.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from streamproc.core.durations import HOUR_MS
from streamproc.core.events import RequestState
from streamproc.core.request_state import DEFERRAL_CODES
from streamproc.core.vocabulary import FailureLayer, RequestStatus

_ENDED = (RequestStatus.SUCCEEDED, RequestStatus.FAILED)


class LatestState(NamedTuple):
    """What a status needs of a request's latest state: one small entry per request id held by a fold."""

    status: RequestStatus
    layer: FailureLayer | None
    code: str | None
    created_ms: int
    updated_ms: int
    model: str | None
    prompt_tokens: int
    completion_tokens: int
    reused: bool
    tenant: str
    priority: str
    provider_batch: bool = False  # its usage is of a provider batch's line (priced at the discount)

    @classmethod
    def of(cls, state: RequestState) -> LatestState:
        return cls(state.status, state.last_layer, state.last_error_code, state.created_ms, state.updated_ms,
                   state.model, state.prompt_tokens, state.completion_tokens, state.reused, sys.intern(state.tenant),
                   sys.intern(state.priority), state.provider_batch)


@dataclass
class BatchCounts:
    """Counts of a batch's requests by their latest state, over one partition or summed over all.

    Counts move both ways (a state replaced takes its share out); the two times only one way, since a request's
    creation time never changes and an ended request stays ended: ``first_created_ms`` is the earliest creation
    seen (0: none), ``last_ended_ms`` the latest end seen (0: none).
    """

    by_status: Counter[str] = field(default_factory=Counter)  # RequestStatus value -> requests
    failed: Counter[str] = field(default_factory=Counter)  # FailureLayer value -> terminal failures
    parked: Counter[str] = field(default_factory=Counter)  # deferral code -> retrying requests parked by a guard
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)  # model -> (prompt, completion) tokens
    batched_usage: dict[str, tuple[int, int]] = field(default_factory=dict)  # the part of usage of provider batches
    tenants: Counter[str] = field(default_factory=Counter)  # tenant -> requests a worker has seen
    priorities: Counter[str] = field(default_factory=Counter)  # priority -> requests a worker has seen
    reused: int = 0
    first_created_ms: int = 0
    last_ended_ms: int = 0
    codes: Counter[str] = field(default_factory=Counter)  # error code -> terminal failures ("unknown": none)
    arrived: Counter[int] = field(default_factory=Counter)  # clock hour (ms) -> requests first taken in it
    succeeded_in: Counter[int] = field(default_factory=Counter)  # clock hour (ms) -> requests that succeeded in it
    failed_in: Counter[int] = field(default_factory=Counter)  # clock hour (ms) -> requests that failed in it

    @classmethod
    def of(cls, entries: Iterable[LatestState]) -> BatchCounts:
        counts = cls()
        for entry in entries:
            counts.add(entry)
        return counts

    def add(self, entry: LatestState, sign: int = 1) -> None:
        """Count ``entry`` in (``sign`` 1) or, for a state being replaced, out (``sign`` -1)."""
        self.by_status[entry.status.value] += sign
        self.arrived[entry.created_ms // HOUR_MS * HOUR_MS] += sign  # hour_of, inlined: every state write comes here
        if entry.status is RequestStatus.SUCCEEDED:
            self.succeeded_in[entry.updated_ms // HOUR_MS * HOUR_MS] += sign
        elif entry.status is RequestStatus.FAILED:
            self.failed_in[entry.updated_ms // HOUR_MS * HOUR_MS] += sign
            self.codes[entry.code or "unknown"] += sign
        if entry.status is not RequestStatus.PENDING:
            self.tenants[entry.tenant] += sign
            self.priorities[entry.priority] += sign
        ended = entry.status in _ENDED
        self.reused += sign * (entry.status is RequestStatus.SUCCEEDED and entry.reused)
        if ended and entry.model is not None:  # a result, or an answer paid for but too large for one
            tokens = (sign * entry.prompt_tokens, sign * entry.completion_tokens)
            _add_tokens(self.usage, entry.model, tokens)
            if entry.provider_batch:
                _add_tokens(self.batched_usage, entry.model, tokens)
        if entry.status is RequestStatus.FAILED:
            self.failed[(entry.layer or FailureLayer.BUSINESS).value] += sign
        elif entry.status is RequestStatus.RETRYING and entry.code is not None and entry.code in DEFERRAL_CODES:
            self.parked[entry.code] += sign
        if sign > 0:
            if entry.created_ms and (not self.first_created_ms or entry.created_ms < self.first_created_ms):
                self.first_created_ms = entry.created_ms
            if ended:
                self.last_ended_ms = max(self.last_ended_ms, entry.updated_ms)

    def merge(self, other: BatchCounts) -> None:
        """Add another partition's counts of the same batch."""
        self.by_status.update(other.by_status)
        self.failed.update(other.failed)
        self.parked.update(other.parked)
        self.tenants.update(other.tenants)
        self.priorities.update(other.priorities)
        for mine, theirs in ((self.usage, other.usage), (self.batched_usage, other.batched_usage)):
            for model, tokens in theirs.items():
                _add_tokens(mine, model, tokens)
        self.reused += other.reused
        self.codes.update(other.codes)
        for by_hour, other_by_hour in ((self.arrived, other.arrived), (self.succeeded_in, other.succeeded_in),
                                       (self.failed_in, other.failed_in)):
            by_hour.update(other_by_hour)
        if other.first_created_ms and (not self.first_created_ms or other.first_created_ms < self.first_created_ms):
            self.first_created_ms = other.first_created_ms
        self.last_ended_ms = max(self.last_ended_ms, other.last_ended_ms)

    @property
    def empty(self) -> bool:
        return not any(self.by_status.values())

    def drop_hours_before(self, first_ms: int) -> None:
        """Forget the per-hour counts of the hours before ``first_ms``: nothing shows them, and a stream that runs
        for months would otherwise keep one entry per hour it ran."""
        for by_hour in (self.arrived, self.succeeded_in, self.failed_in):
            for hour in [hour for hour in by_hour if hour < first_ms]:
                del by_hour[hour]


def _add_tokens(usage: dict[str, tuple[int, int]], model: str, tokens: tuple[int, int]) -> None:
    prompt, completion = usage.get(model, (0, 0))
    usage[model] = (prompt + tokens[0], completion + tokens[1])


def hour_of(ms: int) -> int:
    """The start of the clock hour (UTC) ``ms`` falls in."""
    return ms // HOUR_MS * HOUR_MS


class SummaryKey(NamedTuple):
    """Where a summary is kept: one record per (batch, partition of the request topics) on the summary topic;
    ``batch_id`` None is the stream, the requests that name no batch."""

    batch_id: str | None
    partition: int


@dataclass
class SummaryView:
    """The latest summary of each (batch, partition), as a reader of the compacted summary topic sees them; a
    tombstone (the batch forgotten) takes its key out."""

    latest: dict[SummaryKey, tuple[BatchCounts, int]] = field(default_factory=dict)  # -> (counts, written at ms)

    def put(self, key: SummaryKey, counts: BatchCounts | None, at_ms: int = 0) -> None:
        if counts is None:
            self.latest.pop(key, None)
        else:
            self.latest[key] = (counts, at_ms)

    def batches(self) -> Mapping[str, tuple[BatchCounts, int]]:
        """Per batch, its partitions' counts summed, and when the newest of them was written (ms); the stream is
        not a batch (:meth:`batch` of None)."""
        summed: dict[str, tuple[BatchCounts, int]] = {}
        for key, (counts, at_ms) in self.latest.items():
            if key.batch_id is None:
                continue
            total, newest = summed.get(key.batch_id, (BatchCounts(), 0))
            total.merge(counts)
            summed[key.batch_id] = (total, max(newest, at_ms))
        return summed

    def batch(self, batch_id: str | None) -> tuple[BatchCounts, int]:
        """One batch's counts (None: the stream's) summed over its partitions, and when the newest was written (0:
        no summary)."""
        total, newest = BatchCounts(), 0
        for key, (counts, at_ms) in self.latest.items():
            if key.batch_id == batch_id:
                total.merge(counts)
                newest = max(newest, at_ms)
        return total, newest
