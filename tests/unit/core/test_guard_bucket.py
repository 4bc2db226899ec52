"""The reservation token bucket: refill, debt, FIFO waits, rate changes and pauses, on a fake clock."""

from __future__ import annotations

import math

import pytest

from streamproc.core.guards.bucket import TokenBucket


def test_starts_full_and_admits_up_to_capacity_without_waiting() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=5, now=0.0)
    assert bucket.level(0.0) == 5
    assert [bucket.reserve(1, 0.0) for _ in range(5)] == [0.0] * 5
    assert bucket.level(0.0) == 0


def test_reservations_beyond_the_level_wait_in_order() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=2, now=0.0)
    waits = [bucket.reserve(1, 0.0) for _ in range(5)]
    assert waits == pytest.approx([0.0, 0.0, 0.1, 0.2, 0.3])  # FIFO: each one queued behind the previous


def test_a_cost_bigger_than_the_capacity_goes_into_debt() -> None:
    bucket = TokenBucket(rate_per_s=100, capacity=10, now=0.0)
    assert bucket.reserve(60, 0.0) == pytest.approx(0.5)  # 50 tokens of debt at 100/s
    assert bucket.level(0.0) == pytest.approx(-50)
    assert bucket.reserve(1, 0.25) == pytest.approx(0.26)  # behind the big one: -25 - 1 = -26


def test_refill_is_linear_and_capped_at_the_capacity() -> None:
    bucket = TokenBucket(rate_per_s=4, capacity=8, now=0.0)
    bucket.reserve(8, 0.0)
    assert bucket.level(1.0) == pytest.approx(4)
    assert bucket.level(100.0) == 8


def test_debt_is_repaid_at_the_rate() -> None:
    bucket = TokenBucket(rate_per_s=2, capacity=1, now=0.0)
    bucket.reserve(5, 0.0)  # level -4: two seconds of debt
    assert bucket.reserve(0, 1.0) == pytest.approx(1.0)
    assert bucket.reserve(0, 2.0) == 0.0
    assert bucket.reserve(1, 2.5) == 0.0  # level back at +1 after 2.5 s, enough for 1


def test_a_stale_clock_does_not_move_time_backwards() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=1, now=0.0)
    bucket.reserve(1, 1.0)
    bucket.reserve(0, 0.5)  # an older "now" from a caller that read the clock earlier
    assert bucket.level(1.0) == pytest.approx(0)  # not refilled twice for 0.5..1.0
    assert bucket.level(1.1) == pytest.approx(1)


def test_zero_cost_reports_the_current_queue() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=1, now=0.0)
    bucket.reserve(3, 0.0)
    assert bucket.reserve(0, 0.0) == pytest.approx(0.2)
    assert bucket.level(0.0) == pytest.approx(-2)


def test_tiny_float_debt_is_no_wait() -> None:
    bucket = TokenBucket(rate_per_s=3, capacity=1, now=0.0)
    bucket.reserve(1, 0.0)
    assert bucket.reserve(1, 1 / 3) == 0.0  # level is 1e-17-ish below zero, which is not a reason to sleep


def test_set_rate_refills_at_the_old_rate_first() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=100, now=0.0)
    bucket.reserve(100, 0.0)
    bucket.set_rate(1, 100, now=2.0)  # 20 refilled at the old rate up to t=2
    assert bucket.level(2.0) == pytest.approx(20)
    assert bucket.level(4.0) == pytest.approx(22)  # then 1/s
    assert bucket.rate_per_s == 1


def test_set_rate_clamps_the_level_to_a_smaller_capacity() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=100, now=0.0)
    bucket.set_rate(10, 5, now=0.0)
    assert bucket.capacity == 5
    assert bucket.level(0.0) == 5
    assert bucket.level(10.0) == 5  # and refill stops at the new capacity


def test_set_rate_keeps_debt_which_is_then_repaid_at_the_new_rate() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=1, now=0.0)
    bucket.reserve(11, 0.0)  # -10: one second at 10/s
    bucket.set_rate(5, 1, now=0.0)
    assert bucket.level(0.0) == pytest.approx(-10)
    assert bucket.reserve(0, 0.0) == pytest.approx(2.0)  # two seconds at 5/s


def test_set_rate_to_a_larger_capacity_does_not_fill_the_bucket() -> None:
    bucket = TokenBucket(rate_per_s=1, capacity=1, now=0.0)
    bucket.set_rate(100, 50, now=0.0)
    assert bucket.level(0.0) == 1
    assert bucket.level(0.1) == pytest.approx(11)


def test_pause_until_admits_nothing_before_then() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=5, now=0.0)
    bucket.pause_until(2.0, now=0.0)
    assert bucket.level(0.0) == pytest.approx(-20)
    assert bucket.reserve(1, 0.0) == pytest.approx(2.1)  # after the pause, and behind its own cost
    assert bucket.reserve(1, 2.0) == pytest.approx(0.2)  # the queue continues after the pause


def test_pause_never_shortens_a_longer_queue() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=1, now=0.0)
    bucket.reserve(51, 0.0)  # five seconds of debt
    bucket.pause_until(1.0, now=0.0)
    assert bucket.reserve(0, 0.0) == pytest.approx(5.0)


def test_pause_in_the_past_changes_nothing() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=100, now=0.0)
    bucket.pause_until(-1.0, now=0.0)
    bucket.pause_until(0.0, now=0.0)
    assert bucket.level(0.0) == 100


def test_pause_refills_first() -> None:
    bucket = TokenBucket(rate_per_s=10, capacity=10, now=0.0)
    bucket.reserve(10, 0.0)
    bucket.pause_until(5.0, now=5.0)  # refilled to 10 by t=5; a pause ending now does nothing
    assert bucket.level(5.0) == 10


@pytest.mark.parametrize(("rate", "capacity"), [(0, 1), (-1, 1), (1, 0), (math.inf, 1), (1, math.nan)])
def test_invalid_rates_and_capacities_are_rejected(rate: float, capacity: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, capacity, now=0.0)
    bucket = TokenBucket(1, 1, now=0.0)
    with pytest.raises(ValueError):
        bucket.set_rate(rate, capacity, now=0.0)


@pytest.mark.parametrize("cost", [-1.0, math.nan, math.inf])
def test_invalid_costs_are_rejected(cost: float) -> None:
    bucket = TokenBucket(1, 1, now=0.0)
    with pytest.raises(ValueError):
        bucket.reserve(cost, 0.0)
    assert bucket.level(0.0) == 1  # and nothing was taken


def test_one_huge_reservation_owes_at_most_a_minute_of_the_rate() -> None:
    """max_tokens of 10^9 against 2M TPM used to owe ~8 hours and stall every later call of the model."""
    bucket = TokenBucket(rate_per_s=2_000_000 / 60, capacity=2_000_000 / 60, now=0.0)
    assert bucket.reserve(1e9, 0.0) == pytest.approx(59.0)  # a full bucket, then 59 s of debt
    assert bucket.reserve(100, 0.0) == pytest.approx(59.003)
