"""The records each tenant holds in a worker's hand, against its quota (design §5.11).

The requests agent asks :meth:`TenantHand.may_take` before it hands a record to the dispatcher. A tenant at its
quota has its record wait in memory (the dispatcher's waiting room, no slot: :meth:`TenantHand.wait_to_take`) while
it has fewer waiting than its weighted part of the read-ahead (:meth:`TenantHand.may_wait`), and parked on the
backlog topic past that, so the agent reads on past a flood and a small tenant's records never queue behind a
large one's. The backlog agent's records wait the same way until their tenant is under its quota again. A tenant
at its RPM/TPM quota (``held_back``) takes no new place, and its records in hand do not shrink the others' parts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from streamproc.core.tenancy import DEFAULT_TENANT, TENANT_HEADER, tenant_problem
from streamproc.core.tenant_share import EQUAL_WEIGHTS, TenantWeights, hand_quota
from streamproc.core.tenants_file import NO_TENANTS_FILE, Tenants, parse_tenants

_POLL_S = 0.2  # how often a waiting record looks whether the worker gives its records back (a rebalance, a stop)


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


class TenantHand:
    """Counts each tenant's records in hand; a hand of ``hand`` records is shared by ``weights`` among the tenants
    not ``held_back`` at their RPM/TPM quota."""

    def __init__(self, hand: int, read_ahead: int, weights: TenantWeights = EQUAL_WEIGHTS,
                 held_back: Callable[[str], bool] = lambda _: False) -> None:
        self._hand = hand
        self._read_ahead = read_ahead
        self._weights = weights
        self._held_back = held_back
        self._held: Counter[str] = Counter()
        self._waiting: Counter[str] = Counter()  # backlog records waiting for room, per tenant
        self._changed = asyncio.Event()

    def held(self) -> dict[str, int]:
        return dict(self._held)

    def _has_room(self, tenant: str) -> bool:
        if self._held_back(tenant):
            return False
        sharing = {name: count for name, count in self._held.items() if not self._held_back(name)}
        return self._held[tenant] < hand_quota(tenant, sharing, self._hand, self._weights)

    def may_take(self, tenant: str) -> bool:
        """Take a place for a record read from the requests topic, if its tenant is under its quota and has no
        parked record waiting (those go first, so a tenant's own records are not overtaken for long)."""
        if self._waiting[tenant] or not self._has_room(tenant):
            return False
        self._held[tenant] += 1
        return True

    def may_wait(self, tenant: str) -> bool:
        """Count a record of ``tenant`` at its quota as waiting in memory (True) while fewer of its records wait than
        its weighted part of the read-ahead among the tenants with records waiting; else it is to be parked."""
        if self._waiting[tenant] >= hand_quota(tenant, self._waiting, self._read_ahead, self._weights):
            return False
        self.will_wait(tenant)
        return True

    def will_wait(self, tenant: str) -> None:
        """Count a record of ``tenant`` as waiting (counted when it is read, so the next read sees it), until
        :meth:`wait_to_take` ends or :meth:`stop_waiting`."""
        self._waiting[tenant] += 1

    def stop_waiting(self, tenant: str) -> None:
        self._waiting[tenant] -= 1
        if not self._waiting[tenant]:
            del self._waiting[tenant]

    async def wait_to_take(self, tenant: str, give_up: Callable[[], bool]) -> bool:
        """For a record counted as waiting: wait until ``tenant`` is under its quota and take a place (True), or until
        ``give_up()`` (False)."""
        try:
            while not self._has_room(tenant):
                if give_up():
                    return False
                changed = self._changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), _POLL_S)
            self._held[tenant] += 1
            return True
        finally:
            self.stop_waiting(tenant)

    def give_back(self, tenant: str) -> None:
        """A record of ``tenant`` is done (acked, parked or held): wake the waiters."""
        self._held[tenant] -= 1
        if self._held[tenant] <= 0:
            del self._held[tenant]
        self._changed.set()
        self._changed = asyncio.Event()
