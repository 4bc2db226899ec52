"""The records each tenant holds in a worker's hand, against its quota, counted per lane (tenant, priority; design
§5.11).

The requests agent asks :meth:`TenantHand.may_take` before it hands a record to the dispatcher. A tenant at its
quota has its record wait in memory (the dispatcher's waiting room, no slot: :meth:`TenantHand.wait_to_take`) while
it has fewer waiting than its weighted part of the read-ahead (:meth:`TenantHand.may_wait`), and parked on the
backlog topic past that, so the agent reads on past a flood and a small tenant's records never queue behind a
large one's. The backlog agent's records wait the same way until their lane has room again. A lane's records count
against its tenant's quota with the same tenant's more urgent ones only (``lane_has_room``), so a tenant's ``high``
records reach past its own ``low`` flood. A tenant at its RPM/TPM quota (``held_back``) takes no new place, and its
records in hand do not shrink the others' parts. A record waiting in memory also lets more urgent records still on
their way to the agents (``arriving``) take a freed place first, for :data:`ARRIVING_YIELD_S` at most.

Long records (``long_requests``: by their size header) hold at most the pool's share of the hand while short records
are about, as their calls do of the gate's slots; past it they wait or are parked like a tenant over its quota, so
records waiting at the gate for the long share never fill the hand and the short records behind them are read on
(the pool caps the long calls, not everyone's pace). With no short record about, long ones take the whole hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from streamproc.core.guards.long_requests import NO_POOL, LongRequests
from streamproc.core.tenancy import (
    DEFAULT_PRIORITY,
    DEFAULT_TENANT,
    PRIORITY_HEADER,
    TENANT_HEADER,
    priority_problem,
    tenant_problem,
)
from streamproc.core.tenant_share import EQUAL_WEIGHTS, BoundedYield, Lane, TenantWeights, lane_has_room, outranked
from streamproc.core.tenants_file import NO_TENANTS_FILE, Tenants, parse_tenants

_POLL_S = 0.2  # how often a waiting record looks whether the worker gives its records back (a rebalance, a stop)
ARRIVING_YIELD_S = 5.0  # at most this long a waiting record lets more urgent records on their way go first
_LINGERING_KEPT = 64
LINGER_S = 0.5  # a tenant that gave its last record back keeps its share this long: its agent's next record is
# on its way (an agent hands one record at a time to the dispatcher), and another tenant's waiting records would
# otherwise take every place the moment its calls end


def load_tenants(path: Path | None) -> Tenants:
    """``STREAMPROC_TENANTS_FILE``'s weights and quotas (none: all equal, no quota); a bad file raises ValueError
    naming it."""
    if path is None:
        return NO_TENANTS_FILE
    try:
        return parse_tenants(path.read_text(encoding="utf-8"), toml=path.suffix == ".toml")
    except (OSError, ValueError) as exc:
        raise ValueError(f"STREAMPROC_TENANTS_FILE {path}: {exc}") from None


def scheduled_tenant(record_headers: Mapping[str, bytes]) -> str:
    """The tenant a record is scheduled as, from its ``x-tenant`` header alone (no decoding in the agent's loop;
    ``submit`` sets it): a record without a valid one counts as the default tenant's. The handler still checks the
    tenancy the request itself names."""
    raw = record_headers.get(TENANT_HEADER)
    if raw is None:
        return DEFAULT_TENANT
    tenant = raw.decode("utf-8", errors="replace")
    return DEFAULT_TENANT if tenant_problem(tenant) is not None else tenant


def scheduled_lane(record_headers: Mapping[str, bytes]) -> Lane:
    """The lane a record is scheduled in: its tenant (:func:`scheduled_tenant`) and its ``x-priority`` header, a
    missing or invalid one counting as the default priority."""
    raw = record_headers.get(PRIORITY_HEADER)
    priority = DEFAULT_PRIORITY if raw is None else raw.decode("utf-8", errors="replace")
    return scheduled_tenant(record_headers), DEFAULT_PRIORITY if priority_problem(priority) is not None else priority


class TenantHand:
    """Counts each lane's records in hand; a hand of ``hand`` records is shared by ``weights`` among the tenants
    not ``held_back`` at their RPM/TPM quota, and within a tenant by priority (``lane_has_room``). ``arriving(p)``:
    whether records more urgent than priority ``p`` have not yet reached the agents. Every method taking ``long``
    counts a long record apart too (:data:`long_requests`)."""

    def __init__(self, hand: int, read_ahead: int, weights: TenantWeights = EQUAL_WEIGHTS,
                 held_back: Callable[[str], bool] = lambda _: False,
                 arriving: Callable[[str], bool] = lambda _: False, long_requests: LongRequests = NO_POOL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._hand = hand
        self._read_ahead = read_ahead
        self._weights = weights
        self._held_back = held_back
        self._arriving = arriving
        self.long_requests = long_requests
        self._clock = clock
        self._held: Counter[Lane] = Counter()
        self._waiting: Counter[Lane] = Counter()  # records waiting for room in memory, per lane
        self._long_held = 0  # of ``_held``, the long records
        self._long_waiting: Counter[Lane] = Counter()  # of ``_waiting``, the long records
        self._short_seen_at: float | None = None  # when a short record was last given back
        self._given_back_at: dict[str, float] = {}  # tenant -> when it last gave a record back
        self._changed = asyncio.Event()

    def held(self) -> dict[str, int]:
        """Each tenant's records in hand, all its priorities together."""
        totals: Counter[str] = Counter()
        for (tenant, _), count in self._held.items():
            totals[tenant] += count
        return dict(totals)

    def priorities_present(self) -> set[str]:
        """The priorities of the records in hand or waiting in memory, any tenant's."""
        return {priority for (_, priority), count in (*self._held.items(), *self._waiting.items()) if count > 0}

    def priorities_waiting(self) -> set[str]:
        """The priorities of the records waiting in memory for room, any tenant's."""
        return {priority for (_, priority), count in self._waiting.items() if count > 0}

    async def changed(self, timeout_s: float = _POLL_S) -> None:
        """Return once a record was given back, or after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    def _shorts_about(self) -> bool:
        """Whether short records are in hand or waiting, or one was given back within the pool's quiet time."""
        if sum(self._held.values()) > self._long_held or sum(self._waiting.values()) > sum(self._long_waiting.values()):
            return True
        return self._short_seen_at is not None and self._clock() - self._short_seen_at < self.long_requests.quiet_s

    def _long_has_room(self) -> bool:
        return self._long_held < self.long_requests.cap(self._hand) or not self._shorts_about()

    def _has_room(self, lane: Lane, long: bool) -> bool:
        if self._held_back(lane[0]):
            return False
        long_room = self._long_has_room()
        if long and not long_room:
            return False
        # long records held back by the pool hold no more urgent lane's turn: they wait for the long share only
        waiting = self._waiting if long_room else self._waiting - self._long_waiting
        if outranked(lane, waiting):
            return False
        sharing = {other: count for other, count in self._held.items() if not self._held_back(other[0])}
        return lane_has_room(lane, sharing, self._hand, self._weights, self._lingering())

    def _lingering(self) -> list[str]:
        """The tenants that gave a record back within :data:`LINGER_S` (and are not held back)."""
        now = self._clock()
        return [tenant for tenant, at in self._given_back_at.items()
                if now - at < LINGER_S and not self._held_back(tenant)]

    def _waiting_of(self, lane: Lane, long: bool) -> int:
        return self._long_waiting[lane] if long else self._waiting[lane] - self._long_waiting[lane]

    def may_take(self, lane: Lane, long: bool = False) -> bool:
        """Take a place for a record read from the requests topic, if its lane has room and no record of the lane
        and size class waits (those go first, so a lane's own records are not overtaken for long)."""
        if self._waiting_of(lane, long) or not self._has_room(lane, long):
            return False
        self._take(lane, long)
        return True

    def _take(self, lane: Lane, long: bool) -> None:
        self._held[lane] += 1
        if long:
            self._long_held += 1

    def may_wait(self, lane: Lane, long: bool = False) -> bool:
        """Count a record of ``lane`` without room as waiting in memory (True) while the lane has room in the
        read-ahead (shared like the hand: by tenant, then by priority); else it is to be parked."""
        if self.read_ahead_full(lane):
            return False
        self.will_wait(lane, long)
        return True

    def read_ahead_full(self, lane: Lane) -> bool:
        """Whether a record of ``lane`` without room would be parked (its part of the read-ahead is full)."""
        return not lane_has_room(lane, self._waiting, self._read_ahead, self._weights)

    def will_wait(self, lane: Lane, long: bool = False) -> None:
        """Count a record of ``lane`` as waiting (counted when it is read, so the next read sees it), until
        :meth:`wait_to_take` ends or :meth:`stop_waiting`."""
        self._waiting[lane] += 1
        if long:
            self._long_waiting[lane] += 1

    def stop_waiting(self, lane: Lane, long: bool = False) -> None:
        for counts in (self._waiting, self._long_waiting) if long else (self._waiting,):
            counts[lane] -= 1
            if not counts[lane]:
                del counts[lane]

    async def wait_to_take(self, lane: Lane, give_up: Callable[[], bool], long: bool = False) -> bool:
        """For a record counted as waiting: wait until ``lane`` has room and take a place (True), or until
        ``give_up()`` (False). Room found is left to more urgent records on their way for :data:`ARRIVING_YIELD_S`."""
        leaving = BoundedYield(ARRIVING_YIELD_S)  # room found but left to the records arriving
        try:
            while True:
                if self._has_room(lane, long) and not (self._arriving(lane[1]) and leaving.still(time.monotonic())):
                    break
                if give_up():
                    return False
                changed = self._changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), _POLL_S)
            self._take(lane, long)
            return True
        finally:
            self.stop_waiting(lane, long)

    def give_back(self, lane: Lane, long: bool = False) -> None:
        """A record of ``lane`` is done (acked, parked or held): wake the waiters."""
        self._held[lane] -= 1
        if self._held[lane] <= 0:
            del self._held[lane]
        now = self._clock()
        if len(self._given_back_at) > _LINGERING_KEPT:  # tenants long gone: forgotten
            self._given_back_at = {tenant: at for tenant, at in self._given_back_at.items() if now - at < LINGER_S}
        self._given_back_at[lane[0]] = now
        if long:
            self._long_held -= 1
        else:
            self._short_seen_at = self._clock()
        self._changed.set()
        self._changed = asyncio.Event()
