"""How a worker shares its capacity among tenants (issue 28 item 2): pure rules, no I/O.

Two places share: the records a worker holds in hand (the dispatcher's ``in_flight`` + 1/4) and the gate's slots.
A tenant's *quota* of the hand is its weighted part among the tenants that hold records now, so a tenant alone
gets all of it (work-conserving) and a record of a tenant over its quota is parked instead of waited for (design
§5.11). Within a tenant the hand is counted per *lane* (tenant, priority): a record counts against the quota only
the records of its own priority and the more urgent ones (:func:`lane_has_room`), so a ``high`` record is not
parked behind its own tenant's ``low`` flood, while a ``low`` one yields to the ``high`` ones in hand.
Among the calls that may start, :class:`FairChoice` picks by priority first, a lower one aged past a bound
counting as the highest, then by weighted fair queuing per tenant (virtual start tags).

Weights come from ``STREAMPROC_TENANTS_FILE`` (:mod:`streamproc.core.tenants_file`); a tenant not named weighs
:data:`DEFAULT_WEIGHT`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from streamproc.core.tenancy import PRIORITIES

DEFAULT_WEIGHT: Final = 1.0


@dataclass(frozen=True)
class TenantWeights:
    """Each named tenant's weight; every other tenant weighs :data:`DEFAULT_WEIGHT`."""

    named: Mapping[str, float] = field(default_factory=dict)

    def of(self, tenant: str) -> float:
        return self.named.get(tenant, DEFAULT_WEIGHT)


EQUAL_WEIGHTS: Final = TenantWeights()


def hand_quota(tenant: str, in_hand: Mapping[str, int], hand: int, weights: TenantWeights,
               lingering: Iterable[str] = ()) -> int:
    """The records ``tenant`` may hold of a hand of ``hand``: its weighted part among the tenants holding records
    (``in_hand``), those ``lingering`` (holding none for a moment) and itself, at least one. Alone, the whole
    hand."""
    active = {name for name, count in in_hand.items() if count > 0} | {tenant, *lingering}
    total = sum(weights.of(name) for name in active)
    return max(1, int(hand * weights.of(tenant) / total))


Lane = tuple[str, str]
"""A tenant and a priority: the unit the hand counts records in."""


def lane_has_room(lane: Lane, counts: Mapping[Lane, int], budget: int, weights: TenantWeights,
                  lingering: Iterable[str] = ()) -> bool:
    """Whether ``lane`` may count one more record of a ``budget`` shared by tenants (``hand_quota`` over the
    tenants' totals in ``counts`` and those ``lingering``): its tenant's records of its priority or a more urgent one
    are under the tenant's quota. Records of less urgent priorities do not count, so they never hold a more urgent
    one back (they drain as their calls end; the gate starts the urgent calls first); alone, a lane gets the whole
    budget."""
    tenant, priority = lane
    per_tenant: dict[str, int] = {}
    for (name, _), count in counts.items():
        per_tenant[name] = per_tenant.get(name, 0) + count
    rank = _priority_rank(priority)
    as_urgent = sum(count for (name, other), count in counts.items()
                    if name == tenant and _priority_rank(other) <= rank)
    return as_urgent < hand_quota(tenant, per_tenant, budget, weights, lingering)


def outranked(lane: Lane, waiting: Mapping[Lane, int]) -> bool:
    """Whether a more urgent lane of the same tenant has records ``waiting`` for room: ``lane`` then yields to it."""
    tenant, priority = lane
    rank = _priority_rank(priority)
    return any(count > 0 and name == tenant and _priority_rank(other) < rank
               for (name, other), count in waiting.items())


def reading_yields(priority: str, present: Iterable[str], slots_full: bool) -> bool:
    """Whether the agent of ``priority``'s requests topic holds off reading its next record: while every slot of the
    dispatcher is taken and a record of a more urgent priority (``present``: the priorities of the records in hand
    or waiting) is there. Reading on would only add records that wait, and reserving or parking them takes the
    CPU the urgent records' handling needs; with a slot free it reads (work-conserving)."""
    rank = _priority_rank(priority)
    return slots_full and any(_priority_rank(other) < rank for other in present)


@dataclass
class BoundedYield:
    """Lets more urgent records go first for ``limit_s`` at most, counted from the first time it did: a record or
    call that yields must still be served if the urgent ones never come."""

    limit_s: float
    since: float | None = None  # when it first yielded (seconds, any monotonic clock)

    def still(self, now: float) -> bool:
        """Yield now (True) unless ``limit_s`` passed since the first yield; a call counts as a yield."""
        if self.since is None:
            self.since = now
        return now - self.since < self.limit_s


def more_urgent(priority: str) -> tuple[str, ...]:
    """The priorities more urgent than ``priority``, most urgent first."""
    rank = _priority_rank(priority)
    return tuple(other for other in PRIORITIES if _priority_rank(other) < rank)


@dataclass(frozen=True)
class Contender:
    """A call that may start: whose it is, how urgent, and since when it waits (seconds, any monotonic clock)."""

    tenant: str
    priority: str
    since: float


class FairChoice:
    """Picks the next call to start among those that may (weighted fair queuing per tenant, priorities first).

    Each tenant's next call has the virtual start tag ``max(now_v, its last finish)``; starting it moves the
    tenant's finish on by ``1 / weight``. Two busy tenants of weights 2 and 1 thus start 2:1, and a tenant that
    was idle starts at ``now_v`` (no credit saved up while idle). A lower priority that waited ``ageing_s`` or
    more counts as the highest, so it cannot starve.
    """

    def __init__(self, weights: TenantWeights = EQUAL_WEIGHTS, ageing_s: float = 30.0) -> None:
        self._weights = weights
        self._ageing_s = ageing_s
        self._virtual_now = 0.0
        self._finish: dict[str, float] = {}  # only tenants whose finish is ahead of now_v

    def pick(self, contenders: Sequence[Contender], now: float) -> int:
        """The index of the contender to start (the first of equals), and the start counted; ``contenders`` must
        not be empty."""
        def rank(i: int) -> tuple[int, float, int]:
            contender = contenders[i]
            urgency = 0 if now - contender.since >= self._ageing_s else _priority_rank(contender.priority)
            return urgency, self._start_tag(contender.tenant), i

        index = min(range(len(contenders)), key=rank)
        chosen = contenders[index].tenant
        start = self._start_tag(chosen)
        self._virtual_now = start
        self._finish[chosen] = start + 1 / self._weights.of(chosen)
        self._finish = {name: tag for name, tag in self._finish.items() if tag > self._virtual_now}
        return index

    def _start_tag(self, tenant: str) -> float:
        return max(self._virtual_now, self._finish.get(tenant, self._virtual_now))


def _priority_rank(priority: str) -> int:
    return PRIORITIES.index(priority) if priority in PRIORITIES else PRIORITIES.index("normal")
