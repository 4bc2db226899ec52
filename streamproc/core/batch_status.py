"""Per-batch counts, folded from the request-state changelog (the RocksDB table's backup topic).

The fold keeps one small entry per request id of the batch and is fed incrementally; its cost grows with every
request the changelog holds, so it is ``status --verify``: ``status``, ``batches`` and ``run`` read the workers'
summaries (core.batch_summary), counted into a status by :func:`counted_status` as the fold's entries are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from streamproc.core.batch_summary import BatchCounts, LatestState
from streamproc.core.events import RequestState
from streamproc.core.vocabulary import FailureLayer, RequestStatus


@dataclass(frozen=True)
class BatchStatus:
    """The document ``status --json`` prints (its keys are an interface: docs/cli.md documents them)."""

    batch_id: str
    submitted: int
    succeeded: int
    failed: dict[str, int]
    retrying: int
    in_flight: int
    pending: int
    parked: dict[str, int] = field(default_factory=dict)
    """Of ``retrying``, the requests parked by a guard, by code (``circuit_open``, ``model_paused``)."""
    last_progress_ms: int = 0
    """When a request of the batch last ended, or the batch started when none has: how long it has not moved."""
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per model, (prompt, completion) tokens of the answers that became results (a reused answer spent none),
    and of answers paid for but too large for a result (``response_too_large``)."""
    batched_usage: dict[str, tuple[int, int]] = field(default_factory=dict)
    """The part of ``usage`` answered by provider batches' lines (priced at their discount; the rest by calls)."""
    reused: int = 0
    """Of ``succeeded``, the requests answered from an earlier result without a call (``--reuse-results``)."""
    first_started_ms: int = 0
    """When a worker first took a request of the batch (0: none yet)."""
    tenants: dict[str, int] = field(default_factory=dict)
    """Requests per tenant (core.tenancy): those a worker saw by their state, the pending by the batch's manifest."""
    priorities: dict[str, int] = field(default_factory=dict)
    """Requests per priority, counted as ``tenants``."""

    @property
    def ended(self) -> int:
        return self.succeeded + self.terminal_failures

    @property
    def terminal_failures(self) -> int:
        return sum(self.failed.values())

    @property
    def converged(self) -> bool:
        """Every submitted request ended: a result or a terminal failure."""
        return self.submitted > 0 and self.ended == self.submitted

    def as_json(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "submitted": self.submitted, "succeeded": self.succeeded,
                "failed": dict(self.failed), "retrying": self.retrying, "in_flight": self.in_flight,
                "pending": self.pending, "converged": self.converged, "usage": self.usage_json(),
                "reused": self.reused, "tenants": dict(self.tenants), "priorities": dict(self.priorities),
                "parked": dict(self.parked)}

    def with_pending_as(self, tenant: str, priority: str) -> BatchStatus:
        """The counts with the requests no worker saw yet (``pending``) under this tenant and priority (the
        batch's manifest: ``submit --tenant/--priority``)."""
        if not self.pending:
            return self
        return replace(self, tenants=_plus(self.tenants, tenant, self.pending),
                       priorities=_plus(self.priorities, priority, self.pending))

    def usage_json(self) -> dict[str, Any]:
        """OpenAI's usage keys for the batch's paid answers, in total and per model."""
        prompt = sum(tokens[0] for tokens in self.usage.values())
        completion = sum(tokens[1] for tokens in self.usage.values())
        return {**_usage(prompt, completion),
                "by_model": {model: _usage(*tokens) for model, tokens in sorted(self.usage.items())}}


def _plus(counts: dict[str, int], key: str, more: int) -> dict[str, int]:
    return {**counts, key: counts.get(key, 0) + more}


def shares(counts: dict[str, int]) -> str:
    """Who a batch's requests belong to, in a word: the one name, or each with its count, most first."""
    if len(counts) <= 1:
        return next(iter(counts), "-")
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def parked_text(parked: dict[str, int]) -> str:
    """Requests a guard parked, by why: ``12 tenant_paused, 3 circuit_open``."""
    return ", ".join(f"{count} {code}" for code, count in sorted(parked.items()))


def format_status(status: BatchStatus) -> str:
    """A few aligned lines for people; ``--json`` is the form for scripts."""
    failed = ", ".join(f"{layer} {count}" for layer, count in status.failed.items())
    rows = [
        ("batch", status.batch_id),
        ("submitted", str(status.submitted)),
        ("succeeded", str(status.succeeded) + (f" ({status.reused} reused, no call)" if status.reused else "")),
        ("failed", f"{status.terminal_failures} ({failed})"),
        ("retrying", str(status.retrying) + (f" ({parked_text(status.parked)} parked)" if status.parked else "")),
        ("in flight", str(status.in_flight)),
        ("pending", str(status.pending)),
        ("converged", "yes" if status.converged else "no"),
        ("tenant", shares(status.tenants)),
        ("priority", shares(status.priorities)),
    ]
    if status.usage:
        usage = status.usage_json()
        rows.append(("tokens", f"{usage['total_tokens']:,} ({usage['prompt_tokens']:,} prompt, "
                               f"{usage['completion_tokens']:,} completion)"))
    return "\n".join(f"{name:<10} {value}" for name, value in rows)


def counted_status(batch_id: str, counts: BatchCounts, submitted: int, started_ms: int = 0) -> BatchStatus:
    """The batch's status from its counts: they always add up to ``submitted``, ids not seen by a worker yet being
    pending.

    Ids the state knows beyond ``submitted`` (a manifest not written yet, or a foreign producer) raise
    ``submitted`` rather than break the sum. ``started_ms`` is when the batch was submitted (its manifest), where
    its progress is measured from until a request ended.
    """
    count = counts.by_status
    seen = sum(count.values()) - count[RequestStatus.PENDING.value]
    total = max(submitted, seen)
    return BatchStatus(
        batch_id=batch_id, submitted=total, succeeded=count[RequestStatus.SUCCEEDED.value],
        failed={layer.value: counts.failed[layer.value] for layer in FailureLayer},
        retrying=count[RequestStatus.RETRYING.value], in_flight=count[RequestStatus.IN_FLIGHT.value],
        pending=total - seen, parked={code: n for code, n in counts.parked.items() if n},
        last_progress_ms=max(started_ms or counts.first_created_ms, counts.last_ended_ms),
        usage={model: tokens for model, tokens in counts.usage.items() if tokens != (0, 0)},  # no tokens: nothing
        # to price (a reused answer), and a count that moved out leaves its model at zero
        batched_usage={model: tokens for model, tokens in counts.batched_usage.items() if tokens != (0, 0)},
        reused=counts.reused, first_started_ms=counts.first_created_ms,
        tenants={name: n for name, n in counts.tenants.items() if n},
        priorities={name: n for name, n in counts.priorities.items() if n})


@dataclass
class StatusFold:
    """The latest status per request id of one batch; ``apply`` takes changelog values in log order."""

    batch_id: str
    _latest: dict[str, LatestState] = field(default_factory=dict)

    def apply(self, states: Iterable[RequestState]) -> None:
        for state in states:
            if state.batch_id == self.batch_id:
                self._latest[state.request_id] = LatestState.of(state)

    @property
    def first_created_ms(self) -> int:
        """When a worker first saw a request of the batch (0: none yet): its start when it has no manifest."""
        return min((entry.created_ms for entry in self._latest.values()), default=0)

    def status(self, submitted: int, started_ms: int = 0) -> BatchStatus:
        return counted_status(self.batch_id, BatchCounts.of(self._latest.values()), submitted, started_ms)


@dataclass
class BatchesFold:
    """One :class:`StatusFold` per batch the changelog names, for the list of batches."""

    folds: dict[str, StatusFold] = field(default_factory=dict)

    def apply(self, states: Iterable[RequestState]) -> None:
        for state in states:
            if state.batch_id is not None:
                self.folds.setdefault(state.batch_id, StatusFold(state.batch_id)).apply([state])

    def status(self, batch_id: str, submitted: int, started_ms: int = 0) -> BatchStatus:
        return self.folds.get(batch_id, StatusFold(batch_id)).status(submitted, started_ms)
