"""The hedge budget: calls earn a share of a hedge, a hedge spends one, and the saving is capped."""

from __future__ import annotations

import pytest

from streamproc.core.guards.hedging import HEDGE_FLOOR_S, HedgeBudget, hedge_after_s


def test_hedges_are_at_most_the_ratio_of_calls_after_the_burst() -> None:
    budget = HedgeBudget(ratio=0.03, burst=5)
    assert [budget.take() for _ in range(6)] == [True] * 5 + [False]  # the saved burst
    granted = 0
    for _ in range(1000):
        budget.on_call()
        granted += budget.take()
    assert granted == 30


def test_savings_are_capped_and_ratio_zero_is_off() -> None:
    budget = HedgeBudget(ratio=1.0, burst=2)
    for _ in range(100):
        budget.on_call()
    assert [budget.take() for _ in range(3)] == [True, True, False]
    off = HedgeBudget(ratio=0.0)
    off.on_call()
    assert not off.take()


def test_no_hedge_before_the_tail_is_known_nor_sooner_than_the_floor() -> None:
    assert hedge_after_s(None) is None
    assert hedge_after_s(0.01) == HEDGE_FLOOR_S
    assert hedge_after_s(3.0) == 3.0


@pytest.mark.parametrize("kwargs", [{"ratio": -0.1}, {"ratio": 1.5}, {"burst": 0.5}])
def test_invalid_settings_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HedgeBudget(**kwargs)
