"""The in-flight gate: an asyncio semaphore that follows the AIMD limit."""

from __future__ import annotations

import asyncio

import pytest

from streamproc.core.guards.gradient import GradientLimit
from streamproc.core.guards.long_requests import LongRequests
from streamproc.core.tenancy import Tenancy
from streamproc.core.tenant_pace import TenantPace
from streamproc.core.tenants_file import TenantQuota
from streamproc.llm.gated import YIELD_S, AdaptiveGate


async def settle(rounds: int = 10) -> None:
    """Let every runnable task run until it blocks again."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def grow(limit: GradientLimit, successes: int, latency_s: float = 0.1, now: float = 0.0) -> None:
    """A window of answers at steady latency with every slot used: slow start doubles the limit."""
    for _ in range(successes):
        limit.on_sample(latency_s, limit.limit, now)


async def test_the_gate_admits_up_to_the_limit_then_queues() -> None:
    gate = AdaptiveGate(GradientLimit(1, 10, initial=2))
    await gate.acquire()
    await gate.acquire()
    third = asyncio.create_task(gate.acquire())
    await settle()
    assert not third.done()
    assert (gate.in_use, gate.waiting) == (2, 1)
    gate.release()
    await asyncio.wait_for(third, 1)
    assert (gate.in_use, gate.waiting) == (2, 0)


async def test_waiters_are_woken_first_come_first_served() -> None:
    gate = AdaptiveGate(GradientLimit(1, 10, initial=1))
    await gate.acquire()
    order: list[int] = []

    async def take(n: int) -> None:
        await gate.acquire()
        order.append(n)

    tasks = [asyncio.create_task(take(n)) for n in range(4)]
    await settle()
    for _ in range(4):
        gate.release()
        await settle()
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert order == [0, 1, 2, 3]


async def test_a_newcomer_does_not_overtake_a_waiter() -> None:
    limit = GradientLimit(1, 10, initial=1, cooldown_s=0.0)
    gate = AdaptiveGate(limit)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    await settle()
    gate.release()  # the slot is handed to the waiter, not left for whoever comes next
    newcomer = asyncio.create_task(gate.acquire())
    await settle()
    assert waiter.done()
    assert not newcomer.done()
    newcomer.cancel()
    await settle()
    assert gate.waiting == 0


async def test_shrinking_does_not_interrupt_holders_but_holds_back_newcomers() -> None:
    limit = GradientLimit(1, 10, initial=4, backoff=0.5, cooldown_s=0.0)
    gate = AdaptiveGate(limit)
    for _ in range(4):
        await gate.acquire()
    limit.on_congestion(0.0)
    assert limit.limit == 2
    assert gate.in_use == 4
    waiter = asyncio.create_task(gate.acquire())
    gate.release()
    gate.release()  # in_use 2: still not below the limit
    await settle()
    assert not waiter.done()
    gate.release()  # in_use 1 < 2
    await asyncio.wait_for(waiter, 1)
    assert gate.in_use == 2


async def test_growing_wakes_waiters_without_a_release() -> None:
    limit = GradientLimit(1, 3, initial=1, window=1)
    gate = AdaptiveGate(limit)
    await gate.acquire()
    waiters = [asyncio.create_task(gate.acquire()) for _ in range(3)]
    await settle()
    assert not any(w.done() for w in waiters)
    limit.on_sample(0.1, 1, 0.0)  # the first window sets the level
    limit.on_sample(0.1, 1, 0.0)  # the second grows it: 1 -> 3 (x4, capped at the maximum)
    await settle()
    assert [w.done() for w in waiters] == [True, True, False]
    assert gate.in_use == 3
    waiters[2].cancel()
    await settle()
    assert gate.in_use == 3


async def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot() -> None:
    gate = AdaptiveGate(GradientLimit(1, 10, initial=1))
    await gate.acquire()
    cancelled = asyncio.create_task(gate.acquire())
    behind = asyncio.create_task(gate.acquire())
    await settle()
    cancelled.cancel()
    await settle()
    assert cancelled.cancelled()
    assert gate.waiting == 1
    gate.release()
    await asyncio.wait_for(behind, 1)
    assert gate.in_use == 1


async def test_a_waiter_cancelled_after_being_granted_gives_the_slot_back() -> None:
    gate = AdaptiveGate(GradientLimit(1, 10, initial=1))
    await gate.acquire()
    granted = asyncio.create_task(gate.acquire())
    behind = asyncio.create_task(gate.acquire())
    await settle()
    gate.release()  # hands the slot to `granted`...
    granted.cancel()  # ...which is cancelled before it could resume
    await settle()
    assert granted.cancelled()
    await asyncio.wait_for(behind, 1)  # the slot went on to the next waiter
    assert gate.in_use == 1
    gate.release()
    assert gate.in_use == 0


async def test_a_waiter_cancelled_while_a_release_drops_it_does_not_fail() -> None:
    gate = AdaptiveGate(GradientLimit(1, 10, initial=1))
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    await settle()
    waiter.cancel()  # its future is cancelled now; the task runs its cleanup later
    gate.release()  # drops the cancelled future from the queue before the cleanup runs
    await settle()
    assert waiter.cancelled()
    assert (gate.in_use, gate.waiting) == (0, 0)


async def test_async_with_releases_even_on_error() -> None:
    gate = AdaptiveGate(GradientLimit(1, 10, initial=1))
    with pytest.raises(RuntimeError, match="boom"):
        async with gate.slot():
            assert gate.in_use == 1
            raise RuntimeError("boom")
    assert gate.in_use == 0


async def test_releasing_more_than_acquired_is_an_error() -> None:
    gate = AdaptiveGate(GradientLimit(1, 10))
    with pytest.raises(RuntimeError):
        gate.release()
    assert gate.in_use == 0


async def test_many_tasks_run_concurrently_within_the_maximum_and_all_finish() -> None:
    limit = GradientLimit(1, 8, initial=4, backoff=0.5, cooldown_s=0.0)
    gate = AdaptiveGate(limit)
    running = 0
    peak = 0
    done = 0

    async def work(n: int) -> None:
        nonlocal running, peak, done
        async with gate.slot():
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0)
            if n % 5 == 0:
                limit.on_congestion(0.0)
            else:
                limit.on_sample(0.01, gate.in_use, 0.0)
            running -= 1
            done += 1

    await asyncio.wait_for(asyncio.gather(*(work(n) for n in range(200))), 5)
    assert done == 200
    assert (gate.in_use, gate.waiting) == (0, 0)
    assert 1 < peak <= 8


async def test_each_deployment_has_its_own_limit_and_a_full_one_holds_back_only_its_own_calls() -> None:
    limit = GradientLimit(1, 10, initial=2, window=1, backoff=0.5, cooldown_s=0.0)
    gate = AdaptiveGate(limit)
    await gate.acquire("m@1")  # hung: they never give their slots back
    await gate.acquire("m@1")
    held = asyncio.create_task(gate.acquire("m@1"))
    await settle()
    assert not held.done()
    await asyncio.wait_for(gate.acquire("m@2"), 1)  # not behind m@1's waiter
    assert gate.limit_of("m@1") is limit and gate.limit_of("m@2") is not limit
    gate.limit_of("m@2").on_congestion(0.0)
    limit.on_sample(0.1, 2, 0.0)  # m@1's windows of one answer: the second grows it x4; m@2's is its own
    limit.on_sample(0.1, 2, 0.0)
    assert gate.limits() == {"m@1": 8, "m@2": 1}
    await asyncio.wait_for(held, 1)  # m@1's limit grew: its waiter went
    assert (gate.in_use_of("m@1"), gate.in_use_of("m@2"), gate.in_use) == (3, 1, 4)


async def test_the_worker_total_holds_across_deployments() -> None:
    gate = AdaptiveGate(GradientLimit(1, 4, initial=4))  # the total: the limit's maximum, 4
    for key in ("m@1", "m@1", "m@2", "m@2"):
        await gate.acquire(key)
    third = asyncio.create_task(gate.acquire("m@2"))
    await settle()
    assert not third.done() and gate.total_limit == 4
    gate.release("m@1")  # m@1 is below its part (2) now: the freed slot is kept for it
    await settle()
    assert not third.done()
    gate.release("m@2")
    await asyncio.wait_for(third, 1)
    assert gate.in_use == 3


POOL = LongRequests(threshold_tokens=100, share=0.25, quiet_s=2.0)


async def test_long_calls_hold_their_share_of_the_slots_while_short_ones_are_about() -> None:
    now = [0.0]
    gate = AdaptiveGate(GradientLimit(1, 8, initial=8), long_requests=POOL, clock=lambda: now[0])
    await gate.acquire(long=False)
    await gate.acquire(long=True)
    await gate.acquire(long=True)  # 2 of 8: the share
    third_long = asyncio.create_task(gate.acquire(long=True))
    await settle()
    assert not third_long.done()
    shorts = [asyncio.create_task(gate.acquire(long=False)) for _ in range(5)]  # a short call passes a long waiter
    await settle()
    assert all(short.done() for short in shorts)
    assert (gate.in_use, gate.waiting) == (8, 1)
    gate.release(long=True)  # its slot goes to the long waiter: the share has room again
    await asyncio.wait_for(third_long, 1)


async def test_long_calls_take_every_slot_once_short_ones_are_quiet() -> None:
    now = [0.0]
    gate = AdaptiveGate(GradientLimit(1, 4, initial=4), long_requests=LongRequests(100, 0.25, quiet_s=0.05),
                        clock=lambda: now[0])
    await gate.acquire(long=False)
    await gate.acquire(long=True)
    waiting = [asyncio.create_task(gate.acquire(long=True)) for _ in range(2)]
    await settle()
    assert not any(task.done() for task in waiting)
    gate.release(long=False)
    now[0] = 1.0  # past quiet_s: the timer the short call's end set wakes them
    await asyncio.wait_for(asyncio.gather(*waiting), 1)
    assert gate.in_use == 3


async def test_a_cancelled_long_waiter_leaves_no_slot_behind() -> None:
    gate = AdaptiveGate(GradientLimit(1, 4, initial=4), long_requests=POOL)
    await gate.acquire(long=False)
    await gate.acquire(long=True)
    waiter = asyncio.create_task(gate.acquire(long=True))
    await settle()
    waiter.cancel()
    await settle()
    assert (gate.in_use, gate.waiting, gate.pool.long_in_use("*")) == (2, 0, 1)


async def test_a_tenant_at_its_rpm_quota_waits_without_a_slot_while_another_tenant_s_calls_start() -> None:
    now = [0.0]
    gate = AdaptiveGate(GradientLimit(1, 8, initial=8), clock=lambda: now[0])
    gate.pace = TenantPace({"slow": TenantQuota(rpm=60)})
    slow, fast = Tenancy("slow"), Tenancy("fast")
    await gate.acquire(tenancy=slow)  # its second's worth
    held = asyncio.create_task(gate.acquire(tenancy=slow))
    others = [asyncio.create_task(gate.acquire(tenancy=fast)) for _ in range(5)]
    await settle()
    assert all(task.done() for task in others) and not held.done()
    assert (gate.in_use, gate.waiting) == (6, 1)  # the held call holds no slot
    now[0] = 1.0  # the quota refilled: the timer set for it wakes the waiter, no release needed
    await asyncio.wait_for(held, 2)
    assert gate.in_use == 7


async def test_a_lower_priority_call_lets_more_urgent_calls_on_their_way_go_first_for_a_bounded_time() -> None:
    now = [0.0]
    gate = AdaptiveGate(GradientLimit(1, 2, initial=2), clock=lambda: now[0])
    coming: set[str] = set()  # more urgent calls read and not yet at the gate
    gate.yields = lambda priority: priority == "low" and bool(coming)
    await gate.acquire(tenancy=Tenancy(priority="low"))
    coming.add("high")
    low = asyncio.create_task(gate.acquire(tenancy=Tenancy(priority="low")))
    await asyncio.sleep(0.3)
    assert not low.done() and gate.in_use == 1  # a slot is free, but left to the high calls coming
    await gate.acquire(tenancy=Tenancy(priority="high"))  # one comes and takes it at once
    gate.release()
    coming.clear()  # the rest came: the gate looks again on its own, no release needed
    await asyncio.wait_for(low, 1)

    gate.release()
    gate.release()
    coming.add("high")
    held = asyncio.create_task(gate.acquire(tenancy=Tenancy(priority="low")))
    await asyncio.sleep(0.2)
    assert not held.done()
    now[0] += YIELD_S  # the bound: it yielded that long, so it goes though more urgent calls are still coming
    await asyncio.wait_for(held, 1)
