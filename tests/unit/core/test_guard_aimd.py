"""AIMD in-flight limit (growth, cuts, cooldown, latency baseline) and the gate that follows it."""

from __future__ import annotations

import pytest

from streamproc.core.guards.aimd import AdaptiveLimit


def grow(limit: AdaptiveLimit, successes: int, latency_s: float = 0.1, now: float = 0.0) -> None:
    for _ in range(successes):
        limit.on_success(latency_s, now)


# -- AdaptiveLimit ------------------------------------------------------------------------------------------
def test_starts_at_the_minimum_unless_told_otherwise() -> None:
    assert AdaptiveLimit(2, 10).limit == 2
    assert AdaptiveLimit(2, 10, initial=7).limit == 7


def test_grows_by_about_one_per_round_trip() -> None:
    limit = AdaptiveLimit(1, 100, initial=4)
    grow(limit, 3)
    assert limit.limit == 4  # 4 + 3 x 1/4-ish is not yet 5
    grow(limit, 1)
    assert limit.limit == 5  # four successes at limit 4: one round trip
    grow(limit, 5)
    assert limit.limit == 6


def test_never_grows_beyond_the_maximum() -> None:
    limit = AdaptiveLimit(1, 3)
    grow(limit, 1000)
    assert limit.limit == 3
    limit.on_congestion(0.0)
    assert limit.limit == 2  # 3 x 0.9: the value was clamped at 3, not left to grow unseen


def test_congestion_cuts_by_the_backoff() -> None:
    limit = AdaptiveLimit(1, 1000, initial=100)
    limit.on_congestion(0.0)
    assert limit.limit == 90
    limit.on_congestion(1.0)
    assert limit.limit == 81


def test_at_most_one_cut_per_cooldown() -> None:
    limit = AdaptiveLimit(1, 1000, initial=100, cooldown_s=1.0)
    for now in (0.0, 0.1, 0.5, 0.99):
        limit.on_congestion(now)
    assert limit.limit == 90
    limit.on_congestion(1.0)
    assert limit.limit == 81


def test_a_zero_cooldown_cuts_every_time() -> None:
    limit = AdaptiveLimit(1, 1000, initial=100, backoff=0.5, cooldown_s=0.0)
    limit.on_congestion(0.0)
    limit.on_congestion(0.0)
    assert limit.limit == 25


def test_never_shrinks_below_the_minimum() -> None:
    limit = AdaptiveLimit(3, 10, initial=4, backoff=0.5, cooldown_s=0.0)
    for _ in range(5):
        limit.on_congestion(0.0)
    assert limit.limit == 3
    grow(limit, 3)
    assert limit.limit == 4  # and grows back from the minimum at once


def test_steady_latency_lets_the_limit_grow() -> None:
    limit = AdaptiveLimit(1, 1000, initial=10)
    grow(limit, 200, latency_s=0.5)
    assert limit.limit > 20
    assert limit.latency_baseline == pytest.approx(0.5)


def test_a_latency_spike_cuts_instead_of_growing() -> None:
    limit = AdaptiveLimit(1, 1000, initial=50, cooldown_s=1.0)
    grow(limit, 30, latency_s=1.0)
    before = limit.limit
    for n in range(40):  # latency x5: the short average soon exceeds 2 x baseline
        limit.on_success(5.0, now=100.0 + n * 0.01)
    assert limit.limit == int(before * 0.9)  # one cut (cooldown), and no growth while latency is high


def test_a_rise_of_a_few_milliseconds_is_noise_not_a_queue() -> None:
    """From 2 ms to 10 ms is x5, but far below the absolute rise that says a provider queues calls."""
    limit = AdaptiveLimit(1, 1000, initial=50, cooldown_s=0.0)
    grow(limit, 30, latency_s=0.002)
    before = limit.limit
    for n in range(40):
        limit.on_success(0.010, now=100.0 + n * 0.01)
    assert limit.limit > before


def test_latency_cuts_repeat_after_each_cooldown() -> None:
    limit = AdaptiveLimit(1, 1000, initial=100, cooldown_s=1.0)
    grow(limit, 30, latency_s=1.0)
    before = limit.limit
    for n in range(20):
        limit.on_success(10.0, now=100.0 + n)  # one slow answer per second
    assert limit.limit < before * 0.9 * 0.9


def test_latency_is_not_judged_before_twenty_samples() -> None:
    limit = AdaptiveLimit(1, 1000, initial=10)
    grow(limit, 5, latency_s=0.1)
    grow(limit, 14, latency_s=100.0)  # 19 samples: the baseline is too young
    assert limit.limit > 10
    assert limit.latency_ewma is not None and limit.latency_ewma > 2 * 0.1


def test_a_permanent_latency_shift_becomes_the_new_baseline() -> None:
    limit = AdaptiveLimit(1, 1000, initial=100, cooldown_s=1.0)
    grow(limit, 50, latency_s=1.0)
    for n in range(400):
        limit.on_success(3.0, now=100.0 + n * 0.001)  # 0.4 s: at most one cut
    assert limit.latency_baseline is not None and limit.latency_baseline > 1.5
    after_shift = limit.limit
    grow(limit, 200, latency_s=3.0, now=200.0)
    assert limit.limit > after_shift  # growing again at the new normal


def test_the_baseline_follows_a_drop_at_once() -> None:
    limit = AdaptiveLimit(1, 1000)
    grow(limit, 30, latency_s=2.0)
    grow(limit, 100, latency_s=0.5)
    assert limit.latency_baseline == pytest.approx(0.5, rel=0.01)


@pytest.mark.parametrize("latency", [-1.0, float("nan"), float("inf")])
def test_nonsense_latencies_are_not_samples(latency: float) -> None:
    limit = AdaptiveLimit(1, 100, initial=1)
    limit.on_success(latency, 0.0)
    assert limit.latency_ewma is None
    assert limit.limit == 2  # still a success


def test_listeners_hear_of_changes_of_the_integer_limit_only() -> None:
    limit = AdaptiveLimit(1, 100, initial=4, cooldown_s=0.0)
    heard: list[int] = []
    limit.subscribe(lambda: heard.append(limit.limit))
    grow(limit, 3)
    assert heard == []
    grow(limit, 1)
    limit.on_congestion(0.0)
    assert heard == [5, 4]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"minimum": 0, "maximum": 5},
        {"minimum": 6, "maximum": 5},
        {"minimum": 1, "maximum": 5, "initial": 6},
        {"minimum": 2, "maximum": 5, "initial": 1},
        {"minimum": 1, "maximum": 5, "backoff": 1.0},
        {"minimum": 1, "maximum": 5, "backoff": 0.0},
        {"minimum": 1, "maximum": 5, "latency_tolerance": 1.0},
        {"minimum": 1, "maximum": 5, "cooldown_s": -1.0},
        {"minimum": 1, "maximum": 5, "ewma_alpha": 0.0},
    ],
)
def test_invalid_settings_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AdaptiveLimit(**kwargs)  # type: ignore[arg-type]
