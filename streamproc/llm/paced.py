"""The layer that paces calls under each model's requests/min and tokens/min, and learns the limits back.

It reserves the call's estimated cost in the model's buckets and sleeps out the wait (inside the in-flight
gate, so a paced call holds its slot); after the call it reads the ``x-ratelimit-*`` headers, and a 429
saying a bucket is empty pauses the model and is reported as congestion (the in-flight limit and the model's
pace are cut).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.rate_limits import RateLimiter
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.outcome import Failure
from streamproc.core.verdict import RATE_LIMITED
from streamproc.llm.client import CallResult
from streamproc.llm.layer import Layer, Refused


class RateLimitedLayer:
    """Waits for the model's buckets, then calls; learns limits and congestion from the answer."""

    def __init__(self, inner: Layer[CallResult | Refused], limiter: RateLimiter, estimator: TokenEstimator,
                 clock: Callable[[], float], sleep: Callable[[float], Awaitable[object]],
                 on_congestion: Callable[[float], None] | None = None) -> None:
        self._inner = inner
        self._limiter = limiter
        self._estimator = estimator
        self._clock = clock
        self._sleep = sleep
        self._on_congestion = on_congestion

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
        model: str = body["model"]
        cost = self._estimator.cost(body)  # before the call: the answer may recalibrate the estimator
        wait = self._limiter.for_model(model, self._clock()).reserve(cost, self._clock())
        if wait > 0:
            await self._sleep(wait)
        called = await self._inner.call(request, body, first)
        if isinstance(called, CallResult):
            self._learn(model, cost, called)
        return called

    def _learn(self, model: str, cost: int, called: CallResult) -> None:
        now = self._clock()
        limiter = self._limiter.for_model(model, now)
        limiter.observe(called.headers, now)  # it reads the x-ratelimit-* names in any case
        outcome = called.outcome
        if isinstance(outcome, Failure) and outcome.code == RATE_LIMITED:
            hint = outcome.retry_after_ms / 1000 if outcome.retry_after_ms is not None else None
            if limiter.on_rate_limited(called.headers, hint, cost, now) and self._on_congestion is not None:
                self._on_congestion(now)
