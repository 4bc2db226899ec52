"""The hedge budget: calls earn a share of a hedge, a hedge spends one, and the saving is capped."""

from __future__ import annotations

import pytest

from streamproc.core.guards.hedging import FREE_IN_FLIGHT, HEDGE_FLOOR_S, HedgeBudget, hedge_after_s

BUSY = FREE_IN_FLIGHT + 1  # calls in flight: enough that a hedge spends a saved one


def test_hedges_are_at_most_the_ratio_of_calls_after_the_burst() -> None:
    budget = HedgeBudget(ratio=0.03, burst=5)
    assert [budget.take(BUSY) for _ in range(6)] == [True] * 5 + [False]  # the saved burst
    granted = 0
    for _ in range(1000):
        budget.on_call()
        granted += budget.take(BUSY)
    assert granted == 30


def test_savings_are_capped_and_ratio_zero_is_off() -> None:
    budget = HedgeBudget(ratio=1.0, burst=2)
    for _ in range(100):
        budget.on_call()
    assert [budget.take(BUSY) for _ in range(3)] == [True, True, False]
    off = HedgeBudget(ratio=0.0)
    off.on_call()
    assert not off.take(BUSY) and not off.take(1)


def test_with_few_calls_in_flight_a_hedge_spends_nothing() -> None:
    """The last calls of a batch: its slow calls spent what it earned, and a copy of one of two cannot double a
    load."""
    budget = HedgeBudget(ratio=0.03, burst=1)
    assert budget.take(BUSY) and not budget.available(BUSY)
    assert all(budget.take(in_flight) for in_flight in range(1, FREE_IN_FLIGHT + 1) for _ in range(10))
    assert not budget.take(BUSY)


def test_no_hedge_before_the_tail_is_known_nor_sooner_than_the_floor() -> None:
    assert hedge_after_s(None) is None
    assert hedge_after_s(0.01) == HEDGE_FLOOR_S
    assert hedge_after_s(3.0) == 3.0


@pytest.mark.parametrize("kwargs", [{"ratio": -0.1}, {"ratio": 1.5}, {"burst": 0.5}])
def test_invalid_settings_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HedgeBudget(**kwargs)
