"""The adaptive in-flight gate (an asyncio semaphore per deployment whose size follows the core's gradient limit,
within the worker's total), and the layer that holds one of its slots around the rest of the call and feeds the
latency back.

A server that queues sees fewer concurrent calls: every answered call's latency (per completion token)
feeds its deployment's gradient limit; 429 congestion reaches it from the rate-limit layer below. Each
deployment of the model list has its own limit, so a slow replica's latency does not cut a fast one's, and a
hung one holds no more than its own slots (design §5.10); the single endpoint is one deployment, one limit.
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
from streamproc.core.guards.in_flight_parts import InFlightParts
from streamproc.core.model_list import ANY_MODEL
from streamproc.core.outcome import Success
from streamproc.llm.client import CallResult
from streamproc.llm.completion import billed_tokens
from streamproc.llm.layer import Layer, Refused

log = logging.getLogger(__name__)


class AdaptiveGate:
    """Slots for the calls in flight: each deployment's own, as many as its GradientLimit says, all within the
    worker's total and each deployment sure of its part of it (:mod:`streamproc.core.guards.in_flight_parts`).
    It is async but does no I/O.

    ``limit`` is the limit of the first deployment called (the single endpoint's, its only one); every other
    deployment gets a new limit like it, learnt from its own calls. When a limit shrinks, running holders
    finish undisturbed and newcomers wait. Waiters are woken first come, first served, except that a
    deployment at its limit holds back only its own calls.
    """

    def __init__(self, limit: GradientLimit, total: int | None = None) -> None:
        self._first: GradientLimit | None = limit
        self._like = limit
        self._parts = InFlightParts(total if total is not None else limit.maximum)
        self._limits: dict[str, GradientLimit] = {}  # deployment key -> its limit (bounded by the model list)
        self._waiters: deque[tuple[str, asyncio.Future[None]]] = deque()

    @property
    def in_use(self) -> int:
        """The calls in flight, every deployment's."""
        return self._parts.total_in_use

    def in_use_of(self, key: str) -> int:
        return self._parts.in_use(key)

    @property
    def waiting(self) -> int:
        return sum(1 for _, waiter in self._waiters if not waiter.done())

    def limit_of(self, key: str) -> GradientLimit:
        """The deployment's in-flight limit, made on its first call."""
        limit = self._limits.get(key)
        if limit is None:
            limit, self._first = self._first or self._like.fresh(), None
            limit.subscribe(self._wake)
            self._limits[key] = limit
            self._wake()  # the parts of the others changed
        return limit

    def limits(self) -> dict[str, int]:
        """Each deployment's in-flight limit now."""
        return {key: limit.limit for key, limit in self._limits.items()}

    @property
    def total_limit(self) -> int:
        """What the worker may have in flight now: its deployments' limits, within its total."""
        return min(self._parts.total, sum(self.limits().values()) or self._like.limit)

    async def acquire(self, key: str = ANY_MODEL) -> None:
        self.limit_of(key)
        # no waiter may start (each change of slots or limits wakes those that may), so one that may is first
        if self._parts.may_start(key, self.limits()):
            self._parts.start(key)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((key, waiter))
        try:
            await waiter  # _wake hands the slot over: it counts it in use before waking us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(key)  # granted, then cancelled before we resumed: give the slot back
            elif (key, waiter) in self._waiters:  # _wake may already have dropped it as done
                self._waiters.remove((key, waiter))
            raise

    def release(self, key: str = ANY_MODEL) -> None:
        if self._parts.in_use(key) <= 0:
            raise RuntimeError("AdaptiveGate released more often than acquired")
        self._parts.end(key)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            self._waiters = deque((key, waiter) for key, waiter in self._waiters if not waiter.done())
            index = self._parts.next_to_start([key for key, _ in self._waiters], self.limits())
            if index is None:
                return
            key, waiter = self._waiters[index]
            del self._waiters[index]
            self._parts.start(key)
            waiter.set_result(None)

    def slot(self, key: str = ANY_MODEL) -> _Slot:
        """``async with gate.slot(key)``: one of the deployment's slots for the block."""
        return _Slot(self, key)


class _Slot:
    def __init__(self, gate: AdaptiveGate, key: str) -> None:
        self._gate = gate
        self._key = key

    async def __aenter__(self) -> None:
        await self._gate.acquire(self._key)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._gate.release(self._key)


class GatedLayer:
    """Everything below (token wait, breaker check, call) runs inside one slot of the gate, the slot of the
    deployment ``deployment_of`` names for the body's model (a deployment key; by default the single endpoint)."""

    def __init__(self, inner: Layer[CallResult | Refused], gate: AdaptiveGate, clock: Callable[[], float],
                 deployment_of: Callable[[str], str] = lambda _: ANY_MODEL) -> None:
        self._inner = inner
        self._gate = gate
        self._clock = clock
        self._deployment_of = deployment_of

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
        key = self._deployment_of(body["model"])
        async with self._gate.slot(key):
            called = await self._inner.call(request, body, first)
            limit = self._gate.limit_of(key)
            probing = limit.probing
            if isinstance(called, CallResult) and isinstance(called.outcome, Success):
                limit.on_sample(called.latency_ms / 1000, self._gate.in_use_of(key), self._clock(),
                                called.outcome.completion_tokens)
            elif limit.probing:  # a call sent alone measures the server whatever its answer was
                if isinstance(called, CallResult):
                    limit.on_unsampled(called.latency_ms / 1000, self._clock(),
                                       billed_tokens(called.outcome, called.response_body)[1])
                else:
                    limit.on_unsampled(0.0, self._clock())
            if limit.probing != probing:
                self._tell_probe(key, limit)
            return called

    def _tell_probe(self, key: str, limit: GradientLimit) -> None:
        """A probe holds the deployment's calls back until its calls out drained: say so, and what it found."""
        of = "" if key == ANY_MODEL else f" of {key}"
        expires_at = limit.probe_expires_at
        if expires_at is not None:
            expires_in = max(0.0, expires_at - self._clock())
            log.info("in-flight limit%s: the first calls queued or stalled; holding new calls until the %d out have "
                     "answered, then timing one alone (for %.1f s at most)", of, self._gate.in_use_of(key), expires_in)
            asyncio.get_running_loop().call_later(expires_in, self._expire, key, limit)
        else:
            log.info("in-flight limit%s: probe ended, %s; baseline %.4f s per token, limit %d", of, limit.last_probe,
                     limit.baseline_s or 0.0, limit.limit)

    def _expire(self, key: str, limit: GradientLimit) -> None:
        if limit.probing:
            limit.on_probe_expired(self._clock())
            if not limit.probing:
                self._tell_probe(key, limit)
