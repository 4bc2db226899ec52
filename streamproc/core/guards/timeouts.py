"""A timeout per model from its observed latency, so a hung call costs seconds instead of the ceiling.

``timeout = clamp(multiplier x p99 of the last successful calls, floor, ceiling)``; the ceiling
(``STREAMPROC_LLM_TIMEOUT_S``) until a model has answered ``min_samples`` times. Only successes are samples:
a timeout says nothing about how long the answer would have taken. A slow-but-healthy model (long outputs)
raises its own p99 and keeps its time; a model that usually answers in 2 s is cut after ~10 s when a call
hangs. With the gradient limiter keeping the client's own queue short, the latencies seen are the server's.
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

    def observe(self, model: str, latency_s: float) -> None:
        if latency_s >= 0 and math.isfinite(latency_s):
            self._latencies.setdefault(model, deque(maxlen=self._window)).append(latency_s)

    def timeout_s(self, model: str) -> float:
        samples = self._latencies.get(model)
        if samples is None or len(samples) < self._min_samples:
            return self._ceiling
        ordered = sorted(samples)
        high = ordered[min(len(ordered) - 1, math.ceil(self._quantile * len(ordered)) - 1)]
        return min(self._ceiling, max(self._floor, self._multiplier * high))

    def timeouts(self) -> dict[str, float]:
        """Every model's current timeout (for metrics)."""
        return {model: self.timeout_s(model) for model in self._latencies}
