"""Spend caps (design §5.9): whether a call may start, given what the fleet has spent of a batch's or a day's cap.

A cap bounds a *scope*: one batch (``submit --max-cost-usd``, ``--max-tokens``), one UTC day of the deployment
(``STREAMPROC_MAX_COST_USD_PER_DAY``) or one tenant's UTC day (its ``max_cost_usd_per_day`` in the tenants file).
Each worker keeps a :class:`SpendLedger`: per scope, what its own calls cost once settled (from the answer's
``usage``), what its calls in flight are estimated to cost (the prompt's estimate and the whole completion budget,
at the model's price), and what every other worker's last beat said it had spent and had in flight. A call starts
only when all of that and its own estimate fit within every cap that applies to it; otherwise it waits (the handler
parks it, design §5.9).

The bound. A worker sees its own spend at once and the others' as of their last beat it has read. So when it
starts a call, the fleet's spend can exceed the cap only by what the others started since the beats it read:
their calls started within one beat lag (their beat period plus its read). With n workers that each start at
most k calls per lag, whose estimates are at most e and cover what they cost, the spend never passes
``cap + (n - 1) * k * e``; k is at most a worker's calls in flight when calls last longer than the lag. A call
that costs more than its estimate (a prompt longer than estimated) adds its difference. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, NamedTuple

from streamproc.core.provider_batch_deadline import Way

BATCH: Final = "batch"
DAY: Final = "day"
TENANT_DAY: Final = "tenant_day"  # one tenant's UTC day (its max_cost_usd_per_day in the tenants file)


class Scope(NamedTuple):
    """What a cap applies to: a batch (``name`` its id), a UTC day (``name`` its ISO date) or a tenant's UTC day
    (``name`` ``<ISO date>/<tenant>``)."""

    kind: str
    name: str


def batch_scope(batch_id: str) -> Scope:
    return Scope(BATCH, batch_id)


def day_scope(now_ms: int) -> Scope:
    """The UTC day a call starting at ``now_ms`` is charged to."""
    return Scope(DAY, datetime.fromtimestamp(now_ms / 1000, UTC).date().isoformat())


def tenant_day_scope(tenant: str, now_ms: int) -> Scope:
    """The tenant's UTC day a call of ``tenant`` starting at ``now_ms`` is charged to."""
    return Scope(TENANT_DAY, f"{day_scope(now_ms).name}/{tenant}")


@dataclass(frozen=True)
class Spend:
    """US dollars and tokens (prompt and completion, as providers count)."""

    cost_usd: float = 0.0
    tokens: int = 0

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.cost_usd + other.cost_usd, self.tokens + other.tokens)

    def __sub__(self, other: Spend) -> Spend:
        return Spend(self.cost_usd - other.cost_usd, self.tokens - other.tokens)


NOTHING: Final = Spend()


@dataclass(frozen=True)
class Price:
    """US dollars per million prompt and completion tokens of one model (``STREAMPROC_MODEL_PRICES``)."""

    prompt_usd_per_million: float
    completion_usd_per_million: float

    def spend(self, prompt_tokens: int, completion_tokens: int) -> Spend:
        cost = (prompt_tokens * self.prompt_usd_per_million + completion_tokens * self.completion_usd_per_million)
        return Spend(cost / 1e6, prompt_tokens + completion_tokens)


FREE: Final = Price(0.0, 0.0)  # a model without a price counts its tokens only


PROVIDER_BATCH_DISCOUNT: Final = 0.5  # OpenAI's Batch API and Anthropic's Message Batches: half the price


def way_price(price: tuple[float, float], way: Way) -> tuple[float, float]:
    """What a model priced ``price`` charges an answer asked for ``way``: a provider batch's line at the providers'
    batch discount (design §8), a call at the full price."""
    if way is Way.PROVIDER_BATCH:
        return price[0] * PROVIDER_BATCH_DISCOUNT, price[1] * PROVIDER_BATCH_DISCOUNT
    return price


def spend_of(usage: Mapping[str, tuple[int, int]], prices: Mapping[str, tuple[float, float]],
             batched: Mapping[str, tuple[int, int]] | None = None) -> Spend:
    """What ``usage`` (per model: prompt and completion tokens) cost at ``prices`` (per model: US dollars per
    million prompt and completion tokens); ``batched``: the part of ``usage`` answered by provider batches' lines,
    charged at their discount."""
    total = NOTHING
    for model, (prompt, completion) in usage.items():
        price = prices.get(model)
        lines = (batched or {}).get(model, (0, 0))
        for way, tokens in ((Way.CALL, (prompt - lines[0], completion - lines[1])), (Way.PROVIDER_BATCH, lines)):
            total += (FREE if price is None else Price(*way_price(price, way))).spend(*tokens)
    return total


def spend_json(spent: Spend, cap: Cap | None) -> dict[str, float | int | None]:
    """``status --json``'s and ``batches --json``'s ``spend``: what the batch's results cost, and its cap."""
    return {"cost_usd": round(spent.cost_usd, 6), "tokens": spent.tokens,
            "max_cost_usd": None if cap is None else cap.max_cost_usd,
            "max_tokens": None if cap is None else cap.max_tokens}


@dataclass(frozen=True)
class Cap:
    """The most a scope may spend; None: no cap of that kind."""

    max_cost_usd: float | None = None
    max_tokens: int | None = None

    def admits(self, spend: Spend) -> bool:
        return ((self.max_cost_usd is None or spend.cost_usd <= self.max_cost_usd)
                and (self.max_tokens is None or spend.tokens <= self.max_tokens))

    def describe(self) -> str:
        """For people: ``$5, 200,000 tokens``; ``none`` for no cap."""
        parts = [f"${self.max_cost_usd:g}" if self.max_cost_usd is not None else "",
                 f"{self.max_tokens:,} tokens" if self.max_tokens is not None else ""]
        return ", ".join(part for part in parts if part) or "none"

    def left(self, spend: Spend) -> tuple[float, float]:
        """US dollars and tokens left before the cap (infinite for a kind it does not cap; never below 0)."""
        cost = math.inf if self.max_cost_usd is None else max(0.0, self.max_cost_usd - spend.cost_usd)
        tokens = math.inf if self.max_tokens is None else max(0.0, float(self.max_tokens - spend.tokens))
        return cost, tokens


@dataclass(frozen=True)
class Charge:
    """A call's estimate, held against its scopes while it is in flight."""

    scopes: tuple[Scope, ...]
    estimate: Spend


@dataclass(frozen=True)
class Exhausted:
    """The call may not start: ``scope`` has ``spent`` (as this worker sees the fleet) of ``cap``."""

    scope: Scope
    spent: Spend
    cap: Cap


class SpendLedger:
    """One worker's view of the fleet's spend per scope: its own (settled and in flight) and the others' beats."""

    def __init__(self) -> None:
        self._settled: dict[Scope, Spend] = {}
        self._in_flight: dict[Scope, Spend] = {}
        self._others: dict[str, dict[Scope, Spend]] = {}

    def spent(self, scope: Scope) -> Spend:
        """The fleet's spend on ``scope`` as this worker sees it, its calls in flight at their estimates."""
        total = self._settled.get(scope, NOTHING) + self._in_flight.get(scope, NOTHING)
        for spend in self._others.values():
            total += spend.get(scope, NOTHING)
        return total

    def begin(self, caps: Iterable[tuple[Scope, Cap]], estimate: Spend) -> Charge | Exhausted:
        """Hold ``estimate`` against every scope of ``caps`` if it fits within each cap, else the first it does not
        fit in. A scope is tracked (and published) from its first call."""
        caps = list(caps)
        for scope, cap in caps:
            if not cap.admits(self.spent(scope) + estimate):
                return Exhausted(scope, self.spent(scope), cap)
        charge = Charge(tuple(scope for scope, _ in caps), estimate)
        for scope in charge.scopes:
            self._in_flight[scope] = self._in_flight.get(scope, NOTHING) + estimate
        return charge

    def settle(self, charge: Charge, actual: Spend) -> None:
        """The call of ``charge`` ended having cost ``actual`` (nothing when no answer came)."""
        for scope in charge.scopes:
            self._in_flight[scope] = self._in_flight.get(scope, NOTHING) - charge.estimate
            self._settled[scope] = self._settled.get(scope, NOTHING) + actual

    def own(self) -> dict[Scope, Spend]:
        """What this worker's beat says: per scope, its settled spend and its calls in flight."""
        return {scope: self._settled.get(scope, NOTHING) + self._in_flight.get(scope, NOTHING)
                for scope in {*self._settled, *self._in_flight}}

    def forget_days_before(self, day: Scope) -> None:
        """Drop the days before ``day``, the deployment's and the tenants' (no call outlives a day): a beat names the
        days it has spend on."""
        for spends in (self._settled, self._in_flight, *self._others.values()):
            for scope in [scope for scope in spends if scope.kind in (DAY, TENANT_DAY)
                          and scope.name.split("/", 1)[0] < day.name]:
                del spends[scope]

    def heard(self, worker: str, spend: Mapping[Scope, Spend]) -> None:
        """Another worker's beat. Its spend stays counted after it is gone: the money was spent."""
        if spend or worker in self._others:
            self._others[worker] = dict(spend)
