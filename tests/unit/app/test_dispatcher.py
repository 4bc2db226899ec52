"""The dispatcher: at most ``limit`` works at once, acks released per lane only as a contiguous completed prefix."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable

import pytest

from streamproc.app.dispatcher import Dispatcher
from streamproc.app.handler import Disposition


async def settle(rounds: int = 20) -> None:
    """Let every runnable task run until it blocks again."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class Works:
    """Works that block until the test finishes them, and acks that record their order."""

    def __init__(self, ack_yields: bool = False) -> None:
        self.ack_yields = ack_yields
        self.gates: dict[tuple[Hashable, int], asyncio.Future[Disposition]] = {}
        self.started: list[tuple[Hashable, int]] = []
        self.acked: list[tuple[Hashable, int]] = []
        self.running = 0
        self.peak = 0

    def work(self, lane: Hashable, offset: int) -> Callable[[], Awaitable[Disposition]]:
        gate: asyncio.Future[Disposition] = asyncio.get_running_loop().create_future()
        self.gates[lane, offset] = gate

        async def run() -> Disposition:
            self.started.append((lane, offset))
            self.running += 1
            self.peak = max(self.peak, self.running)
            try:
                return await gate
            finally:
                self.running -= 1

        return run

    def ack(self, lane: Hashable, offset: int) -> Callable[[], Awaitable[object]]:
        async def run() -> None:
            if self.ack_yields:  # an ack that suspends must not let a later one overtake it
                await asyncio.sleep(0)
            self.acked.append((lane, offset))

        return run

    async def submit(self, dispatcher: Dispatcher, lane: Hashable, offset: int) -> None:
        await dispatcher.submit(lane, offset, self.work(lane, offset), self.ack(lane, offset))

    def finish(self, lane: Hashable, offset: int, disposition: Disposition = Disposition.ACK) -> None:
        self.gates[lane, offset].set_result(disposition)

    def acked_offsets(self, lane: Hashable) -> list[int]:
        return [offset for acked_lane, offset in self.acked if acked_lane == lane]


async def test_at_most_limit_works_run_at_once() -> None:
    dispatcher, works = Dispatcher(3), Works()

    async def feed() -> None:
        for offset in range(8):
            await works.submit(dispatcher, "p0", offset)

    feeder = asyncio.create_task(feed())
    await settle()
    assert works.started == [("p0", 0), ("p0", 1), ("p0", 2)]
    assert dispatcher.in_flight == 3
    assert not feeder.done()  # submit waits for a free slot: that is the back-pressure on the stream

    works.finish("p0", 1)
    await settle()
    assert works.started[-1] == ("p0", 3) and works.running == 3

    for offset in (0, 2, 3, 4, 5, 6, 7):
        works.finish("p0", offset)
        await settle()
        assert works.running <= 3
    await asyncio.wait_for(feeder, 1)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)
    assert works.peak == 3
    assert works.acked_offsets("p0") == list(range(8))


async def test_the_slots_are_full_while_every_slot_runs_a_work_and_free_again_once_one_ends() -> None:
    dispatcher, works = Dispatcher(2), Works()
    assert not dispatcher.slots_full
    await works.submit(dispatcher, "p0", 0)
    assert not dispatcher.slots_full
    await works.submit(dispatcher, "p0", 1)
    assert dispatcher.slots_full  # what the lower priorities' reading yields on (design §5.11)
    works.finish("p0", 0)
    await settle()
    assert not dispatcher.slots_full
    works.finish("p0", 1)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)


@pytest.mark.parametrize("ack_yields", [False, True])
async def test_acks_are_released_in_offset_order_even_when_works_finish_in_reverse(ack_yields: bool) -> None:
    dispatcher, works = Dispatcher(10), Works(ack_yields)
    for offset in range(10, 15):
        await works.submit(dispatcher, "p0", offset)

    for offset in (14, 13, 12, 11):
        works.finish("p0", offset)
        await settle()
        assert works.acked == [], f"acked before offset 10 finished (after {offset})"
        assert works.running == offset - 10  # the finished works freed their slots all the same

    works.finish("p0", 10)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)
    assert works.acked_offsets("p0") == [10, 11, 12, 13, 14]


@pytest.mark.parametrize("ack_yields", [False, True])
async def test_acks_released_by_different_works_never_interleave(ack_yields: bool) -> None:
    dispatcher, works = Dispatcher(10), Works(ack_yields)
    for offset in range(6):
        await works.submit(dispatcher, "p0", offset)
    for offset in (2, 1):
        works.finish("p0", offset)
    await settle()

    works.finish("p0", 0)  # releases 0, 1, 2 ...
    works.finish("p0", 3)  # ... and 3 finishes while they are being acked
    works.finish("p0", 5)
    works.finish("p0", 4)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)
    assert works.acked_offsets("p0") == [0, 1, 2, 3, 4, 5]


async def test_lanes_are_independent() -> None:
    dispatcher, works = Dispatcher(10), Works()
    await works.submit(dispatcher, ("t", 0), 0)
    for offset in (0, 1, 2):
        await works.submit(dispatcher, ("t", 1), offset)

    for offset in (2, 0, 1):
        works.finish(("t", 1), offset)
    await settle()
    assert works.acked_offsets(("t", 1)) == [0, 1, 2]
    assert works.acked_offsets(("t", 0)) == []  # still running

    works.finish(("t", 0), 0)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)
    assert works.acked_offsets(("t", 0)) == [0]


async def test_a_held_record_never_releases_its_ack_nor_any_later_one_in_its_lane() -> None:
    dispatcher, works = Dispatcher(10), Works()
    for offset in range(4):
        await works.submit(dispatcher, "p0", offset)
    await works.submit(dispatcher, "p1", 0)

    works.finish("p0", 1, Disposition.HOLD)
    for offset in (3, 2, 0):
        works.finish("p0", offset)
    works.finish("p1", 0)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)

    assert works.acked_offsets("p0") == [0]
    assert works.acked_offsets("p1") == [0]  # another lane goes on
    assert dispatcher.in_flight == 0  # the held work freed its slot

    await works.submit(dispatcher, "p0", 4)  # later records of the lane run, but stay unacked behind the hold
    works.finish("p0", 4)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)
    assert works.acked_offsets("p0") == [0]


async def test_a_work_that_raises_is_never_acked_and_frees_its_slot() -> None:
    dispatcher, works = Dispatcher(1), Works()

    async def broken() -> Disposition:
        raise RuntimeError("a handler bug")

    await dispatcher.submit("p0", 0, broken, works.ack("p0", 0))
    await asyncio.wait_for(dispatcher.wait_idle(), 1)
    await asyncio.wait_for(works.submit(dispatcher, "p0", 1), 1)  # the slot came back
    works.finish("p0", 1)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)
    assert works.acked == []  # not even offset 1: nothing is committed past an unexplained record


async def test_a_stuck_record_is_reported_never_silent() -> None:
    """A raising work (a failed requeue) or a held record stops its lane's commits for good: the owner hears
    of it, with the offset and why, so it can stop loudly instead of stalling the partition."""
    stuck: list[tuple[object, int, str]] = []
    dispatcher, works = Dispatcher(4, on_stuck=lambda lane, offset, why: stuck.append((lane, offset, why))), Works()

    async def broken() -> Disposition:
        raise ConnectionError("the broker refused the requeue")

    await dispatcher.submit("p0", 0, broken, works.ack("p0", 0))
    await works.submit(dispatcher, "p1", 7)
    works.finish("p1", 7, Disposition.HOLD)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)
    assert stuck == [("p0", 0, "ConnectionError: the broker refused the requeue"), ("p1", 7, "its handler holds it")]


async def test_wait_idle_returns_once_every_work_and_its_ack_are_done() -> None:
    dispatcher, works = Dispatcher(4), Works()
    await asyncio.wait_for(dispatcher.wait_idle(), 0.5)  # nothing submitted yet

    await works.submit(dispatcher, "p0", 0)
    await works.submit(dispatcher, "p0", 1)
    waiter = asyncio.create_task(dispatcher.wait_idle())
    works.finish("p0", 1)
    await settle()
    assert not waiter.done() and dispatcher.in_flight == 1

    works.finish("p0", 0)
    await asyncio.wait_for(waiter, 1)
    assert works.acked_offsets("p0") == [0, 1]
    assert dispatcher.in_flight == 0

    await works.submit(dispatcher, "p0", 2)  # busy again after having been idle
    again = asyncio.create_task(dispatcher.wait_idle())
    await settle()
    assert not again.done()
    works.finish("p0", 2)
    await asyncio.wait_for(again, 1)


async def test_a_rejected_submit_does_not_leak_a_slot() -> None:
    dispatcher, works = Dispatcher(1), Works()
    await works.submit(dispatcher, "p0", 5)
    works.finish("p0", 5)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)

    with pytest.raises(ValueError, match="tracked after offset 5"):
        await works.submit(dispatcher, "p0", 5)  # the same offset again in the same lane

    await asyncio.wait_for(works.submit(dispatcher, "p0", 6), 1)
    works.finish("p0", 6)
    await asyncio.wait_for(dispatcher.wait_idle(), 1)
    assert works.acked_offsets("p0") == [5, 6]


async def test_a_retired_lane_is_forgotten_after_its_acks() -> None:
    dispatcher, works = Dispatcher(4), Works()
    await works.submit(dispatcher, ("t", 1), 0)
    await works.submit(dispatcher, ("t", 2), 0)
    dispatcher.retire(("t", 1))
    assert dispatcher.lanes == 2  # its record still runs
    works.finish(("t", 1), 0)
    for _ in range(5):
        await asyncio.sleep(0)
    assert works.acked_offsets(("t", 1)) == [0]
    assert dispatcher.lanes == 1


async def test_a_record_waiting_for_its_due_time_holds_no_slot_nor_the_records_behind_it() -> None:
    dispatcher, works = Dispatcher(1, waiting_room=2), Works()
    due = asyncio.Event()
    await dispatcher.submit("t0", 0, works.work("t0", 0), works.ack("t0", 0), wait=due.wait)
    await asyncio.wait_for(works.submit(dispatcher, "t1", 0), 1)  # the only slot is free: it runs at once
    await settle()
    assert works.started == [("t1", 0)] and dispatcher.in_flight == 1  # the sleeper is not "in flight"
    works.finish("t1", 0)
    due.set()
    await settle()
    assert works.started == [("t1", 0), ("t0", 0)]  # due: it takes the slot and runs
    works.finish("t0", 0)
    await settle()
    assert works.acked == [("t1", 0), ("t0", 0)]


async def test_the_waiting_room_is_bounded_and_acks_stay_in_offset_order() -> None:
    dispatcher, works = Dispatcher(4, waiting_room=2), Works()
    later, sooner = asyncio.Event(), asyncio.Event()
    await dispatcher.submit("p", 0, works.work("p", 0), works.ack("p", 0), wait=later.wait)
    await dispatcher.submit("p", 1, works.work("p", 1), works.ack("p", 1), wait=sooner.wait)
    third = asyncio.create_task(dispatcher.submit("p", 2, works.work("p", 2), works.ack("p", 2),
                                                  wait=sooner.wait))
    await settle()
    assert not third.done()  # the room is full: the agent loop waits (backpressure)
    sooner.set()
    await settle()
    assert third.done() and ("p", 1) in works.started and ("p", 0) not in works.started  # 1 is not held up by 0
    works.finish("p", 1)
    works.finish("p", 2)
    await settle()
    assert works.acked == []  # offset 0 still sleeps: nothing behind it is acked
    later.set()
    await settle()
    works.finish("p", 0)
    await settle()
    assert works.acked_offsets("p") == [0, 1, 2]


async def test_a_record_parked_without_a_call_runs_while_every_slot_is_held_and_acks_in_order() -> None:
    dispatcher, works = Dispatcher(2, waiting_room=4), Works()
    await works.submit(dispatcher, "p0", 0)
    await works.submit(dispatcher, "p0", 1)  # both slots held by calls
    await asyncio.wait_for(dispatcher.submit("p0", 2, works.work("p0", 2), works.ack("p0", 2), call=False), 1)
    await settle()
    assert ("p0", 2) in works.started  # a park is a send: it needs no call slot
    works.finish("p0", 2)
    await settle()
    assert works.acked == [] and dispatcher.in_flight == 2  # ordered: behind the calls still running
    works.finish("p0", 0)
    works.finish("p0", 1)
    await settle()
    assert works.acked_offsets("p0") == [0, 1, 2]
