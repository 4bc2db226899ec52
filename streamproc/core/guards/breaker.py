"""A circuit breaker per endpoint/model: stop calling a service that is down, and probe until it is back.

Without it, an outage turns every in-flight and queued request into a failed call and a retry, which piles
onto the service just as it recovers (a retry storm). While the breaker is open, callers send requests to a
retry tier (not before :meth:`CircuitBreaker.retry_at`) or to a fallback model, without calling.

Only failures that say the service is unwell count: transport errors and 5xx. A 4xx or a 429 is an answer
from a working service (429s are the rate limiter's business). Failures are counted over a sliding time
window, so a slow trickle of errors over an hour never opens it, and a few calls never decide alone.

A rate over a window reacts slowly at high throughput: after 10 s at 50 calls/s, an outage must fail ~500
calls before failures are half the window. So a run of ``min_calls`` consecutive failures within the window
opens it too: with 3 % of calls failing at random, 10 in a row happen about once in 10^15 calls; in an
outage, at once.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from enum import StrEnum

WINDOW_BUCKETS = 10  # the window slides in steps of window_s / 10


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Per endpoint/model: opens when transport/5xx failures reach failure_rate over window_s (with at least
    min_calls), or after min_calls of them in a row within window_s; rejects calls while open, lets `probes`
    calls through after open_s (half-open), closes when they succeed and reopens when one fails."""

    def __init__(self, failure_rate: float = 0.5, window_s: float = 10.0, min_calls: int = 10, open_s: float = 5.0,
                 probes: int = 1, on_change: Callable[[BreakerState, BreakerState], None] | None = None) -> None:
        if not 0 < failure_rate <= 1:
            raise ValueError(f"failure_rate must be in (0, 1], got {failure_rate}")
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"window_s must be a finite number > 0, got {window_s}")
        if min_calls < 1:
            raise ValueError(f"min_calls must be >= 1, got {min_calls}")
        if not (open_s > 0 and math.isfinite(open_s)):
            raise ValueError(f"open_s must be a finite number > 0, got {open_s}")
        if probes < 1:
            raise ValueError(f"probes must be >= 1, got {probes}")
        self._failure_rate = failure_rate
        self._window_s = window_s
        self._bucket_s = window_s / WINDOW_BUCKETS
        self._min_calls = min_calls
        self._open_s = open_s
        self._probes = probes
        self._on_change = on_change
        self._state = BreakerState.CLOSED
        self._window: deque[list[int]] = deque()  # [bucket index, calls, failures], oldest first
        self._opened_at = -math.inf
        self._half_open_since = -math.inf
        self._outstanding: deque[float] = deque()  # start times of the probes still out, oldest first
        self._probe_successes = 0
        self._failure_run: deque[float] = deque(maxlen=min_calls)  # times of the latest failures in a row

    @property
    def state(self) -> BreakerState:
        """The state as of the last call; OPEN becomes HALF_OPEN only when :meth:`allow` is asked after open_s."""
        return self._state

    def window(self, now: float) -> tuple[int, int]:
        """(calls, failures) counted in the sliding window (while closed)."""
        self._expire(now)
        return sum(bucket[1] for bucket in self._window), sum(bucket[2] for bucket in self._window)

    def allow(self, now: float) -> bool:
        """May a call be made now? While half-open, True also reserves one of the probe slots."""
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            if now < self._opened_at + self._open_s:
                return False
            self._half_open_since = now
            self._outstanding.clear()
            self._probe_successes = 0
            self._transition(BreakerState.HALF_OPEN)
        self._forget_lost_probes(now)
        if len(self._outstanding) < self._probes:
            self._outstanding.append(now)
            return True
        return False

    def record(self, ok: bool, now: float, started: float | None = None) -> None:
        """The outcome of an allowed call; ``ok=False`` only for transport errors and 5xx.

        ``started`` (when the call was allowed) is optional: with it, the outcome of a call allowed before
        the current half-open period is never taken for a probe's. Outcomes that arrive while open, or
        while half-open with no probe out, belong to calls allowed before the breaker opened: ignored.
        """
        if self._state is BreakerState.CLOSED:
            self._count(ok, now)
            if ok:
                self._failure_run.clear()
            else:
                self._failure_run.append(now)
            calls, failures = self.window(now)
            # 1e-9: 0.3 x 10 is 3.0000000000000004, and 3 failures in 10 calls must open at a 0.3 rate
            if ((calls >= self._min_calls and failures >= self._failure_rate * calls - 1e-9)
                    or (len(self._failure_run) == self._min_calls and self._failure_run[0] > now - self._window_s)):
                self._open(now)
        elif self._state is BreakerState.HALF_OPEN:
            if (started is not None and started < self._half_open_since) or not self._outstanding:
                return
            self._outstanding.popleft()
            if not ok:
                self._open(now)
                return
            self._probe_successes += 1
            if self._probe_successes >= self._probes:
                self._window.clear()
                self._outstanding.clear()
                self._transition(BreakerState.CLOSED)

    def retry_at(self, now: float) -> float:
        """The earliest time a call may be allowed, for a caller that was refused (or wants to plan)."""
        if self._state is BreakerState.CLOSED:
            return now
        if self._state is BreakerState.OPEN:
            return max(now, self._opened_at + self._open_s)
        live = [start for start in self._outstanding if start > now - self._open_s]
        if len(live) < self._probes:
            return now
        return min(live) + self._open_s  # when the oldest probe, if it never reports, is given up

    def _open(self, now: float) -> None:
        self._opened_at = now
        self._failure_run.clear()
        self._window.clear()
        self._outstanding.clear()
        self._transition(BreakerState.OPEN)

    def _transition(self, new: BreakerState) -> None:
        old, self._state = self._state, new
        if self._on_change is not None and old is not new:
            self._on_change(old, new)

    def _forget_lost_probes(self, now: float) -> None:
        """A probe older than open_s will never report (its task died or its outcome was lost): free its slot."""
        while self._outstanding and self._outstanding[0] <= now - self._open_s:
            self._outstanding.popleft()

    def _count(self, ok: bool, now: float) -> None:
        index = math.floor(now / self._bucket_s)
        self._expire(now)
        if not self._window or self._window[-1][0] < index:
            self._window.append([index, 0, 0])
        bucket = self._window[-1]  # an outcome with a stale clock lands in the newest bucket
        bucket[1] += 1
        if not ok:
            bucket[2] += 1

    def _expire(self, now: float) -> None:
        oldest = math.floor(now / self._bucket_s) - WINDOW_BUCKETS + 1
        while self._window and self._window[0][0] < oldest:
            self._window.popleft()
