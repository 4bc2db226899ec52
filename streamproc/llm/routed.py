"""The layer that picks the model: the first of the requested one and its fallbacks whose breaker is not open
and that is not paused for a systematic failure (:mod:`streamproc.core.guards.pauses`; a paused model lets
one probe call through per interval, and this layer records each model's outcomes for it).

When every candidate's breaker is open, the call waits (holding its dispatcher slot, so consumption stops
by itself) for one to change or to let a probe through, as long as that can happen within the hold; else it
is :class:`Deferred` and the handler parks it in a retry tier. This runs before the in-flight gate, so
waiting calls hold no gate slot; if the breaker refuses the call at its last check, below the gate, it
picks again. It answers which model it called (:class:`Routed`): the context fallback is that model's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.pauses import ModelPauses
from streamproc.core.guards.routing import Routes
from streamproc.core.request_state import CIRCUIT_OPEN, MODEL_PAUSED
from streamproc.llm.breakers import Breakers
from streamproc.llm.client import CallResult
from streamproc.llm.layer import Layer, Refused

MIN_BREAKER_WAIT_S = 0.05

CountFallback = Callable[[str, str, str], None]  # (from model, to model, reason)
EventWait = Callable[[asyncio.Event, float], Awaitable[object]]


@dataclass(frozen=True)
class Deferred:
    """No call was made: every candidate model's breaker is open, or the model is paused; ask again in
    ``delay_s`` seconds. ``code`` and ``reason`` say which, for the parked record's headers and state."""

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
    """Sends the call to the first candidate model whose breaker may let it through, waiting up to the hold."""

    def __init__(self, inner: Layer[CallResult | Refused], routes: Routes, breakers: Breakers,
                 count_fallback: CountFallback, clock: Callable[[], float], wait: EventWait | None = None,
                 pauses: ModelPauses | None = None) -> None:
        self._inner = inner
        self._routes = routes
        self._breakers = breakers
        self._pauses = pauses or ModelPauses()
        self._count_fallback = count_fallback
        self._clock = clock
        self._wait = wait or _wait_for_event

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> Routed | Deferred:
        requested: str = body["model"]
        deadline = self._clock() + self._breakers.hold_s
        while True:
            model = self._routes.first_callable(requested, self._may_call)
            if model is None:
                if not await self._await_breakers(requested, deadline):
                    return self._defer(requested)
                continue
            if model != requested:
                self._count_fallback(requested, model, "breaker_open")
            call = self._pauses.begin(model)
            try:
                called = await self._inner.call(request, {**body, "model": model} if model != requested else body,
                                                first)
            except BaseException:
                self._pauses.abandon(model, call, self._clock())
                raise
            if isinstance(called, Refused):
                self._pauses.abandon(model, call, self._clock())
            else:
                self._pauses.record(model, called.outcome, self._clock(), call)
                return Routed(model, called)

    async def _await_breakers(self, model: str, deadline: float) -> bool:
        """Wait for a breaker of the model's candidates to change or to let a probe through; False (park the
        request) when that cannot happen before ``deadline``."""
        now = self._clock()
        breakers = [b for b in (self._breakers.get(c) for c in self._routes.candidates(model)) if b is not None]
        wake_at = min((breaker.retry_at(now) for breaker in breakers), default=now)
        wake_at = max(wake_at, min(self._pauses.retry_at(c, now) for c in self._routes.candidates(model)))
        if wake_at > deadline:
            return False
        await self._wait(self._breakers.changed, max(wake_at - now, MIN_BREAKER_WAIT_S))
        return True

    def _may_call(self, model: str) -> bool:
        breaker = self._breakers.get(model)
        now = self._clock()
        return (breaker is None or breaker.retry_at(now) <= now) and self._pauses.may_call(model, now)

    def _defer(self, model: str) -> Deferred:
        breaker = self._breakers.get(model)
        now = self._clock()
        pause = self._pauses.paused().get(model)
        if pause is not None:
            return Deferred(max(0.0, pause.probe_at - now), model, MODEL_PAUSED, f"{model} is paused: {pause.reason}")
        delay = max(0.0, breaker.retry_at(now) - now) if breaker is not None else 0.0
        return Deferred(delay, model, CIRCUIT_OPEN, f"the circuit breaker of {model} is open")


async def _wait_for_event(event: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
