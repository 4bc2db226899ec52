"""The per-batch retry budget: minimum + ratio x first attempts, counted per batch, memory bounded."""

from __future__ import annotations

import pytest

from streamproc.core.events import RequestState
from streamproc.core.guards.budget import RetryBudget, SpentTally
from streamproc.core.request_state import CIRCUIT_OPEN, DEFERRAL_CODES
from streamproc.core.vocabulary import RequestStatus


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


def _state(batch: str | None, status: RequestStatus, attempts: int, spent: int = 0,
           code: str | None = None) -> RequestState:
    return RequestState(f"{batch}/{attempts}/{status}/{code}", status, "hash", attempts=attempts, batch_id=batch,
                        last_error_code=code, retries_spent=spent)


def test_the_tally_sums_first_attempts_and_spent_retries_per_batch() -> None:
    tally = SpentTally()
    tally.add(_state("b1", RequestStatus.SUCCEEDED, 3, spent=2))
    tally.add(_state("b1", RequestStatus.RETRYING, 1, code="service_unavailable"))
    tally.add(_state(None, RequestStatus.FAILED, 2, spent=1))
    tally.add(_state("b2", RequestStatus.PENDING, 0))  # never started: not a first attempt
    assert tally.totals() == {"b1": (2, 2), "": (1, 1)}


@pytest.mark.parametrize("state", [
    _state("b", RequestStatus.IN_FLIGHT, 1),  # admitted: its call may still wait for a breaker, the gate, tokens
    *(_state("b", RequestStatus.RETRYING, 1, code=code) for code in sorted(DEFERRAL_CODES)),  # parked unmade
])
def test_a_first_attempt_not_yet_sent_is_not_tallied(state: RequestState) -> None:
    tally = SpentTally()
    tally.add(state)
    assert tally.totals() == {}


@pytest.mark.parametrize("state", [
    _state("b", RequestStatus.IN_FLIGHT, 2),  # its first call failed, the second is under way
    _state("b", RequestStatus.RETRYING, 2, spent=1, code=CIRCUIT_OPEN),  # the second attempt parked, the first made
    _state("b", RequestStatus.RETRYING, 1, spent=1, code="service_unavailable"),
    _state("b", RequestStatus.SUCCEEDED, 1),
])
def test_a_first_attempt_made_is_tallied(state: RequestState) -> None:
    tally = SpentTally()
    tally.add(state)
    assert tally.totals() == {"b": (1, state.retries_spent)}


def test_a_sweep_during_an_outage_grants_no_retry_beyond_the_ratio() -> None:
    """The flaky integration test's failure (11 retries of 20 at 0.5): the worker sent 9 first calls and spent 9
    retries; the table sweep then also saw one request admitted and one parked by the open breaker, neither called
    yet. Tallied as first attempts, they raised the memory to 11, and their own calls later counted again: 22 first
    attempts for 20 requests, and an 11th retry."""
    budget = RetryBudget(ratio=0.5, minimum=0)
    for _ in range(9):
        budget.on_first_attempt("b")
        assert budget.try_spend("b", expected_first_attempts=20)
    tally = SpentTally()
    for _ in range(9):
        tally.add(_state("b", RequestStatus.RETRYING, 1, spent=1, code="service_unavailable"))
    tally.add(_state("b", RequestStatus.IN_FLIGHT, 1))
    tally.add(_state("b", RequestStatus.RETRYING, 1, code=CIRCUIT_OPEN))
    for batch, (first_attempts, retries) in tally.totals().items():
        budget.at_least(batch, first_attempts, retries)
    granted = []
    for _ in range(11):  # the other 11 requests' first calls, each a failure
        budget.on_first_attempt("b")
        granted.append(budget.try_spend("b", expected_first_attempts=20))
    assert budget.counts("b") == (20, 10)
    assert granted.count(True) == 1
