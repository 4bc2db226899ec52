"""The layer that paces calls under each model's requests/min and tokens/min, and learns the limits back.

It reserves the call's estimated cost in the model's buckets and sleeps out the wait (inside the in-flight gate, so
a paced call holds its slot); calls reserve in turn and at most ``HORIZON_S`` ahead, so a change of the pace, a
pause or a new share reaches all but the calls due within it. After the call it reads the ``x-ratelimit-*`` headers
and feeds every answer to the model's limiter (:mod:`streamproc.core.guards.rate_limits`). A 429 that is congestion
cuts the model's pace and the in-flight limit; any 429 pauses the call it refused: the call waits its hint (and its
model's pause, if any) and is sent again through the same limiter, up to ``MAX_SENDS`` sends in all, so a refusal
costs its wait instead of a trip through a retry tier. A wait longer than ``LONGEST_WAIT_S`` goes back to the
handler, which parks the request instead of holding a slot that long. Hedges the client sends while the call runs go
through the same limiter (:data:`streamproc.llm.client.hedge_permit`).

A call that waits its turn when a rebalance begins gives way (``Refused(gave_way=True)``, and the handler parks it):
a rebalance waits for every record in hand, and calls booked at the pace would hold it, and every worker of the
group with it, for as long as their turns take (design §5.7).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.bounded import MAX_MODELS, LruDict
from streamproc.core.guards.rate_limits import RateLimiter
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.outcome import Failure
from streamproc.core.verdict import RATE_LIMITED
from streamproc.llm.client import CallResult, hedge_permit
from streamproc.llm.layer import Layer, Refused

MAX_SENDS = 3  # sends of one call refused by 429s, the first included, before the 429 goes to the handler
LONGEST_WAIT_S = 5.0  # a refused call waits at most this long in place (the shortest retry tier)
HORIZON_S = 0.5  # calls reserve at most this far ahead of when they are due


class RateLimitedLayer:
    """Waits for the model's buckets, then calls; learns limits and congestion from the answer, and sends a
    call refused by a 429 again after its wait."""

    def __init__(self, inner: Layer[CallResult | Refused], limiter: RateLimiter, estimator: TokenEstimator,
                 clock: Callable[[], float], sleep: Callable[[float], Awaitable[object]],
                 on_congestion: Callable[[str, float], None] | None = None,
                 giving_way: Callable[[], bool] = lambda: False) -> None:
        self._inner = inner
        self._limiter = limiter
        self._estimator = estimator
        self._clock = clock
        self._sleep = sleep
        self._on_congestion = on_congestion
        self._giving_way = giving_way  # a rebalance (or a stop) has begun: calls not sent yet give way
        self._lanes: LruDict[str, asyncio.Lock] = LruDict(MAX_MODELS, asyncio.Lock)  # FIFO: served in turn
        self.resent = 0  # calls sent again after a 429 (read by the metrics: each is a call no event records)

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
        model: str = body["model"]
        cost = self._estimator.cost(body)  # before the call: the answer may recalibrate the estimator
        sends = 0
        while True:
            wait = await self._reserve(model, cost)
            if wait is not None and wait > 0:
                await self._sleep(wait)
            if wait is None or self._giving_way():
                return Refused(model, gave_way=True)
            started = self._clock()
            permit = hedge_permit.set(lambda: self._limiter.for_model(model, self._clock()).charge_hedge(
                cost, self._clock()))
            try:
                called = await self._inner.call(request, body, first and sends == 0)
            finally:
                hedge_permit.reset(permit)
            sends += 1
            if not isinstance(called, CallResult):
                return called
            again = self._learn(model, cost, called, started)
            if again is None or sends >= MAX_SENDS or again > LONGEST_WAIT_S:
                return called
            until = self._clock() + again
            while (left := until - self._clock()) > 0 and not self._giving_way():
                await self._sleep(min(left, HORIZON_S))  # a rebalance must not wait out the refusal's hint
            if self._giving_way():
                return Refused(model, gave_way=True)
            self.resent += 1

    async def _reserve(self, model: str, cost: int) -> float | None:
        """Reserve the call's cost in its model's buckets, first come first served, once the calls reserved
        before it are due within ``HORIZON_S``; returns the wait left, or None when it gives way before its turn.
        Nothing reserves further ahead, so a cut of the pace, a congestion pause or a new share reaches every call
        not due within that horizon."""
        limiter = self._limiter.for_model(model, self._clock())
        limiter.queued(1, cost)
        try:
            async with self._lanes[model]:  # the reservation is made inside: the next in the lane reserves after it
                while (early := limiter.backlog_s(self._clock()) - HORIZON_S) > 0 and not self._giving_way():
                    await self._sleep(min(early, HORIZON_S))  # a new share or pace may shorten the wait
                if self._giving_way():
                    return None
                now = self._clock()
                return self._limiter.for_model(model, now).reserve(cost, now)
        finally:
            limiter.queued(-1, -cost)

    def _learn(self, model: str, cost: int, called: CallResult, started: float) -> float | None:
        """Feed the answer to the limiter; for a 429, how long the refused call waits before it is sent again
        (its own hint, or its model's pause, the longer), else None."""
        now = self._clock()
        limiter = self._limiter.for_model(model, now)
        limiter.observe(called.headers, now)  # it reads the x-ratelimit-* names in any case
        outcome = called.outcome
        if not (isinstance(outcome, Failure) and outcome.code == RATE_LIMITED):
            congestion = limiter.on_answer(started, now)
            self._congested(model, congestion, now)
            return None
        hint = outcome.retry_after_ms / 1000 if outcome.retry_after_ms is not None else None
        refused = limiter.on_rate_limited(called.headers, hint, cost, now, started)
        self._congested(model, refused.congestion, now)
        return max(refused.wait_s, limiter.paused_until - now)

    def _congested(self, model: str, congestion: bool, now: float) -> None:
        if congestion and self._on_congestion is not None:
            self._on_congestion(model, now)
