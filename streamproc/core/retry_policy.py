"""The retry policy: is a failed attempt retried, in which delay tier, and as a repair? (DESIGN §2, §5)

Backoff is *full jitter* on top of the server's hint, for the n-th failed attempt:
``due_in = hint + uniform(0, min(cap, base * 2**(n-1)))``. Full jitter is stateless (it needs only the
attempt number, which already travels in ``x-attempt``; decorrelated jitter would need the previous delay
carried between hops) and spreads a burst of failures best. Adding the jitter *on top of* the hint, rather
than taking the larger of the two, keeps every retry at or after the hint while still spreading the
requests that the same 429 told "retry in 1.5s".

The delay picks the tier: the smallest whose delay is >= the wanted delay. ``due_in_ms`` (the wanted
delay, never more than the tier's) goes into ``x-due-ts``; a tier agent sleeps until the head record is
due, so nothing is retried early, and at most a tier's delay late. A wanted delay beyond the largest tier
is clamped to it: the tier agents must not sleep past the broker's poll interval, so a server asking for
an hour (a daily limit) gets retried at the largest tier and, if still refused, ends in a terminal failure
that backfill can replay later.

Attempts are counted per request across layers (``x-attempt``): a request is terminal when the attempt
that just failed reaches the ``max_attempts`` of its layer. So a request never makes more calls than the
largest budget, and a semantic failure after three transport failures is not retried.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from streamproc.core.outcome import Failure
from streamproc.core.vocabulary import FailureLayer


@dataclass(frozen=True)
class Tier:
    """A retry topic (``llm.retry.<name>``) with one fixed delay, so due times rise inside a partition."""

    name: str
    delay_ms: int


DEFAULT_TIERS: Final = (Tier("5s", 5_000), Tier("30s", 30_000), Tier("2m", 120_000), Tier("10m", 600_000))

DEFAULT_MAX_ATTEMPTS: Final[Mapping[FailureLayer, int]] = MappingProxyType(
    {FailureLayer.TRANSPORT: 6, FailureLayer.SERVICE: 6, FailureLayer.SEMANTIC: 3, FailureLayer.BUSINESS: 1}
)


@dataclass(frozen=True)
class Retry:
    """Send the request to ``tier`` with ``x-due-ts = now + due_in_ms``; as a repair request if ``repair``."""

    tier: Tier
    due_in_ms: int
    repair: bool


@dataclass(frozen=True)
class Terminal:
    """Write the failure with ``terminal=true``; ``reason`` is ``never_retried`` or ``max_attempts``."""

    reason: str


RetryDecision = Retry | Terminal


@dataclass(frozen=True)
class RetryPolicy:
    """Per-layer attempt budgets, delay tiers and backoff; one immutable object built from the settings."""

    tiers: tuple[Tier, ...] = DEFAULT_TIERS
    max_attempts: Mapping[FailureLayer, int] = field(default_factory=lambda: DEFAULT_MAX_ATTEMPTS)
    base_delay_ms: int = 5_000
    repair_from_attempt: int = 2  # the first attempt sent as a repair request (DESIGN: "from the 2nd try on")

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("at least one retry tier is needed")
        delays = [tier.delay_ms for tier in self.tiers]
        if delays != sorted(set(delays)) or delays[0] <= 0:
            raise ValueError(f"tier delays must be positive and strictly increasing: {delays}")
        if len({tier.name for tier in self.tiers}) != len(self.tiers):
            raise ValueError("tier names must be unique: they name topics")
        if set(self.max_attempts) != set(FailureLayer) or min(self.max_attempts.values()) < 1:
            raise ValueError("max_attempts needs a value >= 1 for every layer")
        if self.max_attempts[FailureLayer.BUSINESS] != 1:
            raise ValueError("business failures are never retried as is (DESIGN §2)")
        if self.base_delay_ms < 0:
            raise ValueError("base_delay_ms must be >= 0")

    def decide(self, failure: Failure, attempt: int, rng: random.Random) -> RetryDecision:
        """What to do after ``attempt`` (1 = the first call) failed with ``failure``."""
        if attempt < 1:
            raise ValueError(f"attempt numbers start at 1, got {attempt}")
        if failure.layer is FailureLayer.BUSINESS:
            return Terminal("never_retried")
        if attempt >= self.max_attempts[failure.layer]:
            return Terminal("max_attempts")
        wanted = (failure.retry_after_ms or 0) + self.jitter_ms(attempt, rng)
        tier = self.tier_for(wanted)
        repair = failure.layer is FailureLayer.SEMANTIC and attempt + 1 >= self.repair_from_attempt
        return Retry(tier, min(wanted, tier.delay_ms), repair)

    def jitter_ms(self, attempt: int, rng: random.Random) -> int:
        """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))], the cap being the largest tier."""
        ceiling = min(self.tiers[-1].delay_ms, self.base_delay_ms * 2 ** min(attempt - 1, 32))
        return round(rng.uniform(0, ceiling))

    def tier_for(self, delay_ms: int) -> Tier:
        """The smallest tier that waits at least ``delay_ms``; the largest when none does."""
        return next((tier for tier in self.tiers if tier.delay_ms >= delay_ms), self.tiers[-1])
