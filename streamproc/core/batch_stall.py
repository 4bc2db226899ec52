"""Why a batch stopped moving: never a silent wait (design §6).

A batch *stalls* when no request of it ended for ``stall_after`` although some have not: ``status`` then
says how many wait and for what, and ``run`` prints it instead of waiting quietly for its timeout. The
reasons come from the request states (a guard's parking code) and from the workers' consumer group (its
members, and the lag of its input topics):

* ``no_worker``: the group has no member, so nothing reads the batch's requests at all;
* ``circuit_open`` / ``model_paused``: parked by an open circuit breaker or a paused model;
* ``tenant_paused``: parked because the batch's tenant is paused on the model (its calls failed alike while
  other tenants' were answered; core.guards.tenant_pauses);
* ``budget_exhausted``: parked at the batch's or the day's spend cap (core.spend_cap);
* ``duplicate``: read by a worker (nothing left to read) but never recorded under this batch: skipped as a
  duplicate, because another batch's request holds the id (ids produced without batch scope, core.identity);
* ``queued``: not read yet, behind the records waiting on the input topics;
* ``retry_wait``: waiting in a retry tier for its next attempt;
* ``in_flight``: a call started and has not ended.

Time, the group and the lag come in as arguments: nothing here reads the broker or a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from streamproc.core.batch_status import BatchStatus
from streamproc.core.durations import format_duration

NO_WORKER: Final = "no_worker"
CIRCUIT_OPEN: Final = "circuit_open"
MODEL_PAUSED: Final = "model_paused"
TENANT_PAUSED: Final = "tenant_paused"
BUDGET_EXHAUSTED: Final = "budget_exhausted"
REBALANCING: Final = "rebalancing"
DUPLICATE: Final = "duplicate"
QUEUED: Final = "queued"
RETRY_WAIT: Final = "retry_wait"
IN_FLIGHT: Final = "in_flight"


@dataclass(frozen=True)
class GroupView:
    """The workers' consumer group as the broker sees it; None where it could not be read."""

    group: str
    members: int | None
    lag: int | None  # records not consumed yet on the input topics (requests and retry tiers)


@dataclass(frozen=True)
class BatchStall:
    """How long the batch has not moved, and how many of its requests wait for what."""

    batch_id: str
    since_ms: int
    idle_s: float
    reasons: dict[str, int]
    group: GroupView | None

    @property
    def waiting(self) -> int:
        return sum(self.reasons.values())

    def as_json(self) -> dict[str, Any]:
        group = self.group
        return {"since_ms": self.since_ms, "idle_s": round(self.idle_s, 1), "waiting": self.waiting,
                "reasons": dict(self.reasons), "group": None if group is None else group.group,
                "group_members": None if group is None else group.members,
                "input_lag": None if group is None else group.lag}

    def describe(self) -> str:
        """One line for people: how long, how many, and why."""
        reasons = "; ".join(f"{count} {self._explain(reason)}" for reason, count in self.reasons.items())
        return (f"batch {self.batch_id}: no request ended for {format_duration(self.idle_s)}; "
                f"{self.waiting} waiting: {reasons}")

    def _explain(self, reason: str) -> str:
        group = self.group
        name = "?" if group is None else repr(group.group)
        lag = "?" if group is None or group.lag is None else f"{group.lag:,}"
        return {
            NO_WORKER: f"with no worker consuming (the consumer group {name} has no member: start `streamproc worker`)",
            CIRCUIT_OPEN: "waiting on an open circuit breaker (the LLM endpoint fails; see the worker log)",
            MODEL_PAUSED: "waiting on a paused model (its first calls all failed alike; see the worker log)",
            TENANT_PAUSED: "waiting while their tenant is paused on the model (its calls failed alike while other "
                           "tenants' were answered; one probe call checks each interval; see the worker log)",
            BUDGET_EXHAUSTED: "waiting at the spend cap of the batch or of the day (`streamproc raise-cap` lets them "
                              "go on; `cancel` ends them budget_exceeded)",
            REBALANCING: "parked while the workers' group rebalanced (they are read again once it ends; a rebalance "
                         "that does not end shows in the worker log)",
            DUPLICATE: "skipped as duplicates (read by a worker, but their request ids belong to another batch's "
                       "requests)",
            QUEUED: f"queued, not read yet ({lag} records wait on the input topics of {name})",
            RETRY_WAIT: "waiting in a retry tier for their next attempt",
            IN_FLIGHT: "in flight (a call started and has not ended)",
        }.get(reason, reason)


def needs_group(status: BatchStatus, now_ms: int, stall_after_ms: int) -> bool:
    """Whether the batch has not moved for long enough to be diagnosed (so the group is worth reading)."""
    return not status.converged and status.submitted > 0 and now_ms - status.last_progress_ms >= stall_after_ms


def diagnose(status: BatchStatus, now_ms: int, stall_after_ms: int, group: GroupView | None) -> BatchStall | None:
    """The stall of a batch that has not moved for ``stall_after_ms``, or None while it moves (or ended)."""
    if not needs_group(status, now_ms, stall_after_ms):
        return None
    if group is not None and group.members == 0:
        reasons = {NO_WORKER: status.submitted - status.ended}
    else:
        parked = sum(status.parked.values())
        consumed_all = group is not None and group.lag == 0
        reasons = {
            **status.parked,
            DUPLICATE if consumed_all else QUEUED: status.pending,
            RETRY_WAIT: status.retrying - parked,
            IN_FLIGHT: status.in_flight,
        }
    return BatchStall(status.batch_id, status.last_progress_ms, (now_ms - status.last_progress_ms) / 1000,
                      {reason: count for reason, count in reasons.items() if count > 0}, group)
