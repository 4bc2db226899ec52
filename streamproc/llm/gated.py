"""The adaptive in-flight gate (an asyncio semaphore whose size follows the core's gradient limit), and the layer
that holds one of its slots around the rest of the call and feeds the latency back.

A server that queues sees fewer concurrent calls: every answered call's latency (per completion token)
feeds the gradient limit; 429 congestion reaches it from the rate-limit layer below.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.gradient import GradientLimit
from streamproc.core.outcome import Success
from streamproc.llm.client import CallResult
from streamproc.llm.completion import billed_tokens
from streamproc.llm.layer import Layer, Refused

log = logging.getLogger(__name__)


class AdaptiveGate:
    """An asyncio semaphore whose size follows a GradientLimit (it is async but does no I/O).

    When the limit shrinks, running holders finish undisturbed and newcomers wait until ``in_use`` is below
    the new limit. Waiters are woken first come, first served.
    """

    def __init__(self, limit: GradientLimit) -> None:
        self._limit = limit
        self._in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        limit.subscribe(self._wake)

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._waiters if not waiter.done())

    @property
    def limit(self) -> GradientLimit:
        return self._limit

    async def acquire(self) -> None:
        if not self.waiting and self._in_use < self._limit.limit:
            self._in_use += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # _wake hands the slot over: it counts it in in_use before waking us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted, then cancelled before we resumed: give the slot back
            elif waiter in self._waiters:  # _wake may already have dropped it as done
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        if self._in_use <= 0:
            raise RuntimeError("AdaptiveGate released more often than acquired")
        self._in_use -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._in_use < self._limit.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._in_use += 1
                waiter.set_result(None)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()


class GatedLayer:
    """Everything below (token wait, breaker check, call) runs inside one slot of the gate."""

    def __init__(self, inner: Layer[CallResult | Refused], gate: AdaptiveGate, clock: Callable[[], float]) -> None:
        self._inner = inner
        self._gate = gate
        self._clock = clock

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
        async with self._gate:
            called = await self._inner.call(request, body, first)
            limit = self._gate.limit
            probing = limit.probing
            if isinstance(called, CallResult) and isinstance(called.outcome, Success):
                limit.on_sample(called.latency_ms / 1000, self._gate.in_use, self._clock(),
                                called.outcome.completion_tokens)
            elif limit.probing:  # a call sent alone measures the server whatever its answer was
                if isinstance(called, CallResult):
                    limit.on_unsampled(called.latency_ms / 1000, self._clock(),
                                       billed_tokens(called.outcome, called.response_body)[1])
                else:
                    limit.on_unsampled(0.0, self._clock())
            if limit.probing != probing:
                self._tell_probe(limit)
            return called

    def _tell_probe(self, limit: GradientLimit) -> None:
        """A probe holds every call back until the calls out drained: say so, and what it found."""
        expires_at = limit.probe_expires_at
        if expires_at is not None:
            expires_in = max(0.0, expires_at - self._clock())
            log.info("in-flight limit: the first calls queued or stalled; holding new calls until the %d out have "
                     "answered, then timing one alone (for %.1f s at most)", self._gate.in_use, expires_in)
            asyncio.get_running_loop().call_later(expires_in, self._expire, limit)
        else:
            log.info("in-flight limit: probe ended, %s; baseline %.4f s per token, limit %d", limit.last_probe,
                     limit.baseline_s or 0.0, limit.limit)

    def _expire(self, limit: GradientLimit) -> None:
        if limit.probing:
            limit.on_probe_expired(self._clock())
            if not limit.probing:
                self._tell_probe(limit)
