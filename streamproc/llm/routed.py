"""The layer that picks the model: the first of the requested one and its fallbacks whose breaker is not open
and that is not paused for a systematic failure (:mod:`streamproc.core.guards.pauses`; a paused model lets
one probe call through per interval, and this layer records each model's outcomes for it). Before that, a call
of a tenant paused on the requested model (:mod:`streamproc.core.guards.tenant_pauses`: its calls failed alike
while other tenants' were answered) is deferred at once, unless it is that pause's probe.

When every candidate's breaker is open, the call waits (holding its dispatcher slot, so consumption stops
by itself) for one to change or to let a probe through, as long as that can happen within the hold; else it
is :class:`Deferred` and the handler parks it in a retry tier. This runs before the in-flight gate, so
waiting calls hold no gate slot; if the breaker refuses the call at its last check, below the gate, it
picks again. It answers which model it called (:class:`Routed`): the context fallback is that model's.

A model of the model list (:mod:`streamproc.core.model_list`) has deployments, and the guards below see each as
a model of its own (its key): a model may be called while one of its deployments may, and the call goes to the
one with the least expected wait (:mod:`streamproc.core.guards.balance`). A call that one fails in transport or
with a 5xx goes on to another of them at once, in the same attempt, so a sick deployment costs no retry (design
§5.10). Without a model list each model is its own single deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.balance import Choice, DeploymentLoad
from streamproc.core.guards.pauses import ModelPauses
from streamproc.core.guards.routing import Routes
from streamproc.core.guards.tenant_pauses import TenantPauses
from streamproc.core.model_list import Deployment, ModelList, single_endpoint
from streamproc.core.outcome import Failure
from streamproc.core.request_state import CIRCUIT_OPEN, MODEL_PAUSED, REBALANCING, TENANT_PAUSED
from streamproc.llm.breakers import Breakers, breaks
from streamproc.llm.client import CallResult
from streamproc.llm.layer import Layer, Refused

MIN_BREAKER_WAIT_S = 0.05

CountFallback = Callable[[str, str, str], None]  # (from model, to model, reason)
EventWait = Callable[[asyncio.Event, float], Awaitable[object]]


@dataclass(frozen=True)
class Deferred:
    """No call was made: every candidate model's breaker is open, the model is paused, or a rebalance began while
    the call waited its turn; ask again in ``delay_s`` seconds. ``code`` and ``reason`` say which, for the parked
    record's headers and state."""

    delay_s: float
    model: str
    code: str = CIRCUIT_OPEN
    reason: str = ""


@dataclass(frozen=True)
class Routed:
    """The answer of the model the call went to."""

    model: str
    result: CallResult


class RoutingLayer:
    """Sends the call to the first candidate model that has a deployment whose breaker may let it through, waiting
    up to the hold; among that model's deployments, to the least loaded for its weight, and on to another of them
    when the one picked fails in transport or with a 5xx."""

    def __init__(self, inner: Layer[CallResult | Refused], routes: Routes, breakers: Breakers,
                 count_fallback: CountFallback, clock: Callable[[], float], wait: EventWait | None = None,
                 pauses: ModelPauses | None = None, models: ModelList | None = None,
                 tenants: TenantPauses | None = None) -> None:
        self._inner = inner
        self._routes = routes
        self._breakers = breakers
        self._pauses = pauses or ModelPauses()
        self._tenants = tenants  # None: no tenant is paused
        self._count_fallback = count_fallback
        self._clock = clock
        self._wait = wait or _wait_for_event
        self._models = models or single_endpoint()
        self.load = DeploymentLoad()  # the outstanding calls of the deployments of models that have several

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> Routed | Deferred:
        tenants, tenant, requested = self._tenants, request.tenant, body["model"]
        if tenants is None:
            return await self._route(request, body, first)
        if not tenants.may_call(tenant, requested, self._clock()):
            return self._tenant_deferred(tenants, tenant, requested)
        call = tenants.begin(tenant, requested)
        try:
            routed = await self._route(request, body, first)
        except BaseException:
            tenants.abandon(tenant, requested, call, self._clock())
            raise
        if isinstance(routed, Deferred):
            tenants.abandon(tenant, requested, call, self._clock())
        else:
            tenants.record(tenant, requested, routed.result.outcome, self._clock(), call)
        return routed

    def _tenant_deferred(self, tenants: TenantPauses, tenant: str, model: str) -> Deferred:
        now = self._clock()
        pause = tenants.paused().get((tenant, model))
        why = pause.reason if pause is not None else "paused"
        return Deferred(max(0.0, tenants.retry_at(tenant, model, now) - now), model, TENANT_PAUSED,
                        f"tenant {tenant} is paused on {model}: {why}")

    async def _route(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> Routed | Deferred:
        requested: str = body["model"]
        deadline = self._clock() + self._breakers.hold_s
        failed: set[str] = set()  # deployments this call already failed on
        last: Routed | None = None  # the answer of the last of them
        while True:
            model = self._routes.first_callable(requested, self._may_call)
            if model is None:
                if not await self._await_breakers(requested, deadline):
                    return self._defer(requested)
                continue
            deployment = self._pick(model, failed)
            if deployment is None:  # every deployment of the model that may be called failed this call
                if last is None:
                    continue
                return last
            if model != requested and not failed:
                self._count_fallback(requested, model, "breaker_open")
            called = await self._send(request, body, deployment, first and not failed)
            if isinstance(called, Refused) and called.gave_way:
                return Deferred(0.0, requested, REBALANCING, "a rebalance began before the call was sent: it is "
                                "parked for whoever reads its partition next")
            if isinstance(called, Refused):
                continue
            listed = "" if self._models.serves_any_model else deployment.key  # the single endpoint's has no name
            last = Routed(model, replace(called, model=model, deployment=listed))
            if not (isinstance(called.outcome, Failure) and breaks(called.outcome)):
                return last
            failed.add(deployment.key)
            if not self._untried(model, failed):
                return last
            self._count_fallback(deployment.key, model, "deployment_failed")

    async def _send(self, request: InferenceRequest, body: dict[str, Any], deployment: Deployment,
                    first: bool) -> CallResult | Refused:
        """One call to the deployment, counted in its load and fed to its pause."""
        key = deployment.key
        balanced = len(self._models.of(deployment.model_name)) > 1
        if balanced:
            self.load.begin(key)
        call = self._pauses.begin(key)
        try:
            called = await self._inner.call(request, body if key == body["model"] else {**body, "model": key}, first)
        except BaseException:
            self._pauses.abandon(key, call, self._clock())
            if balanced:
                self.load.abandon(key)
            raise
        if isinstance(called, Refused):
            self._pauses.abandon(key, call, self._clock())
            if balanced:
                self.load.abandon(key)
        else:
            self._pauses.record(key, called.outcome, self._clock(), call)
            if balanced and isinstance(called.outcome, Failure) and breaks(called.outcome):
                self.load.abandon(key)
            elif balanced:
                self.load.end(key, called.latency_ms / 1000)
        return called

    def _pick(self, model: str, failed: set[str]) -> Deployment | None:
        """The deployment of ``model`` to call: the least loaded for its weight of those that may take a call (a
        paused one's probe is taken here, for the one picked only)."""
        deployments = {d.key: d for d in self._models.of(model) if d.key not in failed and self._may_call_key(d.key)}
        picked = self.load.pick([Choice(key, d.weight) for key, d in deployments.items()])
        if picked is None or not self._pauses.may_call(picked.key, self._clock()):
            return None
        return deployments[picked.key]

    def _untried(self, model: str, failed: set[str]) -> bool:
        """Whether a deployment of ``model`` this call has not failed on may take it now."""
        return any(d.key not in failed and self._may_call_key(d.key) for d in self._models.of(model))

    def _keys(self, model: str) -> list[str]:
        """The deployment keys of the model and of its fallbacks."""
        return [d.key for candidate in self._routes.candidates(model) for d in self._models.of(candidate)]

    async def _await_breakers(self, model: str, deadline: float) -> bool:
        """Wait for a breaker of the model's candidates to change or to let a probe through; False (park the
        request) when that cannot happen before ``deadline``."""
        now = self._clock()
        keys = self._keys(model)
        breakers = [b for b in (self._breakers.get(key) for key in keys) if b is not None]
        wake_at = min((breaker.retry_at(now) for breaker in breakers), default=now)
        wake_at = max(wake_at, min(self._pauses.retry_at(key, now) for key in keys))
        if wake_at > deadline:
            return False
        await self._wait(self._breakers.changed, max(wake_at - now, MIN_BREAKER_WAIT_S))
        return True

    def _may_call(self, model: str) -> bool:
        return any(self._may_call_key(d.key) for d in self._models.of(model))

    def _may_call_key(self, key: str) -> bool:
        """Whether the deployment may take a call now (asking changes nothing: a probe is taken when picked)."""
        breaker = self._breakers.get(key)
        now = self._clock()
        return (breaker is None or breaker.retry_at(now) <= now) and self._pauses.retry_at(key, now) <= now

    def _defer(self, model: str) -> Deferred:
        now = self._clock()
        keys = [d.key for d in self._models.of(model)]
        paused = self._pauses.paused()
        pauses = [(key, paused[key]) for key in keys if key in paused]
        if pauses and len(pauses) == len(keys):
            key, pause = min(pauses, key=lambda kp: kp[1].probe_at)
            return Deferred(max(0.0, pause.probe_at - now), model, MODEL_PAUSED, f"{key} is paused: {pause.reason}")
        breakers = [b for b in (self._breakers.get(key) for key in keys) if b is not None]
        delay = min((max(0.0, b.retry_at(now) - now) for b in breakers), default=0.0)
        out = ", ".join(keys)
        reason = (f"the circuit breaker of {model} is open" if keys == [model]
                  else f"every deployment of {model} is out (circuit breaker open or paused: {out})")
        return Deferred(delay, model, CIRCUIT_OPEN, reason)


async def _wait_for_event(event: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
