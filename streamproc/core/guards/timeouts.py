"""A timeout per model from its observed latency, so a hung call costs seconds instead of the ceiling.

``timeout = clamp(multiplier x p99 of the last successful calls x budget ratio, floor, ceiling)``; the ceiling
(``STREAMPROC_LLM_TIMEOUT_S``) until a model has answered ``min_samples`` times. Only successes are samples:
a timeout says nothing about how long the answer would have taken. A slow-but-healthy model (long outputs)
raises its own p99 and keeps its time; a model that usually answers in 2 s is cut after ~10 s when a call
hangs. A call allowed more completion tokens than the model's usual calls (a retry after a truncated answer
gets twice the room) may take that much longer: the budget ratio is its ``max_tokens`` over the median of
the successful calls'. With the gradient limiter keeping the client's own queue short, the latencies seen
are the server's.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from functools import partial

from streamproc.core.guards.bounded import MAX_MODELS, LruDict


class SlidingWindow:
    """The last ``size`` values, also kept sorted: a quantile is an index, not a sort per call (a sort of 200
    floats per LLM call was the worker's largest cost in its own code after input hashing)."""

    def __init__(self, size: int) -> None:
        self._arrival: deque[float] = deque()
        self._sorted: list[float] = []
        self._size = size

    def __len__(self) -> int:
        return len(self._arrival)

    def add(self, value: float) -> None:
        if len(self._arrival) == self._size:
            oldest = self._arrival.popleft()
            del self._sorted[bisect_left(self._sorted, oldest)]
        self._arrival.append(value)
        insort(self._sorted, value)

    def quantile(self, q: float) -> float:
        """The smallest value with at least ``q`` of the window at or below it (nearest rank); not empty."""
        return self._sorted[min(len(self._sorted) - 1, max(0, math.ceil(q * len(self._sorted)) - 1))]

    def median(self) -> float:
        """The upper median (the value at index n // 2 of the sorted window); not empty."""
        return self._sorted[len(self._sorted) // 2]


class AdaptiveTimeout:
    """Per-model read timeouts in seconds; feed successes with :meth:`observe`, ask :meth:`timeout_s`."""

    def __init__(self, ceiling_s: float, *, floor_s: float = 5.0, multiplier: float = 3.0, quantile: float = 0.99,
                 window: int = 200, min_samples: int = 20) -> None:
        if not ceiling_s > 0:
            raise ValueError(f"ceiling_s must be > 0, got {ceiling_s}")
        if not (multiplier >= 1 and 0 < quantile <= 1 and window >= 1 and 1 <= min_samples <= window):
            raise ValueError("need multiplier >= 1, 0 < quantile <= 1 and 1 <= min_samples <= window")
        self._ceiling = ceiling_s
        self._floor = min(floor_s, ceiling_s)
        self._multiplier = multiplier
        self._quantile = quantile
        self._min_samples = min_samples
        new_window = partial(SlidingWindow, window)  # per model, on its first observation (.get() creates none)
        # the least recently called models' windows go past MAX_MODELS (their timeout is the ceiling again)
        self._latencies: LruDict[str, SlidingWindow] = LruDict(MAX_MODELS, new_window)
        self._budgets: LruDict[str, SlidingWindow] = LruDict(MAX_MODELS, new_window)  # max_tokens, where set

    def observe(self, model: str, latency_s: float, max_tokens: int | None = None) -> None:
        if latency_s >= 0 and math.isfinite(latency_s):
            self._latencies[model].add(latency_s)
            if max_tokens is not None and max_tokens > 0:
                self._budgets[model].add(max_tokens)

    def timeout_s(self, model: str, max_tokens: int | None = None) -> float:
        tail = self.tail_s(model, max_tokens)
        if tail is None:
            return self._ceiling
        return min(self._ceiling, max(self._floor, self._multiplier * tail))

    def tail_s(self, model: str, max_tokens: int | None = None) -> float | None:
        """The ``quantile`` of the model's recent successes, scaled by the call's completion budget; None until
        ``min_samples`` are known (a call slower than this is in the tail: see hedging)."""
        samples = self._latencies.get(model)
        if samples is None or len(samples) < self._min_samples:
            return None
        return samples.quantile(self._quantile) * self._budget_ratio(model, max_tokens)

    def _budget_ratio(self, model: str, max_tokens: int | None) -> float:
        budgets = self._budgets.get(model)
        if max_tokens is None or not budgets:
            return 1.0
        return max(1.0, max_tokens / budgets.median())
