"""The retry policy: is a failed attempt retried, in which delay tier, and as a repair? (design §2, §5)

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

The decision is made of small pieces, in the spirit of tenacity's ``stop``/``wait`` objects, so each rule
reads (and is tested) alone: *stop conditions* (:func:`never_for_business`, :func:`after_max_attempts`, and
the batch's retry budget, :func:`within_budget`) and *waits* (:func:`full_jitter` on top of
:func:`server_hint`), the wanted delay then choosing the tier. The budget is asked last, once the retry is
decided in every other respect, because asking spends one retry of the batch.

A cut answer that more room may complete is not such a retry but an *escalation* (:class:`Escalation`): the
same request with twice the completion budget, bounded by its own rule (a few doublings per request, never
past a cap). The server answered and the request asked for too little, so neither the batch's retry budget
nor the semantic layer's attempts pay for it; the budget stays for the failures that a storm is made of.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from streamproc.core.guards.budget import EXHAUSTED_REASON
from streamproc.core.outcome import Failure
from streamproc.core.verdict import RATE_LIMITED
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

TRUNCATED: Final = "truncated"  # a cut answer (design §2): finish_reason=length, or JSON that ends mid-value


@dataclass(frozen=True)
class Retry:
    """Send the request to ``tier`` with ``x-due-ts = now + due_in_ms``; as a repair request if ``repair``; with the
    completion budget ``max_tokens`` when it is an escalation (None: the budget is carried on as it was).
    ``charged``: whether it took one retry of the batch's retry budget (the state counts it, ``retries_spent``)."""

    tier: Tier
    due_in_ms: int
    repair: bool
    max_tokens: int | None = None
    charged: bool = True


@dataclass(frozen=True)
class Terminal:
    """Write the failure with ``terminal=true``; ``reason`` is ``never_retried``, ``max_attempts`` or
    ``retry_budget_exhausted``. ``failure``, when set, is what to write instead of the failure that happened
    (the budget names itself as the cause)."""

    reason: str
    failure: Failure | None = None


RetryDecision = Retry | Terminal

Stop = Callable[[Failure, int], Terminal | None]
"""A stop condition: given the failure and the number of the attempt that failed, a Terminal, or None to go on."""

Wait = Callable[[Failure, int, random.Random], int]
"""A wait strategy: the wanted delay in ms before the next attempt, given the failure and its attempt number."""


# -- stop conditions ---------------------------------------------------------------------------------------
def never_for_business(failure: Failure, attempt: int) -> Terminal | None:
    """Business failures are never retried as is (design §2): the same input would fail the same way."""
    return Terminal("never_retried") if failure.layer is FailureLayer.BUSINESS else None


def after_max_attempts(max_attempts: Mapping[FailureLayer, int]) -> Stop:
    """Stop when the attempt that failed reaches the budget of the failure's layer (attempts count across layers)."""
    def stop(failure: Failure, attempt: int) -> Terminal | None:
        return Terminal("max_attempts") if attempt >= max_attempts[failure.layer] else None
    return stop


def spends_budget(failure: Failure) -> bool:
    """Whether a retry of ``failure`` takes one from its batch's retry budget (see :func:`within_budget`)."""
    return failure.code != RATE_LIMITED


def within_budget(batch_id: str | None, spend: Callable[[], bool]) -> Stop:
    """The batch's retry budget (its state: :class:`streamproc.core.guards.budget.RetryBudget`) as a stop
    condition: ``spend`` takes one retry of it, or says it is spent; then the failure is written, terminal, as
    ``retry_budget_exhausted`` (backfill can replay it). A 429 rate limit spends nothing: the limiter paces
    the retry (it is the client's pace, not the request, that failed), and the layer's attempts still bound
    it; so a burst of 429s never starves the retries of requests that failed for real."""
    def stop(failure: Failure, attempt: int) -> Terminal | None:
        if not spends_budget(failure) or spend():
            return None
        return Terminal(EXHAUSTED_REASON, Failure(
            failure.layer, EXHAUSTED_REASON,
            f"{failure.code}, not retried: the retry budget of batch {batch_id!r} is spent (backfill can replay "
            f"it): {failure.message}"[:1000],
            failure.http_status, failure.retry_after_ms))
    return stop


# -- escalations -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompletionBudget:
    """The completion budget of a call and how far the next may raise it: ``own``, the request's (None when its body
    sets none: the server's default is unknown, so there is nothing to raise); ``sent``, the call's (``own`` raised
    by earlier escalations); ``room``, what the model's context window leaves beside the prompt (None when no window
    is known)."""

    own: int | None
    sent: int | None
    room: int | None = None


@dataclass(frozen=True)
class Escalation:
    """More room after a cut answer, bounded by its own rule: the next attempt gets twice the budget the cut call
    was sent with, only after one of the request's first ``doublings`` attempts (so at most that many times, and a
    request makes at most ``doublings + 1`` calls by them), never past ``2 ** doublings`` times the request's own
    budget nor past the room the model's window leaves."""

    doublings: int = 3

    def __post_init__(self) -> None:
        if self.doublings < 0:
            raise ValueError(f"doublings must be >= 0, got {self.doublings}")

    def grown(self, failure: Failure, attempt: int, budget: CompletionBudget | None) -> int | None:
        """The completion budget of the attempt after ``attempt`` failed with ``failure``, when that attempt is an
        escalation; None when it is not: another failure, no budget to raise, the cap or the room reached, or the
        request's escalations used up."""
        if (failure.layer is not FailureLayer.SEMANTIC or failure.code != TRUNCATED or attempt > self.doublings
                or budget is None or budget.own is None or budget.sent is None):
            return None
        cap = budget.own * 2 ** self.doublings
        if budget.room is not None:
            cap = min(cap, budget.room)
        grown = min(budget.sent * 2, cap)
        return grown if grown > budget.sent else None


# -- waits -------------------------------------------------------------------------------------------------
def server_hint() -> Wait:
    """The server's ``retry-after`` hint, 0 when it gave none."""
    def wait(failure: Failure, attempt: int, rng: random.Random) -> int:
        return failure.retry_after_ms or 0
    return wait


def full_jitter(base_ms: int, cap_ms: int) -> Wait:
    """Uniform in [0, min(cap, base * 2**(attempt-1))]: stateless, and spreads a burst of failures best."""
    def wait(failure: Failure, attempt: int, rng: random.Random) -> int:
        return round(rng.uniform(0, min(cap_ms, base_ms * 2 ** min(attempt - 1, 32))))
    return wait


def plus(*waits: Wait) -> Wait:
    """The waits added up (tenacity's ``wait_a + wait_b``), drawn in order."""
    def wait(failure: Failure, attempt: int, rng: random.Random) -> int:
        return sum(each(failure, attempt, rng) for each in waits)
    return wait


# -- the policy --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """Per-layer attempt budgets, delay tiers and backoff; one immutable object built from the settings."""

    tiers: tuple[Tier, ...] = DEFAULT_TIERS
    max_attempts: Mapping[FailureLayer, int] = field(default_factory=lambda: DEFAULT_MAX_ATTEMPTS)
    base_delay_ms: int = 5_000
    repair_from_attempt: int = 2  # the first attempt sent as a repair: every semantic retry is one (design §5.4)
    escalation: Escalation = Escalation()

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
            raise ValueError("business failures are never retried as is (design §2)")
        if self.base_delay_ms < 0:
            raise ValueError("base_delay_ms must be >= 0")
        if self.escalation.doublings >= max(self.max_attempts.values()):
            raise ValueError(f"{self.escalation.doublings} escalations would let a request make more calls than the "
                             f"largest maximum of attempts ({max(self.max_attempts.values())})")

    @property
    def stops(self) -> tuple[Stop, ...]:
        """The policy's own stop conditions, in the order they are asked."""
        return never_for_business, after_max_attempts(self.max_attempts)

    @property
    def wait(self) -> Wait:
        """Full jitter on top of the server's hint, capped at the largest tier."""
        return plus(server_hint(), full_jitter(self.base_delay_ms, self.tiers[-1].delay_ms))

    def decide(self, failure: Failure, attempt: int, rng: random.Random, budget: Stop | None = None,
               completion: CompletionBudget | None = None) -> RetryDecision:
        """What to do after ``attempt`` (1 = the first call) failed with ``failure``. A cut answer whose completion
        budget (``completion``, the call's) may still grow is escalated: the same request, due at once in the
        shortest tier, neither stopped nor charged by anything else. Otherwise ``budget`` (the batch's, see
        :func:`within_budget`) is asked last, once the retry is decided in every other respect: it spends."""
        if attempt < 1:
            raise ValueError(f"attempt numbers start at 1, got {attempt}")
        if (grown := self.escalation.grown(failure, attempt, completion)) is not None:
            return Retry(self.tiers[0], 0, repair=False, max_tokens=grown, charged=False)
        for stop in self.stops:
            if (stopped := stop(failure, attempt)) is not None:
                return stopped
        wanted = self.wait(failure, attempt, rng)
        if budget is not None and (stopped := budget(failure, attempt)) is not None:
            return stopped
        tier = self.tier_for(wanted)
        repair = failure.layer is FailureLayer.SEMANTIC and attempt + 1 >= self.repair_from_attempt
        return Retry(tier, min(wanted, tier.delay_ms), repair, charged=spends_budget(failure))

    def tier_for(self, delay_ms: int) -> Tier:
        """The smallest tier that waits at least ``delay_ms``; the largest when none does."""
        return next((tier for tier in self.tiers if tier.delay_ms >= delay_ms), self.tiers[-1])


def due_within_tier(due_ms: int | None, produced_ms: int, tier: Tier) -> int:
    """When a tier record may run: its ``x-due-ts``, but never later than one tier delay after it was
    written (a record with a far-future or garbage due time must not hold up its whole tier partition)."""
    return min(due_ms if due_ms is not None else 0, produced_ms + tier.delay_ms)
