"""A reservation token bucket: a caller reserves its cost up front and is told how long to wait.

Unlike a try-and-retry bucket, reserving lets the level go negative (debt). A caller that finds the bucket
empty still reserves, so callers are served in the order they reserved (FIFO, no starvation of big costs by
small ones), and a cost larger than the capacity is admitted, paid for at the long-run rate. One reservation
costs at most a minute of that rate: a request asking for a billion completion tokens would otherwise put
the bucket hours into debt and stall every later call of its model (a provider refuses a call larger than
its per-minute limit anyway; found by the handler's property tests).
"""

from __future__ import annotations

import math

_EPSILON = 1e-9  # waits below a nanosecond are float noise, not a reason to sleep
LONGEST_DEBT_S = 60.0  # one reservation costs at most this many seconds of the rate


class TokenBucket:
    """Reservation token bucket: callers reserve a cost and are told how long to wait; debt allowed, so FIFO
    and big costs work."""

    def __init__(self, rate_per_s: float, capacity: float, now: float) -> None:
        _check(rate_per_s, capacity)
        self._rate = rate_per_s
        self._capacity = capacity
        self._level = capacity  # starts full: a fresh worker may send a small burst at once
        self._stamp = now

    @property
    def rate_per_s(self) -> float:
        return self._rate

    @property
    def capacity(self) -> float:
        return self._capacity

    def set_rate(self, rate_per_s: float, capacity: float, now: float) -> None:
        """Change the rate from ``now`` on: time so far refills at the old rate; debt is kept, surplus clamped."""
        _check(rate_per_s, capacity)
        self._refill(now)
        self._rate = rate_per_s
        self._capacity = capacity
        self._level = min(self._level, capacity)

    def reserve(self, cost: float, now: float) -> float:
        """Take ``cost`` now (possibly into debt); the caller must wait the returned seconds before sending."""
        if cost < 0 or not math.isfinite(cost):
            raise ValueError(f"cost must be a finite number >= 0, got {cost}")
        self._refill(now)
        self._level -= min(cost, self._rate * LONGEST_DEBT_S)
        return self._wait()

    def pause_until(self, until: float, now: float) -> None:
        """Admit nothing before ``until``: the level drops to the debt that takes until then to repay."""
        self._refill(now)
        if until > now:
            self._level = min(self._level, -(until - now) * self._rate)

    def level(self, now: float) -> float:
        self._refill(now)
        return self._level

    def _wait(self) -> float:
        wait = -self._level / self._rate
        return wait if wait > _EPSILON else 0.0

    def _refill(self, now: float) -> None:
        # A caller with a slightly stale clock must not move time backwards (and so never refills twice).
        if now > self._stamp:
            self._level = min(self._capacity, self._level + (now - self._stamp) * self._rate)
            self._stamp = now


def _check(rate_per_s: float, capacity: float) -> None:
    if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
        raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s}")
    if not (capacity > 0 and math.isfinite(capacity)):
        raise ValueError(f"capacity must be a finite number > 0, got {capacity}")
