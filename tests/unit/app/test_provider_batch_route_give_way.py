"""A rebalance or a stop while calls wait for provider batch lines (design §5.7, §8): faust waits for every record
in hand before it goes on, so the waiting calls give way (deferred, ``rebalancing``: the handler parks them) and the
worker stops following; whoever reads the parked records next takes the batches over and gets their lines."""

from __future__ import annotations

import asyncio

import pytest

from streamproc.core.request_state import REBALANCING
from streamproc.llm.routed import Deferred
from tests.unit.app.provider_batch_route_rig import REFUSED, TAKEN_OVER, Rig


async def test_calls_waiting_for_lines_give_way_and_the_batch_is_taken_over_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, TAKEN_OVER)
    waiting = [asyncio.create_task(rig.raw_call(member, 1)) for member in ("r1", "r2")]
    await asyncio.sleep(0.05)
    assert rig.polls == ["batch_1"]
    rig.giving_way = True
    gave_way = await asyncio.gather(*waiting)  # within a tick, not when the lines come
    assert all(isinstance(d, Deferred) and d.code == REBALANCING and d.delay_s == 0 for d in gave_way)
    assert await rig.raw_call("r1", 1) == gave_way[0]  # a call during the rebalance gives way at once
    rig.giving_way = False
    rig.lines_due.set()
    # the parked records read again (here, by this worker): the batch is taken over again and answers them
    assert await rig.answered("r1", 1) == REFUSED
    assert await rig.answered("r2", 1) == REFUSED
    await rig.ended_and_tombstoned("g-1")
    assert rig.polls == ["batch_1", "batch_1"] and rig.api.submitted == []
    await rig.route.aclose()


async def test_a_gathered_request_not_sent_yet_gives_way_too(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, max_age_ms=60_000)  # its gather is not sealed before the rebalance
    waiting = asyncio.create_task(rig.raw_call("new", 1))
    await asyncio.sleep(0.05)
    rig.giving_way = True
    gave_way = await waiting
    assert isinstance(gave_way, Deferred) and gave_way.code == REBALANCING
    await asyncio.sleep(0.3)
    assert rig.api.submitted == [] and rig.log.written == []  # its gather was dropped, never sent
    await rig.route.aclose()
