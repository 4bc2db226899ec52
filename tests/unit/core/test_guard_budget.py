"""The per-batch retry budget: minimum + ratio x first attempts, counted per batch, memory bounded."""

from __future__ import annotations

import pytest

from streamproc.core.guards.budget import RetryBudget, SpentTally


def test_the_minimum_is_available_before_any_first_attempt() -> None:
    budget = RetryBudget(ratio=0.2, minimum=3)
    assert [budget.try_spend("b") for _ in range(4)] == [True, True, True, False]
    assert budget.counts("b") == (0, 3)


def test_first_attempts_grow_the_budget_by_the_ratio() -> None:
    budget = RetryBudget(ratio=0.2, minimum=0)
    for _ in range(15):
        budget.on_first_attempt("b")
    spent = sum(budget.try_spend("b") for _ in range(10))
    assert spent == 3  # 0.2 x 15 = 3 (despite 0.2 * 15 == 3.0000000000000004)
    assert budget.counts("b") == (15, 3)
    budget.on_first_attempt("b")
    budget.on_first_attempt("b")
    budget.on_first_attempt("b")
    budget.on_first_attempt("b")
    budget.on_first_attempt("b")  # 20 first attempts: 4 retries
    assert budget.try_spend("b")
    assert not budget.try_spend("b")


def test_the_defaults_allow_ten_plus_twenty_percent() -> None:
    budget = RetryBudget()
    for _ in range(100):
        budget.on_first_attempt("b")
    assert sum(budget.try_spend("b") for _ in range(100)) == 30


def test_a_refused_retry_is_not_counted() -> None:
    budget = RetryBudget(ratio=0.0, minimum=1)
    assert budget.try_spend("b")
    assert not budget.try_spend("b")
    assert not budget.try_spend("b")
    assert budget.counts("b") == (0, 1)


def test_batches_are_independent() -> None:
    budget = RetryBudget(ratio=0.0, minimum=1)
    assert budget.try_spend("a")
    assert not budget.try_spend("a")
    assert budget.try_spend("b")
    assert budget.counts("a") == (0, 1)
    assert budget.counts("b") == (0, 1)


def test_unknown_batches_count_zero_and_are_not_created_by_counts() -> None:
    budget = RetryBudget(max_batches=1)
    budget.on_first_attempt("a")
    assert budget.counts("other") == (0, 0)
    assert budget.counts("a") == (1, 0)  # looking "other" up did not evict "a"


def test_memory_is_bounded_dropping_the_least_recently_used_batch() -> None:
    budget = RetryBudget(ratio=0.0, minimum=1, max_batches=2)
    budget.on_first_attempt("a")
    budget.on_first_attempt("b")
    budget.on_first_attempt("a")  # "a" is now more recent than "b"
    budget.on_first_attempt("c")  # over the cap: "b" goes
    assert budget.counts("b") == (0, 0)
    assert budget.counts("a") == (2, 0)
    assert budget.counts("c") == (1, 0)
    assert budget.try_spend("a")  # a spend also counts as use
    budget.on_first_attempt("d")
    assert budget.counts("c") == (0, 0)
    assert budget.counts("a") == (2, 1)


def test_the_default_cap_is_ten_thousand_batches() -> None:
    budget = RetryBudget()
    for n in range(10_001):
        budget.on_first_attempt(f"b{n}")
    assert budget.counts("b0") == (0, 0)
    assert budget.counts("b1") == (1, 0)
    assert budget.counts("b10000") == (1, 0)


@pytest.mark.parametrize(("ratio", "minimum", "max_batches"), [(-0.1, 1, 1), (0.2, -1, 1), (0.2, 1, 0)])
def test_invalid_settings_are_rejected(ratio: float, minimum: int, max_batches: int) -> None:
    with pytest.raises(ValueError):
        RetryBudget(ratio, minimum, max_batches)


def test_the_expected_first_attempts_set_the_budget_before_they_happen() -> None:
    """With the batch's size known (its manifest), an early failure may retry: the budget is not measured
    against the few first attempts made so far."""
    budget = RetryBudget(ratio=0.5, minimum=0)
    budget.on_first_attempt("b")
    assert not budget.try_spend("b")  # 0.5 x 1 first attempt: no whole retry
    assert [budget.try_spend("b", expected_first_attempts=20) for _ in range(11)] == [True] * 10 + [False]
    for _ in range(30):
        budget.on_first_attempt("b")
    assert budget.try_spend("b", expected_first_attempts=20)  # 31 seen now: the larger count decides


def test_a_restarted_budget_is_raised_to_what_the_state_recorded_and_never_lowered() -> None:
    budget = RetryBudget(ratio=0.1, minimum=0)
    budget.at_least("b", first_attempts=100, retries=10)  # the sweep after a restart: the budget is spent
    assert not budget.try_spend("b")
    budget.at_least("b", first_attempts=50, retries=2)  # an older, smaller reading changes nothing
    assert budget.counts("b") == (100, 10)


def test_the_tally_sums_first_attempts_and_spent_retries_per_batch() -> None:
    tally = SpentTally()
    tally.add("b1", attempts=3, retries_spent=2)
    tally.add("b1", attempts=1, retries_spent=0)
    tally.add(None, attempts=2, retries_spent=1)
    tally.add("b2", attempts=0, retries_spent=0)  # never started: not a first attempt
    assert tally.totals() == {"b1": (2, 2), "": (1, 1)}
