"""An in-flight limit that finds the provider's capacity: additive increase, multiplicative decrease.

The static limits (requests/min, tokens/min) say nothing about how many calls a provider serves at once
before it queues them. AIMD (as TCP congestion control) probes for that: one more slot per round trip
while calls succeed, a cut by ``backoff`` when the provider pushes back (a 429) or latency says a queue is
building. A cooldown makes a burst of 429s from one overload count once, not once per call.

Latency is judged against a baseline, the lowest short-term average seen. The baseline drifts up slowly
towards the current average, so a lasting change (a slower model version, longer prompts) becomes the new
normal instead of cutting the limit forever. A rise must also exceed ``latency_min_rise_s`` in absolute
terms: at a few milliseconds (a local model, a mock), or when the worker's own event loop is saturated
(hundreds of ms), doubling is scheduler noise, not a provider queue.
"""

from __future__ import annotations

import math
from collections.abc import Callable

MIN_LATENCY_SAMPLES = 20  # before that, the baseline is too young to judge by
BASELINE_RELAX = 0.01  # fraction of the gap to the current average the baseline moves up per sample


class AdaptiveLimit:
    """AIMD in-flight limit: +1/limit per success (about +1 per round trip), x backoff on congestion (a 429 or
    latency above tolerance x baseline), at most one cut per cooldown, within [minimum, maximum]."""

    def __init__(self, minimum: int, maximum: int, initial: int | None = None, backoff: float = 0.9,
                 latency_tolerance: float = 2.0, cooldown_s: float = 1.0, ewma_alpha: float = 0.1,
                 latency_min_rise_s: float = 0.5) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum}, {maximum}")
        if initial is not None and not minimum <= initial <= maximum:
            raise ValueError(f"initial must be within [{minimum}, {maximum}], got {initial}")
        if not 0 < backoff < 1:
            raise ValueError(f"backoff must be in (0, 1), got {backoff}")
        if not latency_tolerance > 1:
            raise ValueError(f"latency_tolerance must be > 1, got {latency_tolerance}")
        if not cooldown_s >= 0:
            raise ValueError(f"cooldown_s must be >= 0, got {cooldown_s}")
        if not 0 < ewma_alpha <= 1:
            raise ValueError(f"ewma_alpha must be in (0, 1], got {ewma_alpha}")
        self._minimum = minimum
        self._maximum = maximum
        self._backoff = backoff
        self._tolerance = latency_tolerance
        self._cooldown_s = cooldown_s
        self._alpha = ewma_alpha
        self._min_rise_s = latency_min_rise_s
        # Start low unless told otherwise: grow into the provider's capacity rather than hit it.
        self._value = float(initial if initial is not None else minimum)
        self._last_cut = -math.inf
        self._ewma: float | None = None
        self._baseline: float | None = None
        self._samples = 0
        self._listeners: list[Callable[[], None]] = []

    @property
    def limit(self) -> int:
        return min(self._maximum, max(self._minimum, math.floor(self._value + 1e-9)))

    @property
    def latency_ewma(self) -> float | None:
        return self._ewma

    @property
    def latency_baseline(self) -> float | None:
        return self._baseline

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever :attr:`limit` changes (a gate wakes its waiters when it grows)."""
        self._listeners.append(listener)

    def on_success(self, latency_s: float, now: float) -> None:
        """A call answered: grow by 1/limit, unless latency shows a queue building (then cut instead)."""
        if self._track_latency(latency_s):
            self._cut(now)
            return
        self._set(min(float(self._maximum), self._value + 1.0 / self.limit))  # limit successes: +1

    def on_congestion(self, now: float) -> None:
        """The provider pushed back (a 429 saying a limit is exhausted): cut, at most once per cooldown."""
        self._cut(now)

    def _track_latency(self, latency_s: float) -> bool:
        """Add a sample; True if the short-term average is above ``tolerance x baseline``."""
        if not (latency_s >= 0 and math.isfinite(latency_s)):
            return False
        ewma = latency_s if self._ewma is None else self._ewma + self._alpha * (latency_s - self._ewma)
        self._ewma = ewma
        self._samples += 1
        if self._baseline is None or ewma < self._baseline:
            self._baseline = ewma
        else:
            self._baseline += BASELINE_RELAX * (ewma - self._baseline)
        return (self._samples >= MIN_LATENCY_SAMPLES and ewma > self._tolerance * self._baseline
                and ewma - self._baseline > self._min_rise_s)

    def _cut(self, now: float) -> None:
        if now - self._last_cut < self._cooldown_s:
            return
        self._last_cut = now
        self._set(max(float(self._minimum), self._value * self._backoff))

    def _set(self, value: float) -> None:
        before = self.limit
        self._value = value
        if self.limit != before:
            for listener in self._listeners:
                listener()
