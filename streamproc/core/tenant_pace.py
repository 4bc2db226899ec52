"""Per-tenant RPM/TPM quotas (the tenants file, design §5.11): whether a tenant's next call may start now.

Each tenant with an ``rpm`` or ``tpm`` quota has a token bucket per kind, refilled at its quota times the worker's
part of it (``share()``: 1 ÷ the fleet's live workers, since a tenant's records spread over every partition by
request id; a fixed share without a fleet), holding one second of it (at least one call, one token). A call may
start when its tenant's buckets hold one call and its token estimate (a second's worth at most, so a call larger
than that still starts, and its debt is repaid before the next); starting takes them, into debt for a large
one. A tenant at its quota only waits: its calls do not start and its records stay out of the hand, so the
others' calls go on. Standard library only, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from streamproc.core.guards.bucket import TokenBucket
from streamproc.core.tenants_file import TenantQuota

_BURST_S: Final = 1.0  # a bucket holds this many seconds of its rate


class TenantPace:
    """The per-tenant RPM/TPM buckets of one worker."""

    def __init__(self, quotas: Mapping[str, TenantQuota], share: Callable[[], float] = lambda: 1.0) -> None:
        self._quotas = {tenant: quota for tenant, quota in quotas.items() if quota.rpm or quota.tpm}
        self._share = share
        self._applied_share = 0.0
        self._calls: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}

    def __bool__(self) -> bool:
        return bool(self._quotas)

    def wait_s(self, tenant: str, tokens: int, now: float) -> float:
        """Seconds until a call of ``tenant`` costing ``tokens`` may start (0: now)."""
        if tenant not in self._quotas:
            return 0.0
        self._follow_share(now)
        return max(_short_of(self._calls.get(tenant), 1.0, now), _short_of(self._tokens.get(tenant), tokens, now))

    def holds_back(self, tenant: str, now: float) -> bool:
        """Whether ``tenant`` is at its quota now (not even a call of no tokens may start)."""
        return self.wait_s(tenant, 0, now) > 0

    def start(self, tenant: str, tokens: int, now: float) -> None:
        """A call of ``tenant`` costing ``tokens`` starts: take it from its buckets."""
        if tenant not in self._quotas:
            return
        self._follow_share(now)
        for bucket, cost in ((self._calls.get(tenant), 1.0), (self._tokens.get(tenant), float(tokens))):
            if bucket is not None:
                bucket.reserve(cost, now)

    def _follow_share(self, now: float) -> None:
        share = self._share()
        if share == self._applied_share:
            return
        self._applied_share = share
        for tenant, quota in self._quotas.items():
            for buckets, per_minute in ((self._calls, quota.rpm), (self._tokens, quota.tpm)):
                if per_minute:
                    rate = per_minute * share / 60
                    capacity = max(1.0, rate * _BURST_S)
                    if tenant in buckets:
                        buckets[tenant].set_rate(rate, capacity, now)
                    else:
                        buckets[tenant] = TokenBucket(rate, capacity, now)


def _short_of(bucket: TokenBucket | None, cost: float, now: float) -> float:
    """Seconds until ``bucket`` holds ``cost`` (at most its capacity)."""
    if bucket is None:
        return 0.0
    missing = min(cost, bucket.capacity) - bucket.level(now)
    return missing / bucket.rate_per_s if missing > 1e-9 else 0.0
