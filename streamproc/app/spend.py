"""The worker's spend caps (design §5.9): each call is estimated before it starts and settled from its ``usage``.

The arithmetic is pure (:mod:`streamproc.core.spend_cap`); this holds what it is applied to: the caps of the
batches (their records on the manifests topic, or the header their requests were submitted with), the day's
cap of the deployment, the tenants' caps per day (the tenants file), the models' prices and the worker's token
estimate. A call that does not fit is not
made: the handler parks its record in the shortest retry tier like a call held by an open breaker, so its
request waits (state ``retrying``, ``budget_exhausted``) without spending an attempt, and is tried again when
it comes back (after a cap was raised, or once calls in flight settled below their estimates).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streamproc.codec.batch_cap import SPEND_CAP_HEADER, decode_cap
from streamproc.core.events import InferenceRequest
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.outcome import Failure
from streamproc.core.provider_batch_deadline import Way
from streamproc.core.request_state import BUDGET_EXHAUSTED
from streamproc.core.spend_cap import (
    BATCH,
    DAY,
    FREE,
    NOTHING,
    TENANT_DAY,
    Cap,
    Charge,
    Exhausted,
    Price,
    Scope,
    Spend,
    SpendLedger,
    batch_scope,
    day_scope,
    tenant_day_scope,
    way_price,
)
from streamproc.core.vocabulary import FailureLayer

log = logging.getLogger(__name__)

_DAY_MS = 86_400_000
RECHECK_MS = 5000  # a parked call comes back this soon (the shortest tier's delay at most) to ask again


@dataclass(frozen=True)
class HeldByCap:
    """A call the caps do not let start: park it for ``delay_ms``, with ``reason`` (``budget_exhausted``)."""

    delay_ms: int
    reason: Failure


class SpendGate:
    """Whether a call may start under the caps of its batch, of the day and of its tenant's day, and what it cost once
    it ended."""

    def __init__(self, caps: Callable[[str], Cap | None], prices: Mapping[str, tuple[float, float]],
                 estimator: TokenEstimator, day_cap: Cap | None = None, ledger: SpendLedger | None = None,
                 tenant_caps: Mapping[str, Cap] | None = None) -> None:
        self.ledger = ledger or SpendLedger()
        self._caps = caps
        self._prices = dict(prices)
        self._estimator = estimator
        self._day_cap = day_cap
        self._tenant_caps = dict(tenant_caps or {})
        self._submitted_caps: dict[str, Cap] = {}  # from the requests' headers, until the cap's record is read
        self._today: Scope | None = None
        self.held: Counter[str] = Counter()  # calls held, by the kind of cap (batch, day, tenant_day)
        self._unpriced: set[str] = set()

    def begin(self, request: InferenceRequest, body: Mapping[str, Any], record_headers: Mapping[str, bytes],
              now_ms: int, way: Way = Way.CALL) -> Charge | HeldByCap | None:
        """Hold the call's estimate against its caps (None: no cap applies), or say why it may not start; ``way``:
        how it is asked for, which prices it (a provider batch's line at the discount)."""
        caps = self._applying(request, record_headers, now_ms)
        if not caps:
            return None
        model = body.get("model")
        price = self._price(model if isinstance(model, str) else "", way)
        estimate = price.spend(self._estimator.prompt_tokens(body), self._estimator.max_tokens(body))
        charged = self.ledger.begin(caps, estimate)
        if isinstance(charged, Exhausted):
            self.held[charged.scope.kind] += 1
            return HeldByCap(RECHECK_MS, Failure(FailureLayer.BUSINESS, BUDGET_EXHAUSTED, _explain(charged)))
        return charged

    def settle(self, charge: Charge, model: str, prompt_tokens: int, completion_tokens: int,
               way: Way = Way.CALL) -> None:
        """The call ended: what the provider counted (nothing when it did not answer) replaces its estimate."""
        self.ledger.settle(charge, self._price(model, way).spend(prompt_tokens, completion_tokens))

    def release(self, charge: Charge) -> None:
        """The call was not made after all (the guards parked it)."""
        self.ledger.settle(charge, NOTHING)

    def abandon(self, charge: Charge) -> None:
        """The call was cut off (the worker stops): what it cost is unknown, so it counts at its estimate."""
        self.ledger.settle(charge, charge.estimate)

    def published(self) -> dict[Scope, Spend]:
        """This worker's spend per capped scope, for its beat."""
        return self.ledger.own()

    def left(self) -> dict[Scope, tuple[float, float]]:
        """US dollars and tokens left under each cap this worker has charged a call to, as it sees the fleet (the
        latest day's only)."""
        readings = {}
        scopes = self.ledger.own()
        today = max((scope.name for scope in scopes if scope.kind == DAY), default=None)
        for scope in scopes:
            cap = self._cap_of(scope.name) if scope.kind == BATCH else self._day_cap
            if scope.kind == TENANT_DAY:  # the tenant's cap is shown by calls_held_by_cap, not here
                continue
            if cap is not None and (scope.kind == BATCH or scope.name == today):
                readings[scope] = cap.left(self.ledger.spent(scope))
        return readings

    def _applying(self, request: InferenceRequest, record_headers: Mapping[str, bytes],
                  now_ms: int) -> list[tuple[Scope, Cap]]:
        caps = []
        if request.batch_id is not None:
            submitted = record_headers.get(SPEND_CAP_HEADER)
            if submitted is not None and request.batch_id not in self._submitted_caps:
                try:
                    self._submitted_caps[request.batch_id] = decode_cap(submitted)
                except ValueError as exc:
                    log.warning("request %s: ignoring its %s header: %s", request.request_id, SPEND_CAP_HEADER, exc)
            cap = self._cap_of(request.batch_id)
            if cap is not None:
                caps.append((batch_scope(request.batch_id), cap))
        tenant_cap = self._tenant_caps.get(request.tenant)
        if self._day_cap is not None or tenant_cap is not None:
            today = day_scope(now_ms)
            if today != self._today:  # a new day: the day before yesterday is done with
                self._today = today
                self.ledger.forget_days_before(day_scope(now_ms - _DAY_MS))
            if self._day_cap is not None:
                caps.append((today, self._day_cap))
            if tenant_cap is not None:
                caps.append((tenant_day_scope(request.tenant, now_ms), tenant_cap))
        return caps

    def _cap_of(self, batch_id: str) -> Cap | None:
        """The batch's cap: its latest record (a raise), else the one its requests were submitted with."""
        return self._caps(batch_id) or self._submitted_caps.get(batch_id)

    def _price(self, model: str, way: Way) -> Price:
        price = self._prices.get(model)
        if price is None:
            if model not in self._unpriced:
                self._unpriced.add(model)
                log.warning("model %r has no price in STREAMPROC_MODEL_PRICES: a spend cap counts its tokens only, "
                            "not its cost", model)
            return FREE
        return Price(*way_price(price, way))


def _explain(exhausted: Exhausted) -> str:
    spent, cap = exhausted.spent, exhausted.cap
    kind, name = exhausted.scope
    what = (f"batch {name!r}" if kind == BATCH else f"day {name}" if kind == DAY
            else "tenant {1!r} on {0}".format(*name.split("/", 1)))
    return (f"{what} reached its spend cap ({cap.describe()}): ${spent.cost_usd:.6f} and {spent.tokens:,} tokens "
            "spent or in flight in the fleet; the call waits until the cap is raised")
