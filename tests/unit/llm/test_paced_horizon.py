"""The paced layer reserves in turn and only a short horizon ahead: a new share, a cut of the pace or a pause
reaches every call not yet due within it. Time is virtual: sleeps wake in order of their end, nothing else
moves the clock."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.rate_limits import RateLimiter, RateLimits
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.llm.client import CallResult
from streamproc.llm.layer import Refused
from streamproc.llm.paced import HORIZON_S, RateLimitedLayer
from tests.unit.llm.test_guard_layers import BODY, OK, REQUEST


@dataclass
class VirtualTime:
    """A clock and a sleep: :meth:`run` lets the tasks run until all sleep, then wakes the earliest sleeper."""

    now: float = 0.0
    _sleepers: list[tuple[float, int, asyncio.Future[None]]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        woken = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + max(0.0, seconds), next(self._order), woken))
        await woken

    async def run(self, *coroutines: Coroutine[Any, Any, Any]) -> None:
        tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
        while not all(task.done() for task in tasks):
            for _ in range(20):  # until every task sleeps or waits for one that does
                await asyncio.sleep(0)
            if self._sleepers:
                self.now, _, woken = heapq.heappop(self._sleepers)
                woken.set_result(None)
        for task in tasks:
            task.result()


@dataclass
class Sends:
    """The HTTP caller: answers OK and notes when each call was sent."""

    clock: VirtualTime
    at: list[float] = field(default_factory=list)

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool = True) -> CallResult | Refused:
        self.at.append(self.clock.now)
        return OK


async def test_a_smaller_share_reaches_the_calls_already_waiting() -> None:
    time = VirtualTime()
    limiter = RateLimiter(RateLimits(rpm=60), share=1.0)  # 1 call/s, a burst of one
    sends = Sends(time)
    layer = RateLimitedLayer(sends, limiter, TokenEstimator(), time, time.sleep)

    async def halve_at(at: float) -> None:
        await time.sleep(at)
        limiter.set_shares({}, 0.5, time.now)

    await time.run(*(layer.call(REQUEST, BODY, True) for _ in range(8)), halve_at(2.25))
    # before the change one a second; after it, one every two seconds for all but the call due within the horizon
    assert sends.at[:3] == pytest.approx([0.0, 1.0, 2.0])
    assert sends.at[3] == pytest.approx(3.0)  # it had reserved: due within the horizon when the share changed
    # what it owed at the old pace (0.75 of a call) is owed at the new one, then one every two seconds
    assert sends.at[4] == pytest.approx(2.25 + 0.75 / 0.5 + 2.0)
    gaps = [later - earlier for earlier, later in zip(sends.at[4:], sends.at[5:], strict=False)]
    assert gaps == pytest.approx([2.0] * len(gaps))
    assert HORIZON_S < 1.0  # (so only that one call kept the old pace)


async def test_calls_waiting_to_reserve_count_in_the_demand_the_fleet_reads() -> None:
    time = VirtualTime()
    limiter = RateLimiter(RateLimits(rpm=60), share=1.0)
    layer = RateLimitedLayer(Sends(time), limiter, TokenEstimator(), time, time.sleep)
    seen: list[float] = []

    async def look_at(at: float) -> None:
        await time.sleep(at)
        seen.append(limiter.waiting_by_model(time.now)["big"].calls)

    await time.run(*(layer.call(REQUEST, BODY, True) for _ in range(6)), look_at(0.1))
    assert seen[0] == pytest.approx(5 - 0.1, abs=0.2)  # five behind the first: one reserved, four queued


async def test_calls_waiting_their_turn_give_way_when_a_rebalance_begins() -> None:
    time = VirtualTime()
    limiter = RateLimiter(RateLimits(rpm=60), share=1.0)  # 1 call/s: eight calls take eight seconds
    sends = Sends(time)
    rebalancing = False
    layer = RateLimitedLayer(sends, limiter, TokenEstimator(), time, time.sleep, giving_way=lambda: rebalancing)
    answers: list[CallResult | Refused] = []

    async def one() -> None:
        answers.append(await layer.call(REQUEST, BODY, True))

    async def rebalance_at(at: float) -> None:
        nonlocal rebalancing
        await time.sleep(at)
        rebalancing = True

    await time.run(*(one() for _ in range(8)), rebalance_at(2.25))
    # the calls sent before it answered; the others were not sent and gave way: those waiting to reserve at once,
    # the one that had reserved within the horizon once its wait ended
    sent = [answer for answer in answers if isinstance(answer, CallResult)]
    gave_way = [answer for answer in answers if isinstance(answer, Refused)]
    assert sends.at == pytest.approx([0.0, 1.0, 2.0])
    assert len(sent) == 3 and len(gave_way) == 5
    assert all(answer.gave_way for answer in gave_way)
    assert time.now <= 2.25 + 2 * HORIZON_S + 1e-9
    assert limiter.waiting_by_model(time.now)["big"].calls == 0  # nothing left counted as waiting
