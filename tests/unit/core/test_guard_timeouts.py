"""Per-model timeouts from observed latency: the ceiling until enough samples, then k x p99 within bounds."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.guards.timeouts import AdaptiveTimeout, SlidingWindow


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



@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=60), st.integers(1, 20),
       st.floats(0.01, 1.0))
def test_the_sliding_window_answers_as_a_sort_of_its_last_values_would(values: list[float], size: int,
                                                                        q: float) -> None:
    window = SlidingWindow(size)
    for value in values:
        window.add(value)
    last = sorted(values[-size:])
    assert len(window) == len(last)
    assert window.quantile(q) == last[min(len(last) - 1, max(0, math.ceil(q * len(last)) - 1))]
    assert window.median() == last[len(last) // 2]
