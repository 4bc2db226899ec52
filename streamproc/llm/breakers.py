"""The circuit breakers of one worker, one per model, and the layer that asks one right before sending.

The routing (:mod:`streamproc.llm.routed`) asks the breakers first, to pick a model, outside the gate and
before the token wait. :class:`BreakerLayer` asks again at the bottom of the stack, after that wait: a call
that queued for tokens while the breaker opened is not sent (:class:`Refused`, the routing picks again),
and it records every outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from streamproc.core.deployments_out import failure_kind, out_reason
from streamproc.core.events import InferenceRequest
from streamproc.core.guards.bounded import MAX_MODELS, LruDict
from streamproc.core.guards.breaker import BreakerState, CircuitBreaker
from streamproc.core.outcome import Failure
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.client import CallResult
from streamproc.llm.layer import Layer, Refused
from streamproc.settings import BreakerSettings

log = logging.getLogger(__name__)


class Breakers:
    """A breaker per model, made on first use; none at all without settings. Every transition is logged and
    wakes the calls waiting for one (:attr:`changed`)."""

    def __init__(self, settings: BreakerSettings | None) -> None:
        self._settings = settings
        # bounded: the least recently called models' breakers go past MAX_MODELS (made again, closed, if called)
        self.by_model: LruDict[str, CircuitBreaker] = LruDict(MAX_MODELS)
        self._last_failure: LruDict[str, str] = LruDict(MAX_MODELS)  # model -> the last failure that counted
        self.hold_s = settings.hold_s if settings is not None else 0.0
        self._changed = asyncio.Event()  # set (and replaced) on every breaker transition

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next transition of any breaker."""
        return self._changed

    def get(self, model: str) -> CircuitBreaker | None:
        if self._settings is None:
            return None
        breaker = self.by_model.get(model)
        if breaker is None:
            conf = self._settings
            breaker = CircuitBreaker(conf.failure_rate, conf.window_s, conf.min_calls, conf.open_s,
                                     on_change=lambda old, new: self._on_change(model, old, new))
            self.by_model[model] = breaker
        return breaker

    def failed(self, model: str, failure: Failure) -> None:
        """A failure that counts against the model's breaker: the last one says why it is out."""
        self._last_failure[model] = failure_kind(failure.code, failure.http_status)

    def out(self) -> dict[str, str]:
        """The models (deployments) whose breaker is open or half-open, and why."""
        return {model: out_reason(breaker.state.value, self._last_failure.get(model))
                for model, breaker in self.by_model.items() if breaker.state is not BreakerState.CLOSED}

    def _on_change(self, model: str, old: BreakerState, new: BreakerState) -> None:
        _log_transition(model, old, new, self._last_failure.get(model))
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()  # wakes the calls waiting for this (or any) breaker


class BreakerLayer:
    """Asks the model's breaker right before the call (after the token wait) and records the outcome."""

    def __init__(self, inner: Layer[CallResult], breakers: Breakers, clock: Callable[[], float]) -> None:
        self._inner = inner
        self._breakers = breakers
        self._clock = clock

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
        model: str = body["model"]
        breaker = self._breakers.get(model)
        allowed_at = self._clock()
        if breaker is not None and not breaker.allow(allowed_at):
            return Refused(model)
        called = await self._inner.call(request, body, first)
        if breaker is not None:  # anything but transport/5xx (a configuration problem too): the service answered
            outcome = called.outcome
            failure = outcome if isinstance(outcome, Failure) and breaks(outcome) else None
            if failure is not None:
                self._breakers.failed(model, failure)
            breaker.record(failure is None, self._clock(), started=allowed_at)
        return called


def breaks(failure: Failure) -> bool:
    """Transport failures and 5xx answers count against the breaker; 4xx, 429 and semantic ones do not."""
    if failure.layer is FailureLayer.TRANSPORT:
        return True
    return failure.layer is FailureLayer.SERVICE and (failure.http_status or 0) >= 500


def _log_transition(model: str, old: BreakerState, new: BreakerState, last_failure: str | None) -> None:
    if new is BreakerState.OPEN:
        log.warning("circuit breaker for %s: %s -> open (too many transport/5xx failures, the last: %s); it is out: "
                    "its calls go to the model's other deployments, else to a fallback model, else wait in a retry "
                    "tier; a half-open probe brings it back", model, old.value, last_failure or "unknown")
    else:
        log.info("circuit breaker for %s: %s -> %s", model, old.value, new.value)
