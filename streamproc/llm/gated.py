"""The adaptive in-flight gate (an asyncio semaphore per deployment whose size follows the core's gradient limit,
within the worker's total), and the layer that holds one of its slots around the rest of the call and feeds the
latency back.

A server that queues sees fewer concurrent calls: every answered call's latency (per completion token)
feeds its deployment's gradient limit; 429 congestion reaches it from the rate-limit layer below. Each
deployment of the model list has its own limit, so a slow replica's latency does not cut a fast one's, and a
hung one holds no more than its own slots (design §5.10); the single endpoint is one deployment, one limit.
Long calls (:mod:`streamproc.core.guards.long_requests`) hold at most a share of a deployment's slots while
short calls are about, and their latency feeds the limit only when no short call does. Among the waiting calls that
may start, the next is the request's tenant's turn by priority and weighted fair share
(:class:`streamproc.core.tenant_share.FairChoice`, design §5.11); a tenant at its RPM/TPM quota
(:class:`streamproc.core.tenant_pace.TenantPace`) has none that may start until its quota refills. A call of a lower
priority also lets more urgent calls still on their way to the gate (``yields``: read and not yet here) go first,
for :data:`YIELD_S` at most.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.gradient import GradientLimit
from streamproc.core.guards.in_flight_parts import InFlightParts
from streamproc.core.guards.long_requests import NO_POOL, LongPool, LongRequests
from streamproc.core.model_list import ANY_MODEL
from streamproc.core.outcome import Success
from streamproc.core.tenancy import DEFAULT_TENANCY, Tenancy
from streamproc.core.tenant_pace import TenantPace
from streamproc.core.tenant_share import BoundedYield, Contender, FairChoice
from streamproc.llm.client import CallResult
from streamproc.llm.completion import billed_tokens
from streamproc.llm.layer import Layer, Refused

log = logging.getLogger(__name__)

# at most this long (from its first yield) a waiting call lets more urgent calls on their way go first: longer than a
# burst of them takes to reach the gate through the dispatcher's slots, short of FairChoice's ageing
YIELD_S = 10.0
_YIELD_POLL_S = 0.1  # how soon the gate looks again while a call yields (nothing else wakes it when they arrive)


class AdaptiveGate:
    """Slots for the calls in flight: each deployment's own, as many as its GradientLimit says, all within the
    worker's total and each deployment sure of its part of it (:mod:`streamproc.core.guards.in_flight_parts`).
    It is async but does no I/O.

    ``limit`` is the limit of the first deployment called (the single endpoint's, its only one); every other
    deployment gets a new limit like it, learnt from its own calls. When a limit shrinks, running holders
    finish undisturbed and newcomers wait. A deployment at its limit holds back only its own calls, and long calls
    at their share only long calls; among the waiters that may start, ``fair`` picks (first come, first served
    within a tenant of one priority).
    """

    def __init__(self, limit: GradientLimit, total: int | None = None, long_requests: LongRequests = NO_POOL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._first: GradientLimit | None = limit
        self._like = limit
        self._parts = InFlightParts(total if total is not None else limit.maximum)
        self.pool = LongPool(long_requests)
        self._clock = clock
        self._limits: dict[str, GradientLimit] = {}  # deployment key -> its limit (bounded by the model list)
        self._waiters: deque[tuple[_Waiting, asyncio.Future[None]]] = deque()
        self._quiet_timer: asyncio.TimerHandle | None = None  # wakes long calls once short ones are quiet
        self._pace_timer: asyncio.TimerHandle | None = None  # wakes the calls of tenants at their quota once it refills
        self._yield_timer: asyncio.TimerHandle | None = None  # wakes the calls that yield once the urgent ones came
        self.fair = FairChoice()
        self.pace = TenantPace({})
        self.yields: Callable[[str], bool] = lambda _priority: False  # more urgent calls than this priority's coming

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

    async def acquire(self, key: str = ANY_MODEL, long: bool = False, tenancy: Tenancy = DEFAULT_TENANCY,
                      tokens: int = 0) -> None:
        self.limit_of(key)
        now = self._clock()
        waiting = _Waiting(key, long, Contender(tenancy.tenant, tenancy.priority, now), tokens)
        # no waiter may start (each change of slots or limits wakes those that may), so one that may is first
        if self._may_start(waiting, now, self._short_waiting()):
            self.fair.pick([waiting.contender], now)  # counted, so a tenant's uncontended starts are its share too
            self._start(waiting)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((waiting, waiter))
        self._wake_when_paced(now)
        if not long:
            self.pool.saw_short_waiting(key, self._clock())
        try:
            await waiter  # _wake hands the slot over: it counts it in use before waking us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(key, long)  # granted, then cancelled before we resumed: give the slot back
            elif (waiting, waiter) in self._waiters:  # _wake may already have dropped it as done
                self._waiters.remove((waiting, waiter))
            raise

    def release(self, key: str = ANY_MODEL, long: bool = False) -> None:
        if self._parts.in_use(key) <= 0:
            raise RuntimeError("AdaptiveGate released more often than acquired")
        self._parts.end(key)
        self.pool.end(key, long, self._clock())
        if not long and self.pool.policy.threshold_tokens > 0:  # long calls held back may go once shorts are quiet
            if self._quiet_timer is not None:
                self._quiet_timer.cancel()
            self._quiet_timer = asyncio.get_running_loop().call_later(self.pool.policy.quiet_s, self._wake)
        self._wake()

    def _may_start(self, waiting: _Waiting, now: float, short_waiting: set[str]) -> bool:
        limits = self.limits()
        return (self.pace.wait_s(waiting.contender.tenant, waiting.tokens, now) == 0
                and self._parts.may_start(waiting.key, limits)
                and self.pool.may_start(waiting.key, waiting.long, limits[waiting.key], now,
                                        waiting.key in short_waiting)
                and not self._yielding(waiting, now))  # last: only a call that could start yields

    def _start(self, waiting: _Waiting) -> None:
        self._parts.start(waiting.key)
        now = self._clock()
        self.pool.start(waiting.key, waiting.long, now)
        self.pace.start(waiting.contender.tenant, waiting.tokens, now)

    def _wake(self) -> None:
        while self._waiters:
            self._waiters = deque((waiting, waiter) for waiting, waiter in self._waiters if not waiter.done())
            now, short_waiting = self._clock(), self._short_waiting()
            may = [i for i, (waiting, _) in enumerate(self._waiters) if self._may_start(waiting, now, short_waiting)]
            if not may:
                self._wake_when_paced(now)
                return
            index = may[self.fair.pick([self._waiters[i][0].contender for i in may], now)]
            waiting, waiter = self._waiters[index]
            del self._waiters[index]
            self._start(waiting)
            waiter.set_result(None)

    def _yielding(self, waiting: _Waiting, now: float) -> bool:
        """Whether the call lets more urgent calls on their way go first (for :data:`YIELD_S` from its first yield);
        the gate then looks again soon."""
        if not (self.yields(waiting.contender.priority) and waiting.yielding.still(now)):
            return False
        if self._yield_timer is None or self._yield_timer.when() <= asyncio.get_running_loop().time():
            self._yield_timer = asyncio.get_running_loop().call_later(_YIELD_POLL_S, self._wake)
        return True

    def _wake_when_paced(self, now: float) -> None:
        """Wake the waiters when the first tenant held at its quota may start again (nothing else would)."""
        if not self.pace:
            return
        waits = [wait for waiting, waiter in self._waiters if not waiter.done()
                 if (wait := self.pace.wait_s(waiting.contender.tenant, waiting.tokens, now)) > 0]
        if waits:
            if self._pace_timer is not None:
                self._pace_timer.cancel()
            self._pace_timer = asyncio.get_running_loop().call_later(min(waits), self._wake)

    def _short_waiting(self) -> set[str]:
        """The deployments with a short call waiting (each holds its long calls to their share)."""
        return {waiting.key for waiting, waiter in self._waiters if not waiting.long and not waiter.done()}

    def slot(self, key: str = ANY_MODEL, long: bool = False, tenancy: Tenancy = DEFAULT_TENANCY,
             tokens: int = 0) -> _Slot:
        """``async with gate.slot(key)``: one of the deployment's slots for the block (``long``: of its pool), for
        a request of ``tenancy`` estimated at ``tokens``."""
        return _Slot(self, key, long, tenancy, tokens)


@dataclass(eq=False)
class _Waiting:
    key: str  # the deployment
    long: bool  # the call is long (core.guards.long_requests)
    contender: Contender  # whose call, how urgent, waiting since
    tokens: int = 0  # its estimate (prompt + completion budget), for its tenant's TPM quota
    yielding: BoundedYield = field(default_factory=lambda: BoundedYield(YIELD_S))  # to more urgent calls on their way


class _Slot:
    def __init__(self, gate: AdaptiveGate, key: str, long: bool, tenancy: Tenancy, tokens: int) -> None:
        self._gate = gate
        self._key = key
        self._long = long
        self._tenancy = tenancy
        self._tokens = tokens

    async def __aenter__(self) -> None:
        await self._gate.acquire(self._key, self._long, self._tenancy, self._tokens)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._gate.release(self._key, self._long)


class GatedLayer:
    """Everything below (token wait, breaker check, call) runs inside one slot of the gate, the slot of the
    deployment ``deployment_of`` names for the body's model (a deployment key; by default the single endpoint).
    ``cost``: a body's token estimate, for the tenants' TPM quotas."""

    def __init__(self, inner: Layer[CallResult | Refused], gate: AdaptiveGate, clock: Callable[[], float],
                 deployment_of: Callable[[str], str] = lambda _: ANY_MODEL,
                 cost: Callable[[dict[str, Any]], int] = lambda _: 0) -> None:
        self._inner = inner
        self._gate = gate
        self._clock = clock
        self._deployment_of = deployment_of
        self._cost = cost

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
        key = self._deployment_of(body["model"])
        long = self._gate.pool.policy.is_long(body)
        tokens = self._cost(body) if self._gate.pace else 0
        async with self._gate.slot(key, long, Tenancy(request.tenant, request.priority), tokens):
            called = await self._inner.call(request, body, first)
            limit = self._gate.limit_of(key)
            probing = limit.probing
            # a long generation is no queue signal while short calls measure the server; alone, it is the only one
            measures = not long or probing or not self._gate.pool.shorts_about(key, self._clock())
            if measures and isinstance(called, CallResult) and isinstance(called.outcome, Success):
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
