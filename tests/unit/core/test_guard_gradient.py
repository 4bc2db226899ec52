"""The gradient limiter against simulated servers: one slot, a few slots, no queue at all, output-length
latency, millisecond noise. A discrete-event simulation drives it as the worker would: a closed loop that
keeps ``limit`` calls in flight from an endless backlog."""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from streamproc.core.guards.gradient import GradientLimit

Service = Callable[[random.Random], tuple[float, int]]  # -> (service seconds, completion tokens)


def uniform_1_3s(rng: random.Random) -> tuple[float, int]:
    return rng.uniform(1.0, 3.0), 40


def output_length(rng: random.Random) -> tuple[float, int]:
    tokens = rng.randint(5, 500)
    return 0.2 + 0.01 * tokens, tokens  # prefill, then 10 ms a token: latency is mostly output length


@dataclass
class Run:
    limits: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)


def simulate(limiter: GradientLimit, slots: float, service: Service, calls: int, seed: int = 1,
             overhead: Callable[[int], float] = lambda in_flight: 0.0) -> Run:
    """A FIFO server with ``slots`` parallel slots (inf: no queue); ``overhead(in_flight)`` adds latency that
    grows with the client's own load (an event loop), not the server's."""
    rng = random.Random(seed)
    now, started, in_flight, busy = 0.0, 0, 0, 0
    queue: deque[tuple[float, float, int]] = deque()
    events: list[tuple[float, int, float, int]] = []  # (finish, tiebreak, submitted, tokens)
    run = Run()

    def serve(submitted: float, seconds: float, tokens: int) -> None:
        nonlocal busy
        busy += 1
        heapq.heappush(events, (now + seconds + overhead(in_flight), len(run.latencies) + len(events) + busy,
                                submitted, tokens))

    def submit_up_to_limit() -> None:
        nonlocal started, in_flight
        while in_flight < limiter.limit and started < calls:
            started += 1
            in_flight += 1
            seconds, tokens = service(rng)
            if busy < slots:
                serve(now, seconds, tokens)
            else:
                queue.append((now, seconds, tokens))

    submit_up_to_limit()
    while events:
        now, _, submitted, tokens = heapq.heappop(events)
        busy -= 1
        if queue:
            serve(*queue.popleft())
        limiter.on_sample(now - submitted, in_flight, now, tokens)
        in_flight -= 1
        run.latencies.append(now - submitted)
        run.finished_at.append(now)
        run.limits.append(limiter.limit)
        submit_up_to_limit()
    return run


def test_against_one_slot_the_limit_settles_near_it_and_nothing_waits_long() -> None:
    run = simulate(GradientLimit(1, 256, initial=8), 1, uniform_1_3s, 400)
    settled = run.limits[150:]
    assert max(settled) <= 8, settled  # a few calls: the one in service and a short queue
    assert max(run.latencies[100:]) < 20  # a 60 s timeout is never near: the client's own queue stays short
    assert max(run.latencies) < 30  # not even in the first window, started at 8


@pytest.mark.parametrize("slots", [2, 4, 16])
def test_against_a_few_slots_throughput_is_kept_and_the_queue_bounded(slots: int) -> None:
    run = simulate(GradientLimit(1, 256, initial=8), slots, uniform_1_3s, 150 * slots)
    half = len(run.finished_at) // 2
    throughput = (len(run.finished_at) - half) / (run.finished_at[-1] - run.finished_at[half])
    assert throughput >= 0.9 * slots / 2.0  # the slots' capacity: mean service 2 s
    assert max(run.limits[half:]) <= 4 * slots + 8
    assert sorted(run.latencies[half:])[int(0.99 * (len(run.latencies) - half))] < 10 * 2.0  # far below 60 s


@pytest.mark.parametrize("service", [uniform_1_3s, output_length], ids=["uniform", "output-length"])
def test_without_a_queue_the_limit_reaches_its_ceiling_fast(service: Service) -> None:
    run = simulate(GradientLimit(1, 256, initial=8), math.inf, service, 3000)
    assert run.limits[-1] == 256
    assert run.limits.index(256) < 400  # slow start: doubling per window of 10 calls


@pytest.mark.parametrize("seed", range(1, 6))
def test_an_early_burst_of_slow_answers_does_not_end_slow_start_for_good(seed: int) -> None:
    """Calls 20-45 take 3x as long (a model warming up), then latency is back to normal: the rise looked like
    a queue for a window, but the limit must still reach a fast server's ceiling (it used to stay near 32
    for 800 calls and end at 184)."""
    count = 0

    def warming_up(rng: random.Random) -> tuple[float, int]:
        nonlocal count
        count += 1
        return rng.uniform(1.0, 3.0) * (3.0 if 20 <= count <= 45 else 1.0), 40

    run = simulate(GradientLimit(1, 256, initial=16), math.inf, warming_up, 3000, seed=seed)
    assert 256 in run.limits[:300], run.limits[:300:10]


def test_a_real_queue_still_ends_slow_start_after_the_conservative_windows() -> None:
    """Against 40 slots, slow start may overshoot a little, never run away: the limit settles near them."""
    run = simulate(GradientLimit(1, 256, initial=16), 40, uniform_1_3s, 6000)
    assert max(run.limits[3000:]) <= 4 * 40 + 8


def test_milliseconds_of_client_side_noise_never_cut_the_limit() -> None:
    """An event loop slowed by its own load adds ms, growing with in-flight calls: not a server queue."""
    run = simulate(GradientLimit(1, 256, initial=8), math.inf, lambda rng: (rng.uniform(0.001, 0.003), 40),
                   5000, overhead=lambda in_flight: in_flight * 0.0005)
    assert run.limits[-1] == 256


def test_congestion_cuts_once_per_cooldown_and_ends_slow_start() -> None:
    limit = GradientLimit(1, 256, initial=100, cooldown_s=1.0)
    limit.on_congestion(10.0)
    limit.on_congestion(10.5)
    assert limit.limit == 90
    limit.on_congestion(11.0)
    assert limit.limit == 81
    for _ in range(10):
        limit.on_sample(1.0, 81, 12.0, 40)
    assert limit.limit < 2 * 81  # no doubling after a 429: only the sqrt probe


def test_a_client_that_uses_few_slots_learns_nothing() -> None:
    limit = GradientLimit(1, 256, initial=64)
    for _ in range(100):
        limit.on_sample(1.0, 3, 0.0, 40)  # 3 in flight of 64 allowed: the backlog, not the server, is the limit
    assert limit.limit == 64


def test_listeners_hear_of_changes_and_nonsense_samples_are_ignored() -> None:
    limit = GradientLimit(1, 64, initial=8)
    heard: list[int] = []
    limit.subscribe(lambda: heard.append(limit.limit))
    for latency in (-1.0, float("nan"), float("inf")):
        limit.on_sample(latency, 8, 0.0)
    assert heard == []
    for _ in range(10):
        limit.on_sample(1.0, 8, 0.0)
    assert heard == [32]  # slow start: x4 per window while latency holds, from the first window
    for _ in range(10):
        limit.on_sample(1.0, 8, 0.0)
    assert heard == [32]  # calls started before the change say nothing about the new limit
    for _ in range(10):
        limit.on_sample(1.0, 32, 2.0)
    assert heard == [32, 64]  # x4, up to the maximum


@pytest.mark.parametrize("kwargs", [
    {"minimum": 0, "maximum": 4}, {"minimum": 5, "maximum": 4}, {"minimum": 1, "maximum": 4, "initial": 9},
    {"minimum": 1, "maximum": 4, "tolerance": 0.5}, {"minimum": 1, "maximum": 4, "smoothing": 0},
    {"minimum": 1, "maximum": 4, "window": 0}, {"minimum": 1, "maximum": 4, "backoff": 1.0},
])
def test_invalid_settings_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        GradientLimit(**kwargs)  # type: ignore[arg-type]
