"""The circuit breaker: sliding failure window, open period, half-open probes, late outcomes, transitions."""

from __future__ import annotations

import pytest

from streamproc.core.guards.breaker import BreakerState, CircuitBreaker

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


class Transitions:
    def __init__(self) -> None:
        self.seen: list[tuple[BreakerState, BreakerState]] = []

    def __call__(self, old: BreakerState, new: BreakerState) -> None:
        self.seen.append((old, new))


def record(breaker: CircuitBreaker, outcomes: str, now: float) -> None:
    """``outcomes`` as "x" (failure) and "." (success), all allowed and recorded at ``now``."""
    for outcome in outcomes:
        assert breaker.allow(now)
        breaker.record(outcome == ".", now)


def opened(now: float = 0.0, **kwargs: float) -> CircuitBreaker:
    breaker = CircuitBreaker(min_calls=2, **kwargs)  # type: ignore[arg-type]
    record(breaker, "xx", now)
    assert breaker.state is OPEN
    return breaker


# -- closed -------------------------------------------------------------------------------------------------
def test_closed_allows_everything_and_successes_keep_it_closed() -> None:
    breaker = CircuitBreaker()
    record(breaker, "." * 100, 0.0)
    assert breaker.state is CLOSED
    assert breaker.retry_at(3.0) == 3.0


def test_opens_when_the_failure_rate_is_reached_with_enough_calls() -> None:
    breaker = CircuitBreaker(failure_rate=0.5, min_calls=10)
    record(breaker, ".x.x.x.x.", 0.0)  # 9 calls: too few to judge
    assert breaker.state is CLOSED
    record(breaker, "x", 0.0)  # 10 calls, 5 failures
    assert breaker.state is OPEN


def test_stays_closed_below_the_failure_rate() -> None:
    breaker = CircuitBreaker(failure_rate=0.5, min_calls=10)
    record(breaker, "..x" * 30, 0.0)
    assert breaker.state is CLOSED
    assert breaker.window(0.0) == (90, 30)


def test_a_rate_that_is_not_exact_in_floats_still_opens() -> None:
    breaker = CircuitBreaker(failure_rate=0.3, min_calls=10)
    record(breaker, ".......xxx", 0.0)  # 3 / 10 (0.3 x 10 is 3.0000000000000004)
    assert breaker.state is OPEN


def test_failures_outside_the_window_are_forgotten() -> None:
    breaker = CircuitBreaker(failure_rate=0.5, window_s=10.0, min_calls=10)
    record(breaker, "xxxxxxxxx", 0.0)  # 9 failures: one short of min_calls
    assert breaker.window(9.9) == (9, 9)
    assert breaker.window(10.0) == (0, 0)  # slid past
    record(breaker, "x", 10.0)
    assert breaker.state is CLOSED


def test_the_window_slides_in_steps() -> None:
    breaker = CircuitBreaker(window_s=10.0, min_calls=100)
    record(breaker, "x", 0.5)
    record(breaker, ".", 5.5)
    assert breaker.window(9.9) == (2, 1)
    assert breaker.window(10.2) == (1, 0)  # the bucket of 0.5 expired, the one of 5.5 stays
    assert breaker.window(14.9) == (1, 0)
    assert breaker.window(15.0) == (0, 0)  # 1-second steps: an outcome counts for 9 to 10 seconds


def test_a_slow_trickle_of_failures_never_opens() -> None:
    breaker = CircuitBreaker(failure_rate=0.5, window_s=10.0, min_calls=5)
    for n in range(100):
        record(breaker, "x", n * 3.0)  # at most 4 calls in any window
    assert breaker.state is CLOSED


def test_an_outcome_with_a_stale_clock_is_still_counted() -> None:
    breaker = CircuitBreaker(window_s=10.0, min_calls=2)
    record(breaker, "x", 5.0)
    breaker.record(False, 4.0)  # read the clock before the previous one
    assert breaker.state is OPEN


# -- open ---------------------------------------------------------------------------------------------------
def test_open_rejects_until_the_open_period_ends() -> None:
    breaker = opened(now=100.0, open_s=5.0)
    assert not breaker.allow(100.0)
    assert not breaker.allow(104.99)
    assert breaker.retry_at(101.0) == 105.0
    assert breaker.state is OPEN  # lazily: nobody asked yet
    assert breaker.retry_at(106.0) == 106.0
    assert breaker.state is OPEN
    assert breaker.allow(105.0)
    assert breaker.state is HALF_OPEN


def test_outcomes_arriving_while_open_are_ignored() -> None:
    breaker = opened(now=0.0, open_s=5.0)
    for _ in range(10):
        breaker.record(True, 1.0)  # calls allowed before it opened
    breaker.record(False, 1.0)
    assert breaker.state is OPEN
    assert breaker.retry_at(1.0) == 5.0  # the open period was not extended either


def test_opening_clears_the_window() -> None:
    breaker = opened(now=0.0, open_s=1.0)
    assert breaker.window(0.0) == (0, 0)
    assert breaker.allow(1.0)
    breaker.record(True, 1.0)
    assert breaker.state is CLOSED
    record(breaker, "x", 1.0)  # an old failure would have made it 3 / 4 and reopened
    assert breaker.state is CLOSED
    assert breaker.window(1.0) == (1, 1)


# -- half-open ----------------------------------------------------------------------------------------------
def test_half_open_lets_one_probe_through_and_a_success_closes() -> None:
    breaker = opened(open_s=5.0)
    assert breaker.allow(5.0)
    assert not breaker.allow(5.0)  # the probe is out
    assert not breaker.allow(6.0)
    breaker.record(True, 6.0)
    assert breaker.state is CLOSED
    assert breaker.allow(6.0)


def test_a_failed_probe_reopens_for_a_new_open_period() -> None:
    breaker = opened(open_s=5.0)
    assert breaker.allow(5.0)
    breaker.record(False, 7.0)
    assert breaker.state is OPEN
    assert not breaker.allow(11.9)
    assert breaker.retry_at(8.0) == 12.0
    assert breaker.allow(12.0)
    assert breaker.state is HALF_OPEN


def test_several_probes_must_all_succeed() -> None:
    breaker = opened(open_s=5.0, probes=3)
    assert [breaker.allow(5.0) for _ in range(4)] == [True, True, True, False]
    breaker.record(True, 5.5)
    assert breaker.state is HALF_OPEN
    assert breaker.allow(5.5)  # a slot came free: a fourth probe may go
    breaker.record(True, 5.6)
    assert breaker.state is HALF_OPEN
    breaker.record(True, 5.7)
    assert breaker.state is CLOSED


def test_one_failed_probe_of_several_reopens_and_late_probe_outcomes_are_ignored() -> None:
    breaker = opened(open_s=5.0, probes=2)
    assert breaker.allow(5.0)
    assert breaker.allow(5.0)
    breaker.record(True, 5.1)
    breaker.record(False, 5.2)
    assert breaker.state is OPEN
    breaker.record(True, 5.3)  # the other probe, too late
    assert breaker.state is OPEN


def test_a_lost_probe_is_forgotten_after_open_s() -> None:
    breaker = opened(open_s=5.0)
    assert breaker.allow(5.0)  # this probe's outcome never comes (its task died)
    assert not breaker.allow(9.99)
    assert breaker.retry_at(9.0) == 10.0  # when the lost probe is given up
    assert breaker.allow(10.0)
    assert breaker.state is HALF_OPEN
    breaker.record(True, 10.5)
    assert breaker.state is CLOSED


def test_retry_at_is_now_while_a_probe_slot_is_free() -> None:
    breaker = opened(open_s=5.0, probes=2)
    assert breaker.allow(5.0)
    assert breaker.retry_at(5.0) == 5.0
    assert breaker.allow(5.0)
    assert breaker.retry_at(5.0) == 10.0


def test_an_outcome_with_no_probe_out_is_ignored_while_half_open() -> None:
    breaker = opened(open_s=5.0, probes=2)
    assert breaker.allow(5.0)
    breaker.record(True, 5.1)  # one probe succeeded, none is out, one more success is needed
    breaker.record(False, 5.2)  # a call allowed before the breaker opened, answering late
    assert breaker.state is HALF_OPEN
    assert breaker.allow(5.3)
    breaker.record(True, 5.4)
    assert breaker.state is CLOSED


def test_started_tells_a_pre_open_call_from_a_probe() -> None:
    breaker = opened(now=0.0, open_s=5.0)
    assert breaker.allow(5.0)
    breaker.record(False, 6.0, started=0.0)  # a call allowed before the breaker opened
    assert breaker.state is HALF_OPEN
    assert not breaker.allow(6.0)  # and it did not take the probe's place
    breaker.record(True, 6.5, started=5.0)
    assert breaker.state is CLOSED


def test_closing_clears_the_window() -> None:
    breaker = CircuitBreaker(min_calls=4, open_s=1.0)
    record(breaker, "..xx", 0.0)
    assert breaker.state is OPEN
    assert breaker.allow(1.0)
    breaker.record(True, 1.0)
    assert breaker.window(1.0) == (0, 0)


# -- transitions --------------------------------------------------------------------------------------------
def test_on_change_sees_every_transition_in_order() -> None:
    seen = Transitions()
    breaker = CircuitBreaker(min_calls=2, open_s=5.0, on_change=seen)
    record(breaker, "xx", 0.0)
    assert not breaker.allow(1.0)
    assert breaker.allow(5.0)
    breaker.record(False, 5.5)
    assert breaker.allow(10.5)
    breaker.record(True, 11.0)
    assert seen.seen == [
        (CLOSED, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, CLOSED),
    ]
    assert breaker.state == "closed"  # a StrEnum: logs and metrics labels read well


def test_a_refused_call_in_half_open_is_no_transition() -> None:
    seen = Transitions()
    breaker = CircuitBreaker(min_calls=1, open_s=1.0, on_change=seen)
    record(breaker, "x", 0.0)
    assert breaker.allow(1.0)
    assert not breaker.allow(1.5)
    assert seen.seen == [(CLOSED, OPEN), (OPEN, HALF_OPEN)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failure_rate": 0.0},
        {"failure_rate": 1.5},
        {"window_s": 0.0},
        {"min_calls": 0},
        {"open_s": 0.0},
        {"probes": 0},
    ],
)
def test_invalid_settings_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(**kwargs)  # type: ignore[arg-type]


def test_a_run_of_failures_opens_even_after_many_successes() -> None:
    """At high throughput the window is full of successes: min_calls failures in a row open it at once."""
    breaker = CircuitBreaker(failure_rate=0.5, window_s=10.0, min_calls=5)
    for n in range(500):
        record(breaker, ".", n * 0.01)
    record(breaker, "xxxx", 5.0)
    assert breaker.state is CLOSED  # 4 of 504: neither the rate nor the run
    record(breaker, ".xxxx", 5.1)
    assert breaker.state is CLOSED  # a success broke the run
    record(breaker, "x", 5.2)
    assert breaker.state is OPEN
