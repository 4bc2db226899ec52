"""Each tenant's records in a worker's hand against its quota: taken, waiting in memory, or to be parked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streamproc.app.tenant_hand import LINGER_S, TenantHand, load_tenants, scheduled_lane, scheduled_tenant
from streamproc.core.guards.long_requests import NO_POOL, SIZE_HEADER, LongRequests
from streamproc.core.tenant_share import TenantWeights

a_normal, b_normal = ("a", "normal"), ("b", "normal")


def test_a_tenant_alone_takes_the_whole_hand_then_waits_within_its_read_ahead_then_parks() -> None:
    hand = TenantHand(hand=4, read_ahead=2)
    assert [hand.may_take(a_normal) for _ in range(5)] == [True, True, True, True, False]
    assert [hand.may_wait(a_normal) for _ in range(3)] == [True, True, False]  # the third is parked


async def test_a_second_tenant_gets_its_share_before_the_flood_waiting_ahead_of_it() -> None:
    hand = TenantHand(hand=4, read_ahead=8)
    for _ in range(4):
        assert hand.may_take(a_normal)
    assert hand.may_wait(a_normal)
    flood = asyncio.create_task(hand.wait_to_take(a_normal, lambda: False))
    assert hand.may_take(b_normal)  # b holds nothing: its quota is half the hand
    assert not hand.may_take(a_normal)  # a has a record waiting: its own go first
    for _ in range(2):
        hand.give_back(a_normal)
    await asyncio.sleep(0.05)
    assert not flood.done()  # a holds 2 of a quota of 2 now that b holds one
    hand.give_back(a_normal)
    assert await asyncio.wait_for(flood, 1) is True
    assert hand.held() == {"a": 2, "b": 1}


async def test_a_waiter_gives_up_when_the_worker_gives_its_records_back() -> None:
    hand = TenantHand(hand=1, read_ahead=4)
    assert hand.may_take(a_normal) and hand.may_wait(a_normal)
    assert await asyncio.wait_for(hand.wait_to_take(a_normal, lambda: True), 1) is False
    assert hand.may_wait(a_normal)  # its waiting place was given back


def test_weights_share_the_hand() -> None:
    hand = TenantHand(hand=8, read_ahead=8, weights=TenantWeights({"a": 3.0}))
    assert hand.may_take(b_normal)
    assert sum(hand.may_take(a_normal) for _ in range(8)) == 6  # 8 * 3/4


def test_the_scheduled_tenant_comes_from_the_header_alone() -> None:
    assert scheduled_tenant({"x-tenant": b"team-a"}) == "team-a"
    assert scheduled_tenant({}) == "default"
    assert scheduled_tenant({"x-tenant": b"bad name"}) == "default"  # the handler refuses it; scheduling does not


def test_the_scheduled_lane_adds_the_priority_header() -> None:
    assert scheduled_lane({"x-tenant": b"team-a", "x-priority": b"high"}) == ("team-a", "high")
    assert scheduled_lane({"x-tenant": b"team-a"}) == ("team-a", "normal")
    assert scheduled_lane({"x-priority": b"urgent"}) == ("default", "normal")


async def test_a_high_record_reaches_past_its_own_tenants_low_flood() -> None:
    hand = TenantHand(hand=4, read_ahead=2)
    a_low, a_high = ("a", "low"), ("a", "high")
    assert [hand.may_take(a_low) for _ in range(5)] == [True, True, True, True, False]
    assert [hand.may_wait(a_low) for _ in range(3)] == [True, True, False]  # the flood's excess is parked
    assert hand.may_take(a_high)  # the low records in hand do not count against it
    flood = asyncio.create_task(hand.wait_to_take(a_low, lambda: False))
    hand.give_back(a_low)
    await asyncio.sleep(0.05)
    assert not flood.done()  # the low record yields: a holds 3 low and 1 high of its 4
    assert [hand.may_take(a_high) for _ in range(4)] == [True, True, True, False]  # a's whole hand, then waits
    assert hand.may_wait(a_high)  # high waits in memory though low's read-ahead is full
    for _ in range(3):
        hand.give_back(a_low)
    await asyncio.sleep(0.05)
    assert not flood.done()  # 4 high in hand: low waits until they end
    hand.give_back(a_high)
    await asyncio.sleep(0.05)
    assert not flood.done()  # the high record waiting goes first: low yields to it
    assert await asyncio.wait_for(hand.wait_to_take(a_high, lambda: False), 1) is True
    for _ in range(4):
        hand.give_back(a_high)
    assert await asyncio.wait_for(flood, 1) is True  # the high ones ended: low gets the hand again


def test_a_bad_tenants_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text('team-a = 2\n')
    assert load_tenants(path).weights.of("team-a") == 2.0
    path.write_text('team-a = "x"\n')
    with pytest.raises(ValueError, match=r"STREAMPROC_TENANTS_FILE .*tenants.toml: the weight of 'team-a'"):
        load_tenants(path)
    with pytest.raises(ValueError, match="No such file"):
        load_tenants(tmp_path / "missing.json")


def test_a_tenant_held_back_at_its_rate_quota_takes_nothing_and_leaves_the_hand_to_the_others() -> None:
    held_back = {"a"}
    hand = TenantHand(hand=8, read_ahead=8, held_back=lambda tenant: tenant in held_back)
    held_back.clear()
    assert hand.may_take(a_normal) and hand.may_take(a_normal)  # two of a's calls are in hand when its quota runs out
    held_back.add("a")
    assert not hand.may_take(a_normal)
    assert hand.may_wait(a_normal)  # its record waits in memory, as for fair share
    assert sum(hand.may_take(b_normal) for _ in range(8)) == 8  # not 4: a's records do not count against b's part


async def test_the_priorities_present_are_those_of_the_records_in_hand_or_waiting_of_any_tenant() -> None:
    hand = TenantHand(hand=1, read_ahead=4)
    assert hand.priorities_present() == set()
    assert hand.may_take(("a", "low"))
    assert hand.may_wait(("b", "high"))
    assert hand.priorities_present() == {"low", "high"}
    hand.stop_waiting(("b", "high"))
    waking = asyncio.create_task(hand.changed(timeout_s=5))
    await asyncio.sleep(0)
    hand.give_back(("a", "low"))
    await asyncio.wait_for(waking, 1)  # woken by the record given back, long before its timeout
    assert hand.priorities_present() == set()


async def test_a_waiting_record_leaves_a_freed_place_to_more_urgent_records_still_arriving_for_a_bounded_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    arriving = {"high"}  # records more urgent than these priorities have not reached their agent
    urgent = {"high": (), "normal": ("high",), "low": ("high", "normal")}
    hand = TenantHand(hand=1, read_ahead=4,
                      arriving=lambda priority: any(other in arriving for other in urgent[priority]))
    a_low = ("a", "low")
    assert hand.may_take(a_low)
    assert hand.may_wait(a_low)
    waiter = asyncio.create_task(hand.wait_to_take(a_low, lambda: False))
    hand.give_back(a_low)
    await asyncio.sleep(0.3)
    assert not waiter.done()  # the place is free, but high records are on their way to it
    arriving.clear()
    assert await asyncio.wait_for(waiter, 1) is True
    hand.give_back(a_low)

    monkeypatch.setattr("streamproc.app.tenant_hand.ARRIVING_YIELD_S", 0.3)
    arriving.add("high")  # a high partition left unread (its agent stuck) holds the low ones back no longer than that
    assert hand.may_wait(a_low)
    assert await asyncio.wait_for(hand.wait_to_take(a_low, lambda: False), 2) is True


POOL = LongRequests(threshold_tokens=2000, share=0.25, quiet_s=2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_long_records_hold_their_share_of_the_hand_so_short_ones_behind_them_are_taken() -> None:
    clock = Clock()
    hand = TenantHand(hand=8, read_ahead=8, long_requests=POOL, clock=clock)
    assert hand.may_take(a_normal)  # a short record in hand: the long ones get 2 of the 8 places
    assert [hand.may_take(a_normal, long=True) for _ in range(3)] == [True, True, False]
    assert hand.may_wait(a_normal, long=True)
    waiting = asyncio.create_task(hand.wait_to_take(a_normal, lambda: False, long=True))
    # the long record waiting is no record of the short ones' class: they are taken past it
    assert [hand.may_take(a_normal) for _ in range(5)] == [True] * 5
    hand.give_back(a_normal, long=True)
    assert await asyncio.wait_for(waiting, 1) is True
    assert hand.held() == {"a": 8}


async def test_with_no_short_record_about_long_records_take_the_whole_hand() -> None:
    clock = Clock()
    hand = TenantHand(hand=8, read_ahead=8, long_requests=POOL, clock=clock)
    assert hand.may_take(a_normal)
    assert [hand.may_take(a_normal, long=True) for _ in range(2)] == [True, True]
    assert hand.may_wait(a_normal, long=True)
    waiting = asyncio.create_task(hand.wait_to_take(a_normal, lambda: False, long=True))
    hand.give_back(a_normal)  # the last short record ends: long ones wait out the pool's quiet time
    await asyncio.sleep(0.3)
    assert not waiting.done()
    clock.now += POOL.quiet_s
    assert await asyncio.wait_for(waiting, 1) is True
    assert [hand.may_take(a_normal, long=True) for _ in range(6)] == [True] * 5 + [False]  # the hand is full


def test_without_a_pool_every_record_is_short() -> None:
    hand = TenantHand(hand=4, read_ahead=0)
    assert [hand.may_take(a_normal, long=True) for _ in range(5)] == [True] * 4 + [False]
    assert not NO_POOL.is_long_record({SIZE_HEADER: b"999999"})


def test_a_record_is_long_by_its_size_header_and_a_bad_header_is_short() -> None:
    assert POOL.is_long_record({SIZE_HEADER: b"2001"})
    assert not POOL.is_long_record({SIZE_HEADER: b"2000"})
    assert not POOL.is_long_record({})
    assert not POOL.is_long_record({SIZE_HEADER: b"-5"})
    assert not POOL.is_long_record({SIZE_HEADER: b"9" * 40})  # no giant int from a hostile producer


async def test_a_long_record_held_by_the_pool_does_not_hold_back_a_less_urgent_lane() -> None:
    hand = TenantHand(hand=8, read_ahead=8, long_requests=POOL, clock=Clock())
    a_high, a_low = ("a", "high"), ("a", "low")
    assert hand.may_take(a_low)
    assert [hand.may_take(a_high, long=True) for _ in range(3)] == [True, True, False]
    assert hand.may_wait(a_high, long=True)
    waiting = asyncio.create_task(hand.wait_to_take(a_high, lambda: False, long=True))
    assert hand.may_take(a_low)  # the high record waits for the long share only, not for room a low one takes
    waiting.cancel()


def test_a_tenant_that_just_gave_its_last_record_back_keeps_its_share_for_a_moment() -> None:
    """Its agent's next record is on its way: the flood waiting in memory must not take every place meanwhile."""
    now = [0.0]
    hand = TenantHand(hand=4, read_ahead=8, clock=lambda: now[0])
    assert hand.may_take(b_normal) and hand.may_take(a_normal) and hand.may_take(a_normal)
    hand.give_back(b_normal)  # b holds none now
    assert not hand.may_take(a_normal)  # a holds 2 of its half: b lingers
    now[0] += LINGER_S
    assert hand.may_take(a_normal) and hand.may_take(a_normal)  # b gone: a takes the whole hand (work-conserving)
