"""Per-model timeouts from observed latency: the ceiling until enough samples, then k x p99 within bounds."""

from __future__ import annotations

import random

import pytest

from streamproc.core.guards.timeouts import AdaptiveTimeout


def test_the_ceiling_until_a_model_has_answered_enough_times() -> None:
    timeouts = AdaptiveTimeout(60, min_samples=20)
    for _ in range(19):
        timeouts.observe("m", 1.0)
    assert timeouts.timeout_s("m") == 60
    assert timeouts.timeout_s("unknown") == 60
    timeouts.observe("m", 1.0)
    assert timeouts.timeout_s("m") == 5.0  # 3 x 1 s is below the floor


def test_a_model_answering_in_one_to_three_seconds_is_cut_after_about_nine() -> None:
    rng, timeouts = random.Random(3), AdaptiveTimeout(60)
    for _ in range(200):
        timeouts.observe("fast", rng.uniform(1, 3))
    assert 8.5 <= timeouts.timeout_s("fast") <= 9.0


def test_a_slow_healthy_model_keeps_its_time_and_models_do_not_mix() -> None:
    timeouts = AdaptiveTimeout(60)
    for _ in range(50):
        timeouts.observe("fast", 0.5)
        timeouts.observe("long-outputs", 15.0)
    assert timeouts.timeout_s("fast") == 5.0
    assert timeouts.timeout_s("long-outputs") == 45.0
    for _ in range(50):
        timeouts.observe("long-outputs", 40.0)
    assert timeouts.timeout_s("long-outputs") == 60  # never above the ceiling


def test_the_window_forgets_old_latencies() -> None:
    timeouts = AdaptiveTimeout(60, window=50, min_samples=10)
    for _ in range(50):
        timeouts.observe("m", 10.0)
    for _ in range(50):
        timeouts.observe("m", 2.0)
    assert timeouts.timeout_s("m") == 6.0


def test_the_floor_never_exceeds_the_ceiling_and_nonsense_is_ignored() -> None:
    timeouts = AdaptiveTimeout(3, floor_s=5, min_samples=1)
    for latency in (-1.0, float("nan"), float("inf")):
        timeouts.observe("m", latency)
    assert timeouts.timeout_s("m") == 3
    timeouts.observe("m", 0.1)
    assert timeouts.timeout_s("m") == 3


@pytest.mark.parametrize("kwargs", [{"ceiling_s": 0}, {"ceiling_s": 5, "multiplier": 0.5},
                                    {"ceiling_s": 5, "quantile": 0}, {"ceiling_s": 5, "min_samples": 500}])
def test_invalid_settings_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AdaptiveTimeout(**kwargs)  # type: ignore[arg-type]


def test_a_call_allowed_more_tokens_than_usual_gets_proportionally_more_time() -> None:
    """A retry after a truncated answer asks for twice the room: it may take twice as long."""
    timeouts = AdaptiveTimeout(60)
    for _ in range(50):
        timeouts.observe("m", 3.0, max_tokens=64)
    assert timeouts.timeout_s("m", 64) == 9.0
    assert timeouts.timeout_s("m", 256) == 36.0
    assert timeouts.timeout_s("m", 16) == 9.0  # never less than for the usual budget
    assert timeouts.timeout_s("m", 10_000) == 60  # still bounded by the ceiling

