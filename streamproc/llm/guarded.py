"""The guards of one worker around its LLM caller, stacked as wrappers; and what the handler asks them.

One :class:`Guards` per worker process, shared by every in-flight call, so the limits hold for the process
as a whole (design §5). Each guard is a wrapper around the next (like httpx transports, see
:mod:`streamproc.llm.layer`); a call goes down the stack, outermost first:

1. :class:`ContextFallbackLayer`: a ``context_length_exceeded`` answer is sent once more, through the whole
   stack again, to the called model's context fallback when one is configured;
2. :class:`RoutingLayer`: the first of the model and its fallbacks whose breaker is not open; none → wait
   for a breaker up to the hold, else :class:`Deferred` (this runs outside the gate: waiting holds no slot);
   with a model list, the deployment of that model, named by its key to every layer below;
3. :class:`GatedLayer`: the adaptive in-flight gate (latency gradient), so a queueing server sees fewer concurrent
   calls; each deployment of the model list has its own limit, within the worker's total;
4. :class:`RateLimitedLayer`: that model's requests/min and tokens/min buckets (the wait happens here,
   inside the gate);
5. :class:`BreakerLayer`: the breaker again, right before sending: calls that queued for tokens while it
   opened are not sent, and the routing (2) picks again;
6. :class:`MeteredCaller`: the HTTP call (a first attempt is counted for the retry budget here), whose outcome
   feeds back into every guard on the way up.

The layers for the rate limits and the gate are left out when those guards are off. Besides the call,
:class:`Guards` does the pre-check against context windows, hands the handler the batch's retry budget as a
stop condition of the retry decision, and keeps the counters the metrics read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from streamproc.core.deployments_out import worker_out
from streamproc.core.events import InferenceRequest
from streamproc.core.guards.breaker import BreakerState, CircuitBreaker
from streamproc.core.guards.budget import RetryBudget
from streamproc.core.guards.gradient import GradientLimit
from streamproc.core.guards.long_requests import NO_POOL, LongRequests
from streamproc.core.guards.pauses import ModelPauses, Pause
from streamproc.core.guards.rate_limits import Pacing, RateLimiter, RateLimits
from streamproc.core.guards.routing import Routes
from streamproc.core.guards.tenant_pauses import TenantPauses
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.model_list import ANY_MODEL, ModelList, single_endpoint
from streamproc.core.model_names import INVALID_MODEL_NAME, model_name_problem
from streamproc.core.outcome import Failure, truncate
from streamproc.core.retry_policy import Stop, within_budget
from streamproc.core.tenant_pace import TenantPace
from streamproc.core.tenant_share import FairChoice, TenantWeights
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.breakers import BreakerLayer, Breakers
from streamproc.llm.client import Caller, CallResult
from streamproc.llm.context_fallback import ContextFallbackLayer
from streamproc.llm.gated import AdaptiveGate, GatedLayer
from streamproc.llm.layer import Layer, Refused
from streamproc.llm.metered import MeteredCaller
from streamproc.llm.paced import RateLimitedLayer
from streamproc.llm.routed import Deferred, EventWait, RoutingLayer
from streamproc.settings import BreakerSettings, GuardSettings, InFlightSettings

log = logging.getLogger(__name__)

__all__ = ["Deferred", "Guards"]

MODEL_NOT_LISTED = "model_not_listed"  # the business failure of a request naming a model the model list lacks


class Guards:
    """Everything between the handler and the HTTP client; see the module docstring for the order."""

    def __init__(self, caller: Caller, *, routes: Routes | None = None, limiter: RateLimiter | None = None,
                 adaptive: GradientLimit | None = None, breakers: BreakerSettings | None = None,
                 budget: RetryBudget | None = None, estimator: TokenEstimator | None = None,
                 expected_first_attempts: Callable[[str], float] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 wait: EventWait | None = None, models: ModelList | None = None,
                 giving_way: Callable[[], bool] = lambda: False, long_requests: LongRequests = NO_POOL,
                 tenant_pauses: TenantPauses | None = None) -> None:
        self._caller = caller
        self.routes = routes or Routes()
        self.models = models or single_endpoint()  # the deployments of each model
        self.limiter = limiter  # None: no rate limiting
        self.adaptive = adaptive  # the first deployment's in-flight limit, the others' made like it; None: no gate
        self._breakers = Breakers(breakers)  # no settings: no breakers
        self.budget = budget  # None: retries limited by the policy alone
        self._expected_first_attempts = expected_first_attempts  # batch -> this worker's share of its size
        self.estimator = estimator or TokenEstimator()
        self.pauses = ModelPauses(on_change=_log_pause)  # models whose first calls all failed alike
        self.tenant_pauses = tenant_pauses  # tenants whose calls of a model failed alike; None: never paused
        self.fallbacks: dict[tuple[str, str, str], int] = {}  # (from, to, reason) -> calls
        self.budget_exhausted = 0  # read by the metrics collector, like fallbacks
        self._paced: RateLimitedLayer | None = None
        self._giving_way = giving_way  # a rebalance or stop has begun: calls waiting their turn give way (§5.7)
        self._gate = AdaptiveGate(adaptive, long_requests=long_requests, clock=clock) if adaptive is not None else None
        self._stack = self._compose(clock, sleep, wait)

    def _compose(self, clock: Callable[[], float], sleep: Callable[[float], Awaitable[object]],
                 wait: EventWait | None) -> Layer[CallResult | Deferred]:
        """The wrappers, innermost first (the module docstring lists them outermost first)."""
        stack: Layer[CallResult | Refused] = BreakerLayer(MeteredCaller(self._caller, self.budget, self.estimator),
                                                          self._breakers, clock)
        gate, deployment_of = self._gate, self.models.entry_of
        if self.limiter is not None:
            on_congestion = None if gate is None else (
                lambda model, now: gate.limit_of(deployment_of(model)).on_congestion(now))
            stack = self._paced = RateLimitedLayer(stack, self.limiter, self.estimator, clock, sleep, on_congestion,
                                                   self._giving_way)
        if gate is not None:
            stack = GatedLayer(stack, gate, clock, deployment_of, self.estimator.cost)
        routing = RoutingLayer(stack, self.routes, self._breakers, self._count_fallback, clock, wait, self.pauses,
                               self.models, self.tenant_pauses)
        return ContextFallbackLayer(routing, self.routes, self._count_fallback)

    @classmethod
    def from_settings(cls, settings: GuardSettings, caller: Caller,
                      expected_first_attempts: Callable[[str], float] | None = None,
                      models: ModelList | None = None, giving_way: Callable[[], bool] = lambda: False) -> Guards:
        """The guards the settings describe; ``caller`` takes deployment keys when ``models`` lists deployments
        (:class:`streamproc.llm.deployments.DeploymentCaller`), each paced at its own rpm/tpm when it has them."""
        routes, rate, in_flight = settings.routes, settings.rate, settings.in_flight
        configured = RateLimits(rpm=rate.rpm, tpm=rate.tpm)
        own_limits = {d.key: RateLimits(rpm=d.rpm or configured.rpm, tpm=d.tpm or configured.tpm)
                      for d in (models.deployments if models is not None else ()) if d.rpm or d.tpm}
        return cls(
            caller,
            routes=Routes(context_windows=routes.context_windows, context_fallbacks=routes.context_fallbacks,
                          model_fallbacks=routes.model_fallbacks),
            limiter=RateLimiter(configured, share=rate.share, configured_by_model=own_limits),
            adaptive=GradientLimit(minimum=in_flight.floor, maximum=in_flight.ceiling, initial=in_flight.start),
            breakers=settings.breaker,
            budget=RetryBudget(ratio=settings.retry_budget.ratio, minimum=settings.retry_budget.minimum),
            expected_first_attempts=expected_first_attempts,
            models=models,
            giving_way=giving_way,
            long_requests=long_requests_of(in_flight),
            tenant_pauses=None if settings.tenant_pause is None else TenantPauses(
                threshold=settings.tenant_pause.after, probe_interval_s=settings.tenant_pause.probe_s,
                on_change=_log_tenant_pause),
        )

    # -- before the call -----------------------------------------------------------------------------------
    def precheck(self, body: dict[str, Any]) -> dict[str, Any] | Failure:
        """The body to send (its model possibly replaced by the context fallback), or a business failure: a
        model name outside :mod:`streamproc.core.model_names` (never called, never a guard's key or a label)."""
        model = body.get("model")
        if not isinstance(model, str):
            return body
        problem = model_name_problem(model)
        if problem is not None:
            return Failure(FailureLayer.BUSINESS, INVALID_MODEL_NAME, truncate(f"body.model {problem}; not called"))
        if not self.models.serves(model):
            return Failure(FailureLayer.BUSINESS, MODEL_NOT_LISTED, truncate(
                f"model {model!r} is not in the model list (STREAMPROC_MODELS_FILE serves "
                f"{', '.join(self.models.models())}); not called"))
        routed = self.routes.precheck(model, self.estimator.prompt_tokens(body), self.estimator.max_tokens(body))
        if isinstance(routed, Failure):
            return routed
        if routed == model:
            return body
        self._count_fallback(model, routed, "context_window")
        return {**body, "model": routed}

    # -- the call ------------------------------------------------------------------------------------------
    async def call(self, request: InferenceRequest, body: dict[str, Any], attempt: int) -> CallResult | Deferred:
        """Make the call through every guard; :class:`Deferred` when no model may be called soon enough."""
        if not isinstance(body.get("model"), str):  # malformed: let the provider say so (no model, no guard to pick)
            return await self._caller.call(request, body)
        return await self._stack.call(request, body, attempt == 1)

    def on_batched(self, request: InferenceRequest, attempt: int) -> None:
        """A provider batch's line is sent outside the stack, so its first attempt is counted here, as the stack's
        bottom counts a call's: without it a routed batch's retry budget was a ratio of nothing."""
        if attempt == 1 and self.budget is not None:
            self.budget.on_first_attempt(request.batch_id or "")

    # -- after the call ------------------------------------------------------------------------------------
    def budget_stop(self, batch_id: str | None) -> Stop:
        """The batch's retry budget, as the stop condition the retry decision asks last."""
        return within_budget(batch_id, lambda: self.allow_retry(batch_id))

    def allow_retry(self, batch_id: str | None) -> bool:
        """Spend one retry of the batch's budget; False when it is spent (the failure becomes terminal)."""
        batch = batch_id or ""
        expected = self._expected_first_attempts(batch) if self._expected_first_attempts is not None else 0.0
        if self.budget is None or self.budget.try_spend(batch, expected):
            return True
        self.budget_exhausted += 1
        return False

    def restore_spent(self, totals: dict[str, tuple[int, int]]) -> None:
        """Raise the batches' budget counts to what the state table records (batch -> (first attempts,
        retries spent)): a restarted worker remembers what its batches already spent."""
        if self.budget is None:
            return
        for batch, (first_attempts, retries) in totals.items():
            self.budget.at_least(batch, first_attempts, retries)

    def _count_fallback(self, source: str, target: str, reason: str) -> None:
        key = (source, target, reason)
        self.fallbacks[key] = self.fallbacks.get(key, 0) + 1

    def share_among(self, weights: TenantWeights, pace: TenantPace | None = None) -> None:
        """Share the gate's slots among tenants by ``weights`` and hold each to its RPM/TPM quota by ``pace`` (the
        tenants file; design §5.11)."""
        if self._gate is not None:
            self._gate.fair = FairChoice(weights)
            if pace is not None:
                self._gate.pace = pace

    def yield_to_urgent(self, coming: Callable[[str], bool]) -> None:
        """Let a call wait (a bounded time) while ``coming(its priority)``: more urgent calls are on their way to the
        gate (design §5.11)."""
        if self._gate is not None:
            self._gate.yields = coming

    # -- for metrics ---------------------------------------------------------------------------------------
    @property
    def breakers(self) -> Mapping[str, CircuitBreaker]:
        """The breaker of each model called so far (none when breakers are off)."""
        return self._breakers.by_model

    @property
    def calls_waiting(self) -> int:
        """The calls waiting at the in-flight gate for a slot (none without a gate)."""
        return self._gate.waiting if self._gate is not None else 0

    @property
    def calls_in_flight(self) -> int:
        """The calls holding a slot of the in-flight gate (none without a gate)."""
        return self._gate.in_use if self._gate is not None else 0

    @property
    def in_flight_limit(self) -> int | None:
        """What the worker may have in flight now: its deployments' in-flight limits, within its total."""
        return self._gate.total_limit if self._gate is not None else None

    def in_flight_limits(self) -> dict[str, int]:
        """The in-flight limit of each deployment of the model list called so far (none for the single endpoint)."""
        limits = self._gate.limits() if self._gate is not None else {}
        return {key: limit for key, limit in limits.items() if key != ANY_MODEL}

    def out(self) -> dict[str, str]:
        """The deployments (models, for the single endpoint) out of rotation, their breaker open or half-open or
        paused, and the tenants paused on a model, and why: what this worker's fleet beat says for ``status``
        (core.deployments_out)."""
        paused = {key: pause.reason for key, pause in self.pauses.paused().items()}
        tenants = {} if self.tenant_pauses is None else {
            key: pause.reason for key, pause in self.tenant_pauses.paused().items()}
        return worker_out(self._breakers.out(), paused, tenants)

    def breaker_states(self) -> dict[str, BreakerState]:
        return {model: breaker.state for model, breaker in self.breakers.items()}

    @property
    def resent_after_429(self) -> int:
        """Calls the pace sent again after a 429 refused them (no failure event records these)."""
        return self._paced.resent if self._paced is not None else 0

    def rate_limits(self) -> dict[str, RateLimits]:
        """The per-minute limits each model is paced under (configured or learned, after the share)."""
        return self.limiter.limits_by_model() if self.limiter is not None else {}

    def pacing(self) -> dict[str, Pacing]:
        """How each model is paced: its limits, the pace and its share of 429s naming no bucket."""
        return self.limiter.pacing_by_model() if self.limiter is not None else {}


def long_requests_of(in_flight: InFlightSettings) -> LongRequests:
    """The pool for long requests the settings describe (the gate's share, the client's timing apart)."""
    return LongRequests(threshold_tokens=in_flight.long_threshold_tokens, share=in_flight.long_share)


def _log_tenant_pause(tenant: str, model: str, pause: Pause | None) -> None:
    if pause is not None:
        log.warning("tenant %s paused on model %s: %s; its requests of that model wait in the shortest retry tier, "
                    "one probe call per interval checks whether it was fixed (other tenants go on)",
                    tenant, model, pause.reason)
    else:
        log.warning("tenant %s resumed on model %s: a probe call was answered", tenant, model)


def _log_pause(model: str, pause: Pause | None) -> None:
    if pause is not None:
        log.warning("model %s paused: %s; its requests wait in the shortest retry tier, one probe call a minute "
                    "checks whether it was fixed (other models go on)", model, pause.reason)
    else:
        log.warning("model %s resumed: a probe call succeeded", model)
