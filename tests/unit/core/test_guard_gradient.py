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
from hypothesis import given, settings
from hypothesis import strategies as st

from streamproc.core.guards.gradient import GradientLimit
from streamproc.core.guards.timeouts import AdaptiveTimeout

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


def labels_and_truncations(long_share: float, prefill_s: float, per_token_s: float) -> Service:
    """A small model's batch: short labels (3-12 tokens) and answers cut at max_tokens (64)."""
    def service(rng: random.Random) -> tuple[float, int]:
        tokens = 64 if rng.random() < long_share else rng.randint(3, 12)
        return prefill_s + per_token_s * tokens, tokens
    return service


def timed_out(run: Run, ceiling_s: float = 60.0) -> list[float]:
    """The latencies of the calls that took longer than the worker's adaptive read timeout at their start
    (3 x p99 of the answers before, at least 5 s): what the client's own queue would have cost."""
    calls = sorted((finished - latency, latency) for finished, latency in zip(run.finished_at, run.latencies,
                                                                               strict=True))
    answers = sorted(zip(run.finished_at, run.latencies, strict=True))
    timeouts, seen, slow = AdaptiveTimeout(ceiling_s), 0, []
    for started, latency in calls:
        while seen < len(answers) and answers[seen][0] <= started:
            timeouts.observe("m", answers[seen][1])
            seen += 1
        if latency > timeouts.timeout_s("m"):
            slow.append(latency)
    return slow


@settings(max_examples=100, deadline=None)
@given(long_share=st.floats(0.0, 1.0), prefill_s=st.floats(0.02, 1.0), per_token_s=st.floats(0.002, 0.04),
       seed=st.integers(0, 10_000))
def test_against_one_slot_the_default_start_never_grows_into_a_long_queue(
        long_share: float, prefill_s: float, per_token_s: float, seed: int) -> None:
    """The default start (16) against one slot, answers of mixed lengths, as the real-server test meets
    llama.cpp: the first window is all queue but its best call per token can be a long answer that waited
    too. It used to grow x4 to 64 in about one run in ten, and the calls queued behind them timed out.
Latencies within ``min_rise_s`` of the baseline's pace do not cut the limit: a fast server's queue may
grow to a few seconds, below the read timeout's 5 s floor. (A server slower than 60 s / 16 a call, with
one slot, times out the start's last calls: ``STREAMPROC_ADAPTIVE_INITIAL_IN_FLIGHT`` is for it.)"""
    run = simulate(GradientLimit(1, 256, initial=16), 1, labels_and_truncations(long_share, prefill_s, per_token_s),
                   200, seed=seed)
    assert timed_out(run) == [], run.limits[::10]
    longest = prefill_s + per_token_s * 64
    assert max(run.latencies[100:]) <= max(16 * longest, 5.0)  # no deeper than the start, or the timeout's floor


@pytest.mark.parametrize("slots", [1, 2])
def test_a_few_slots_never_meet_four_times_the_start(slots: int) -> None:
    """Seed 13 of the mix above grew to 64 before the excess was measured against the baseline's pace."""
    run = simulate(GradientLimit(1, 256, initial=16), slots, labels_and_truncations(0.2, 0.2, 0.02), 600, seed=13)
    assert max(run.limits) < 32, run.limits[::10]
    assert timed_out(run) == []


# The first ten answers of the real-server test (llama.cpp, one slot, 16 calls sent at once): (seconds, tokens).
# The first answer already waited behind a cut answer that fed no sample: its 0.09 s a token is 3x the server's.
QUEUED_FIRST_WINDOW = [(3.2, 36), (4.8, 40), (6.0, 33), (7.4, 61), (10.8, 22), (12.3, 50), (13.3, 44), (14.9, 37),
                       (16.0, 24), (17.0, 20)]


def queued_first_window() -> GradientLimit:
    limiter = GradientLimit(1, 256, initial=16)
    for latency, tokens in QUEUED_FIRST_WINDOW:
        limiter.on_sample(latency, 16, latency, tokens)  # all sent at 0
    return limiter


def test_a_queued_first_window_is_probed_by_a_call_alone_and_the_limit_falls_to_a_few() -> None:
    limiter = queued_first_window()
    assert limiter.probing and limiter.limit == 1  # the calls out drain, then one goes alone
    limiter.on_sample(20.0, 15, 21.0, 31)  # sent before the probe began: it waited too, and says nothing
    assert limiter.probing
    limiter.on_sample(0.99, 1, 40.0, 51)  # alone: 0.02 s a token
    assert not limiter.probing and limiter.limit == 4
    assert limiter.last_probe is not None and limiter.last_probe.verdict == "queue"
    assert limiter.baseline_s == pytest.approx(0.99 / 51)
    for _ in range(10):  # a window with no rise: slow start is over, so no x4, only sqrt
        limiter.on_sample(1.0, 4, 50.0, 51)
    assert limiter.limit == 5


def test_a_probe_that_generates_nothing_gives_up_and_the_limit_goes_back() -> None:
    limiter = queued_first_window()
    for _ in range(4):
        limiter.on_unsampled(0.01, 30.0)  # refused at once: nothing measured
    assert limiter.probing
    limiter.on_unsampled(0.01, 30.0)
    assert not limiter.probing and limiter.limit == 16 and str(limiter.last_probe) == "no_answer"
    for latency, tokens in QUEUED_FIRST_WINDOW:  # a first window again, not calm: no second probe
        limiter.on_sample(latency, 16, 31.0 + latency, tokens)
    assert not limiter.probing and limiter.limit > 1


def test_a_probe_held_up_by_a_hung_call_expires_and_the_limit_goes_back() -> None:
    limiter = queued_first_window()  # ended at 17 s, its slowest call 17 s, 16 in flight
    assert limiter.probe_expires_at == pytest.approx(17.0 + 2 * 17.0 * 1.6)
    limiter.on_probe_expired(60.0)  # too early: a one-slot server may still be draining
    assert limiter.probing
    limiter.on_probe_expired(71.4)
    assert not limiter.probing and limiter.limit == 16 and limiter.probe_expires_at is None


def test_congestion_during_a_probe_ends_it_and_cuts_from_the_limit_before() -> None:
    limiter = queued_first_window()
    limiter.on_congestion(30.0)
    assert not limiter.probing and limiter.limit == 14  # 16 x 0.9


def stalled_start(rng: random.Random) -> Service:
    """The first 1-3 calls take 20-120 s (a model loaded on the first request, as Ollama does), then answers
    of 5-200 tokens at 10 ms a token."""
    stalls = [rng.uniform(20, 120) for _ in range(rng.randint(1, 3))]
    count = 0

    def service(r: random.Random) -> tuple[float, int]:
        nonlocal count
        count += 1
        tokens = r.randint(5, 200)
        return (stalls[count - 1] if count <= len(stalls) else 0.2 + 0.01 * tokens), tokens
    return service


@pytest.mark.parametrize("slots", [1, 2])
@pytest.mark.parametrize("seed", range(10))
def test_a_stalled_start_does_not_overshoot_a_small_server(slots: int, seed: int) -> None:
    """Every call of the first window waited behind the stall, so its best call is no baseline; the probe
    measures one alone. Without it 174 of 200 such runs against one slot reached 32 in flight, some 256."""
    run = simulate(GradientLimit(1, 256, initial=16), slots, stalled_start(random.Random(seed)), 300, seed=seed)
    assert max(run.limits) < 32, run.limits[::10]


def test_a_stalled_start_still_reaches_a_large_servers_ceiling() -> None:
    run = simulate(GradientLimit(1, 256, initial=16), math.inf, stalled_start(random.Random(3)), 3000, seed=3)
    assert 256 in run.limits[:200], run.limits[:200:10]


def llama_cpp_like_run(seed: int, calls: int = 130) -> list[tuple[float, int]]:
    """The real-server test as the limiter meets it: one slot; a quarter of the calls refused at once (no
    sample, no server time), a quarter cut at 64 tokens (server time, no sample: only a probe hears them),
    the rest 7-60-token answers; and a server whose speed drifts between 1x and 4x (llama.cpp on a machine
    where other work takes a core). Returns (time, limit) after each answer."""
    rng = random.Random(seed)
    limiter = GradientLimit(1, 256, initial=16)
    changes = sorted(rng.uniform(0, 400) for _ in range(12))
    speeds = [rng.choice([1, 1, 1.5, 2, 3, 4]) for _ in range(13)]
    now, sent, in_flight, busy = 0.0, 0, 0, False
    queue: deque[tuple[str, int, float]] = deque()
    events: list[tuple[float, float, str, int, float]] = []  # (finish, tiebreak, kind, tokens, sent at)
    trace: list[tuple[float, int]] = []

    def serve(kind: str, tokens: int, submitted: float) -> None:
        nonlocal busy
        busy = True
        speed = speeds[sum(1 for change in changes if change <= now)]
        heapq.heappush(events, (now + (0.3 + 0.02 * tokens) * speed, rng.random(), kind, tokens, submitted))

    def submit_up_to_limit() -> None:
        nonlocal sent, in_flight
        while in_flight < limiter.limit and sent < calls:
            sent, in_flight = sent + 1, in_flight + 1
            draw = rng.random()
            kind = "refused" if draw < 0.25 else "cut" if draw < 0.5 else "answer"
            tokens = 64 if kind == "cut" else rng.randint(7, 60)
            if kind == "refused":
                heapq.heappush(events, (now + 0.01, rng.random(), kind, 0, now))
            elif busy:
                queue.append((kind, tokens, now))
            else:
                serve(kind, tokens, now)

    submit_up_to_limit()
    while events:
        now, _, kind, tokens, submitted = heapq.heappop(events)
        if kind != "refused":
            busy = False
            if queue:
                serve(*queue.popleft())
        if kind == "answer":
            limiter.on_sample(now - submitted, in_flight, now, tokens)
        else:
            limiter.on_unsampled(now - submitted, now, tokens or None)
        expires_at = limiter.probe_expires_at
        if expires_at is not None and now >= expires_at:
            limiter.on_probe_expired(now)
        in_flight -= 1
        trace.append((now, limiter.limit))
        submit_up_to_limit()
    return trace


@pytest.mark.parametrize("seed", range(40))
def test_against_a_drifting_one_slot_server_the_limit_never_grows_past_its_start(seed: int) -> None:
    """CI's real-server run of stop 23 saw the limit go 16 -> 61 in its second half. This simulation fails
    that way in 34 of 300 seeds without the probe (and settles at 12-14, as the real runs did at 11-16);
    with it, in none."""
    trace = llama_cpp_like_run(seed)
    half = trace[-1][0] / 2
    assert max(limit for at, limit in trace if at >= half) <= 16, trace[::10]


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

