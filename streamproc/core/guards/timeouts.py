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
from collections import deque


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
        self._window = window
        self._min_samples = min_samples
        self._latencies: dict[str, deque[float]] = {}
        self._budgets: dict[str, deque[int]] = {}  # max_tokens of the successful calls, where they set one

    def observe(self, model: str, latency_s: float, max_tokens: int | None = None) -> None:
        if latency_s >= 0 and math.isfinite(latency_s):
            self._latencies.setdefault(model, deque(maxlen=self._window)).append(latency_s)
            if max_tokens is not None and max_tokens > 0:
                self._budgets.setdefault(model, deque(maxlen=self._window)).append(max_tokens)

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
        ordered = sorted(samples)
        high = ordered[min(len(ordered) - 1, math.ceil(self._quantile * len(ordered)) - 1)]
        return high * self._budget_ratio(model, max_tokens)

    def _budget_ratio(self, model: str, max_tokens: int | None) -> float:
        budgets = self._budgets.get(model)
        if max_tokens is None or not budgets:
            return 1.0
        usual = sorted(budgets)[len(budgets) // 2]
        return max(1.0, max_tokens / usual)
