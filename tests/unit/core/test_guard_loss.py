"""The share of 429s that name no bucket: congestion above a threshold, and the test of a cut (does the share
fall with the pace?)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamproc.core.guards.loss import HIGHEST_THRESHOLD, THRESHOLD, WINDOW_CALLS, LossShare, LossSignal

CALLS = 50  # windows of 50 calls in these tests: the shares read as whole percents


def window(loss: LossShare, refused: int, calls: int = CALLS, *, at: float = 0.0) -> LossSignal | None:
    """``calls`` answered calls sent and answered at ``at``, the first ``refused`` of them refused."""
    signals = [loss.record(i < refused, at, at) for i in range(calls)]
    assert all(signal is None for signal in signals[:-1])  # a window speaks when its last call closes it
    return signals[-1]


def binomial_tail(calls: int, share: float, at_least: int) -> float:
    return sum(math.comb(calls, k) * share**k * (1 - share) ** (calls - k) for k in range(at_least, calls + 1))


def test_a_share_at_or_under_the_threshold_says_nothing() -> None:
    loss = LossShare(CALLS)
    assert window(loss, refused=5) is None  # 10 %: not above it
    assert window(loss, refused=0) is None
    assert not loss.testing


def test_a_share_above_the_threshold_is_congestion_and_starts_a_test() -> None:
    loss = LossShare(CALLS)
    assert window(loss, refused=6) == LossSignal("congestion", 0.12)
    assert loss.testing


def test_a_share_that_falls_by_half_keeps_the_cut() -> None:
    loss = LossShare(CALLS)
    window(loss, refused=20, at=1.0)  # 40 %
    assert window(loss, refused=4, at=2.0) == LossSignal("fallen", 0.08)
    assert not loss.testing and loss.threshold == THRESHOLD


def test_a_share_that_does_not_fall_asks_for_a_deeper_cut_then_is_the_servers_own() -> None:
    loss = LossShare(CALLS)
    window(loss, refused=10, at=1.0)  # 20 %, whatever the pace
    assert window(loss, refused=9, at=2.0) == LossSignal("deeper", 0.18)
    assert window(loss, refused=11, at=3.0) == LossSignal("noise", 0.22)
    assert loss.threshold == pytest.approx((0.2 + 0.22) / 2 + THRESHOLD)  # above the server's own level
    assert window(loss, refused=12, at=4.0) is None  # 24 % is that level now, not congestion


def test_a_share_that_fell_but_is_still_above_the_threshold_is_congestion_again() -> None:
    loss = LossShare(CALLS)
    window(loss, refused=40, at=1.0)  # 80 %: far over the server's limit
    assert window(loss, refused=15, at=2.0) == LossSignal("congestion", 0.3)
    assert loss.testing


def test_the_threshold_never_rises_past_its_ceiling() -> None:
    loss = LossShare(CALLS)
    for second in range(3):
        window(loss, refused=45, at=float(second))
    assert loss.threshold == HIGHEST_THRESHOLD


def test_calls_sent_before_a_cut_are_no_part_of_its_test() -> None:
    loss = LossShare(CALLS)
    window(loss, refused=25, at=1.0)  # the cut at 1.0
    for _ in range(3 * CALLS):  # sent before the cut, answered after it: all refused, all ignored
        assert loss.record(True, 0.5, 1.5) is None
    assert window(loss, refused=0, at=2.0) == LossSignal("fallen", 0.0)


@pytest.mark.parametrize(("calls", "threshold"), [(0, 0.1), (10, 0.0), (10, 1.0)])
def test_bad_parameters_are_refused(calls: int, threshold: float) -> None:
    with pytest.raises(ValueError):
        LossShare(calls, threshold)


def test_noise_alone_almost_never_crosses_the_threshold() -> None:
    """The figure the module's constants were chosen by: a window has more than 10 of its 100 calls refused
    about once in 10^8 at a 1 % share of noise, and once in 10^5 at 2 %."""
    assert binomial_tail(WINDOW_CALLS, 0.01, math.floor(THRESHOLD * WINDOW_CALLS) + 1) < 1e-8
    assert binomial_tail(WINDOW_CALLS, 0.02, math.floor(THRESHOLD * WINDOW_CALLS) + 1) < 1e-5


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), noise=st.floats(0.0, 0.02))
def test_noise_of_up_to_two_percent_almost_never_reads_as_congestion(seed: int, noise: float) -> None:
    """2,000 calls (a batch of the benchmark's size) with a steady noise share: no congestion at all."""
    rng = random.Random(seed)
    loss = LossShare()
    signals = [loss.record(rng.random() < noise, i / 50, i / 50 + 0.5) for i in range(2000)]
    assert [s for s in signals if s is not None] == []


def test_a_slow_start_does_not_read_refusals_that_answer_at_once_as_congestion() -> None:
    """Rounds of calls x4 a round trip (16, 64, 256, then 256 each 0.1 s), 1 in 25 refused by a 429 that answers
    at once, the others answered after the round trip: read in the order of answers, the refusals of each new
    round met the successes of the round before, a quarter its size, and 4 % read above the 10 % threshold."""
    answers: list[tuple[float, bool, float]] = []  # (answered, refused, sent)
    sent_so_far = 0
    for round_number, size in enumerate([16, 64, 256, 256, 256, 256, 256, 256]):
        for index in range(size):  # sent evenly over the round trip
            sent = 0.1 * (round_number + index / size)
            refused = sent_so_far % 25 == 0
            answers.append((sent if refused else sent + 0.1, not refused, sent))
            sent_so_far += 1
    answers.sort()  # at one moment, the refusals answer first
    loss = LossShare()
    signals = [loss.record(not answered_ok, sent, answered) for answered, answered_ok, sent in answers]
    assert [signal for signal in signals if signal is not None and signal.verdict != "fallen"] == []
