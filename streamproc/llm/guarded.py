"""The guards of one worker around its LLM caller: pre-check, routing, rate limits, AIMD, breakers, budget.

One :class:`Guards` per worker process, shared by every in-flight call, so the limits hold for the process
as a whole (DESIGN §5). A call goes through, in order:

1. the adaptive in-flight gate (AIMD), so a struggling provider sees fewer concurrent calls;
2. the routing: the first of the model and its fallbacks whose breaker is not open; none → :class:`Deferred`;
3. that model's requests/min and tokens/min buckets (the wait happens here, inside the gate);
4. the breaker again, right before sending: calls that queued for tokens while it opened are not sent;
5. the HTTP call, whose outcome feeds back into every guard; a ``context_length_exceeded`` answer is sent
   once more to the model's context fallback when one is configured.

Pure state machines live in the sibling modules; this module only wires them and does the waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.aimd import AdaptiveLimit
from streamproc.core.guards.breaker import BreakerState, CircuitBreaker
from streamproc.core.guards.budget import RetryBudget
from streamproc.core.guards.rate_limits import RateLimiter, RateLimits
from streamproc.core.guards.routing import CONTEXT_LENGTH_EXCEEDED, Routes
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.outcome import Failure, Success
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.client import Caller, CallResult
from streamproc.llm.gate import AdaptiveGate
from streamproc.settings import Settings

log = logging.getLogger(__name__)

RATE_LIMITED = "rate_limit_exceeded"
MIN_BREAKER_WAIT_S = 0.05


@dataclass(frozen=True)
class Deferred:
    """No call was made: every candidate model's breaker is open; ask again in ``delay_s`` seconds."""

    delay_s: float
    model: str


@dataclass(frozen=True)
class BreakerSettings:
    failure_rate: float = 0.5
    window_s: float = 10.0
    min_calls: int = 10
    open_s: float = 5.0
    hold_s: float = 10.0  # how long a call may wait (in memory) for an open breaker before it is parked


class Guards:
    """Everything between the handler and the HTTP client; see the module docstring for the order."""

    def __init__(self, caller: Caller, *, routes: Routes | None = None, limiter: RateLimiter | None = None,
                 adaptive: AdaptiveLimit | None = None, breakers: BreakerSettings | None = None,
                 budget: RetryBudget | None = None, estimator: TokenEstimator | None = None,
                 expected_first_attempts: Callable[[str], float] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 wait: Callable[[asyncio.Event, float], Awaitable[object]] | None = None) -> None:
        self._caller = caller
        self.routes = routes or Routes()
        self.limiter = limiter  # None: no rate limiting
        self.adaptive = adaptive
        self._gate = AdaptiveGate(adaptive) if adaptive is not None else None
        self._breaker_settings = breakers  # None: no breakers
        self.breakers: dict[str, CircuitBreaker] = {}
        self.budget = budget  # None: retries limited by the policy alone
        self._expected_first_attempts = expected_first_attempts  # batch -> this worker's share of its size
        self.estimator = estimator or TokenEstimator()
        self._hold_s = breakers.hold_s if breakers is not None else 0.0
        self._clock = clock
        self._sleep = sleep
        self._wait = wait or _wait_for_event
        self._breaker_changed = asyncio.Event()  # set (and replaced) on every breaker transition
        self.fallbacks: dict[tuple[str, str, str], int] = {}  # (from, to, reason) -> calls
        self.budget_exhausted = 0  # read by the metrics collector, like fallbacks

    @classmethod
    def from_settings(cls, settings: Settings, caller: Caller,
                      expected_first_attempts: Callable[[str], float] | None = None) -> Guards:
        return cls(
            caller,
            routes=Routes(settings.context_windows, settings.context_fallbacks, settings.model_fallbacks),
            limiter=RateLimiter(RateLimits(settings.llm_rpm or None, settings.llm_tpm or None),
                                settings.llm_limit_share),
            adaptive=AdaptiveLimit(min(settings.adaptive_min_in_flight, settings.in_flight), settings.in_flight,
                                   initial=settings.in_flight),  # a batch starts at full speed; the limiter paces
            breakers=(BreakerSettings(settings.breaker_failure_rate, settings.breaker_window_s,
                                      settings.breaker_min_calls, settings.breaker_open_s, settings.breaker_hold_s)
                      if settings.breaker_enabled else None),
            budget=RetryBudget(settings.retry_budget_ratio, settings.retry_budget_min),
            expected_first_attempts=expected_first_attempts,
        )

    # -- before the call -----------------------------------------------------------------------------------
    def precheck(self, body: dict[str, Any]) -> dict[str, Any] | Failure:
        """The body to send (its model possibly replaced by the context fallback), or a business failure."""
        model = body.get("model")
        if not isinstance(model, str):
            return body
        routed = self.routes.precheck(model, self.estimator.prompt_tokens(body), self.estimator.max_tokens(body))
        if isinstance(routed, Failure):
            return routed
        if routed == model:
            return body
        self._count_fallback(model, routed, "context_window")
        return {**body, "model": routed}

    def allow_retry(self, batch_id: str | None) -> bool:
        """Spend one retry of the batch's budget; False when it is spent (the failure becomes terminal)."""
        batch = batch_id or ""
        expected = self._expected_first_attempts(batch) if self._expected_first_attempts is not None else 0.0
        if self.budget is None or self.budget.try_spend(batch, expected):
            return True
        self.budget_exhausted += 1
        return False

    # -- the call ------------------------------------------------------------------------------------------
    async def call(self, request: InferenceRequest, body: dict[str, Any], attempt: int) -> CallResult | Deferred:
        """Make the call through every guard; :class:`Deferred` when no model may be called soon enough."""
        return await self._call(request, body, first=attempt == 1)

    async def _call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Deferred:
        requested = body.get("model")
        if not isinstance(requested, str):  # malformed: let the provider say so (no model, no guard to pick)
            return await self._caller.call(request, body)
        deadline = self._clock() + self._hold_s
        while True:
            model = self.routes.first_callable(requested, self._may_call)
            if model is None:
                if not await self._await_breakers(requested, deadline):
                    return self._defer(requested)
                continue
            if model != requested:
                self._count_fallback(requested, model, "breaker_open")
            called = await self._gated_call(request, {**body, "model": model} if model != requested else body,
                                            model, first)
            if called is not None:
                break
        fallback = self._context_fallback(model, called)
        if fallback is None:
            return called
        log.info("%s: %s says the input is too long; sending it to %s", request.request_id, model, fallback)
        self._count_fallback(model, fallback, "context_length")
        return await self._call(request, {**body, "model": fallback}, first=False)

    async def _gated_call(self, request: InferenceRequest, body: dict[str, Any], model: str,
                          first: bool) -> CallResult | None:
        """Inside the AIMD gate: wait for tokens, ask the breaker once more, call; None if it said no."""
        if self._gate is None:
            return await self._paced_call(request, body, model, first)
        async with self._gate:
            return await self._paced_call(request, body, model, first)

    async def _paced_call(self, request: InferenceRequest, body: dict[str, Any], model: str,
                          first: bool) -> CallResult | None:
        cost = self.estimator.cost(body)
        if self.limiter is not None:
            wait = self.limiter.for_model(model, self._clock()).reserve(cost, self._clock())
            if wait > 0:
                await self._sleep(wait)
        breaker = self._breaker(model)
        allowed_at = self._clock()
        if breaker is not None and not breaker.allow(allowed_at):
            return None  # it opened (or its probe went out) while this call waited for tokens
        if first and self.budget is not None:
            self.budget.on_first_attempt(request.batch_id or "")
        called = await self._caller.call(request, body)
        self._learn(model, body, cost, called, allowed_at)
        return called

    async def _await_breakers(self, model: str, deadline: float) -> bool:
        """Wait for a breaker of the model's candidates to change or to let a probe through; False (park the
        request) when that cannot happen before ``deadline``. Waiting holds the record's dispatcher slot, so
        consumption stops by itself instead of moving the whole backlog through a retry tier."""
        now = self._clock()
        breakers = [b for b in (self._breaker(c) for c in self.routes.candidates(model)) if b is not None]
        wake_at = min((breaker.retry_at(now) for breaker in breakers), default=now)
        if wake_at > deadline:
            return False
        await self._wait(self._breaker_changed, max(wake_at - now, MIN_BREAKER_WAIT_S))
        return True

    def _context_fallback(self, model: str, called: CallResult) -> str | None:
        outcome = called.outcome
        if isinstance(outcome, Failure) and outcome.code == CONTEXT_LENGTH_EXCEEDED:
            larger = self.routes.context_fallback(model)
            return larger if larger != model else None
        return None

    def _may_call(self, model: str) -> bool:
        breaker = self._breaker(model)
        return breaker is None or breaker.retry_at(self._clock()) <= self._clock()

    def _defer(self, model: str) -> Deferred:
        breaker = self._breaker(model)
        now = self._clock()
        delay = max(0.0, breaker.retry_at(now) - now) if breaker is not None else 0.0
        return Deferred(delay, model)

    def _on_breaker_change(self, model: str, old: BreakerState, new: BreakerState) -> None:
        _log_breaker(model, old, new)
        changed, self._breaker_changed = self._breaker_changed, asyncio.Event()
        changed.set()  # wakes the calls waiting for this (or any) breaker

    def _breaker(self, model: str) -> CircuitBreaker | None:
        if self._breaker_settings is None:
            return None
        breaker = self.breakers.get(model)
        if breaker is None:
            conf = self._breaker_settings
            breaker = CircuitBreaker(conf.failure_rate, conf.window_s, conf.min_calls, conf.open_s,
                                     on_change=lambda old, new: self._on_breaker_change(model, old, new))
            self.breakers[model] = breaker
        return breaker

    # -- after the call ------------------------------------------------------------------------------------
    def _learn(self, model: str, body: dict[str, Any], cost: int, called: CallResult, allowed_at: float) -> None:
        """Feed the outcome back: breaker, AIMD, rate limits, token calibration."""
        now = self._clock()
        outcome = called.outcome
        breaker = self._breaker(model)
        limiter = self.limiter.for_model(model, now) if self.limiter is not None else None
        if isinstance(outcome, Success):
            if outcome.prompt_tokens > 0:
                self.estimator.calibrate(self.estimator.raw(body), outcome.prompt_tokens)
            if self.adaptive is not None:
                self.adaptive.on_success(called.latency_ms / 1000, now)
        if breaker is not None:  # anything but transport/5xx (a configuration problem too): the service answered
            breaker.record(not (isinstance(outcome, Failure) and _breaks(outcome)), now, started=allowed_at)
        if limiter is None:
            return
        limiter.observe(called.headers, now)  # it reads the x-ratelimit-* names in any case
        if isinstance(outcome, Failure) and outcome.code == RATE_LIMITED:
            hint = outcome.retry_after_ms / 1000 if outcome.retry_after_ms is not None else None
            if limiter.on_rate_limited(called.headers, hint, cost, now) and self.adaptive is not None:
                self.adaptive.on_congestion(now)

    def _count_fallback(self, source: str, target: str, reason: str) -> None:
        key = (source, target, reason)
        self.fallbacks[key] = self.fallbacks.get(key, 0) + 1

    # -- for metrics ---------------------------------------------------------------------------------------
    @property
    def in_flight_limit(self) -> int | None:
        return self.adaptive.limit if self.adaptive is not None else None

    def breaker_states(self) -> dict[str, BreakerState]:
        return {model: breaker.state for model, breaker in self.breakers.items()}

    def rate_limits(self) -> dict[str, RateLimits]:
        """The per-minute limits each model is paced to (configured or learned, after the share)."""
        return self.limiter.limits_by_model() if self.limiter is not None else {}


def _breaks(failure: Failure) -> bool:
    """Transport failures and 5xx answers count against the breaker; 4xx, 429 and semantic ones do not."""
    if failure.layer is FailureLayer.TRANSPORT:
        return True
    return failure.layer is FailureLayer.SERVICE and (failure.http_status or 0) >= 500


async def _wait_for_event(event: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)


def _log_breaker(model: str, old: BreakerState, new: BreakerState) -> None:
    if new is BreakerState.OPEN:
        log.warning("circuit breaker for %s: %s -> open (too many transport/5xx failures); calls to it wait in a "
                    "retry tier or go to a fallback model", model, old.value)
    else:
        log.info("circuit breaker for %s: %s -> %s", model, old.value, new.value)
