"""The retry policy: budgets per layer, tiers, jitter bounds, server hints, repair requests."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.outcome import Failure
from streamproc.core.retry_policy import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_TIERS,
    TRUNCATED,
    CompletionBudget,
    Escalation,
    Retry,
    RetryPolicy,
    Terminal,
    Tier,
    after_max_attempts,
    due_within_tier,
    full_jitter,
    never_for_business,
    plus,
    server_hint,
    within_budget,
)
from streamproc.core.vocabulary import FailureLayer

T, S, M, B = FailureLayer.TRANSPORT, FailureLayer.SERVICE, FailureLayer.SEMANTIC, FailureLayer.BUSINESS
POLICY = RetryPolicy()


def failure(layer: FailureLayer, hint_ms: int | None = None) -> Failure:
    return Failure(layer, "some_code", "message", retry_after_ms=hint_ms)


def retry_of(decision: Retry | Terminal) -> Retry:
    assert isinstance(decision, Retry), decision
    return decision


def test_default_tiers_and_budgets_are_the_designed_ones() -> None:
    assert [(t.name, t.delay_ms) for t in DEFAULT_TIERS] == [
        ("5s", 5_000),
        ("30s", 30_000),
        ("2m", 120_000),
        ("10m", 600_000),
    ]
    assert dict(DEFAULT_MAX_ATTEMPTS) == {T: 6, S: 6, M: 3, B: 1}


@pytest.mark.parametrize("attempt", [1, 2, 5])
def test_business_is_never_retried(attempt: int) -> None:
    assert POLICY.decide(failure(B, hint_ms=10), attempt, random.Random(0)) == Terminal("never_retried")


@pytest.mark.parametrize(("layer", "budget"), [(T, 6), (S, 6), (M, 3)])
def test_max_attempts_per_layer(layer: FailureLayer, budget: int) -> None:
    rng = random.Random(1)
    for attempt in range(1, budget):
        assert isinstance(POLICY.decide(failure(layer), attempt, rng), Retry), attempt
    assert POLICY.decide(failure(layer), budget, rng) == Terminal("max_attempts")
    assert POLICY.decide(failure(layer), budget + 1, rng) == Terminal("max_attempts")


def test_attempts_count_across_layers() -> None:
    # Three transport failures, then a semantic one on attempt 3: the semantic budget (3) is spent.
    assert POLICY.decide(failure(M), 3, random.Random(0)) == Terminal("max_attempts")


def test_attempt_numbers_start_at_one() -> None:
    with pytest.raises(ValueError, match="start at 1"):
        POLICY.decide(failure(T), 0, random.Random(0))


@pytest.mark.parametrize(
    ("delay_ms", "tier"),
    [(0, "5s"), (4_999, "5s"), (5_000, "5s"), (5_001, "30s"), (30_000, "30s"), (120_001, "10m"), (10**9, "10m")],
)
def test_tier_is_the_smallest_that_waits_long_enough(delay_ms: int, tier: str) -> None:
    assert POLICY.tier_for(delay_ms).name == tier


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5, 8, 40])
def test_full_jitter_stays_in_bounds_and_spans_them(attempt: int) -> None:
    ceiling = min(600_000, 5_000 * 2 ** (attempt - 1))
    rng = random.Random(attempt)
    draws = [POLICY.wait(failure(T), attempt, rng) for _ in range(2_000)]  # no hint: the jitter alone
    assert min(draws) >= 0
    assert max(draws) <= ceiling
    assert min(draws) < 0.05 * ceiling  # full jitter reaches down to ~0 ...
    assert max(draws) > 0.95 * ceiling  # ... and up to the exponential ceiling


def test_backoff_grows_with_the_attempt() -> None:
    def mean_due(attempt: int) -> float:
        rng = random.Random(7)
        return sum(retry_of(POLICY.decide(failure(T), attempt, rng)).due_in_ms for _ in range(2_000)) / 2_000

    means = [mean_due(n) for n in (1, 2, 3, 4, 5)]
    assert means == sorted(means)
    assert means[4] > 10 * means[0]


def test_same_seed_same_decisions() -> None:
    first = [POLICY.decide(failure(S), n, random.Random(42)) for n in range(1, 6)]
    again = [POLICY.decide(failure(S), n, random.Random(42)) for n in range(1, 6)]
    assert first == again


@pytest.mark.parametrize("hint_ms", [0, 1, 1_500, 12_000, 29_000, 125_000])
def test_never_earlier_than_the_server_hint(hint_ms: int) -> None:
    rng = random.Random(hint_ms)
    for attempt in range(1, 6):
        decision = retry_of(POLICY.decide(failure(S, hint_ms), attempt, rng))
        assert decision.due_in_ms >= hint_ms
        assert decision.tier.delay_ms >= decision.due_in_ms


def test_jitter_is_added_on_top_of_the_hint() -> None:
    rng = random.Random(3)
    dues = [retry_of(POLICY.decide(failure(S, 1_500), 1, rng)).due_in_ms for _ in range(1_000)]
    assert 1_500 <= min(dues) < 1_800
    assert 6_200 < max(dues) <= 6_500  # hint + up to the 5 s ceiling of attempt 1
    assert len(set(dues)) > 500  # the 429's retries are spread, not all at 1.5 s


def test_hint_beyond_the_largest_tier_is_clamped_to_it() -> None:
    decision = retry_of(POLICY.decide(failure(S, 3_600_000), 1, random.Random(0)))
    assert (decision.tier.name, decision.due_in_ms) == ("10m", 600_000)


def test_due_time_picks_the_smallest_sufficient_tier() -> None:
    rng = random.Random(11)
    for _ in range(2_000):
        layer = rng.choice([T, S, M])
        hint = rng.choice([None, rng.randrange(0, 700_000)])
        decision = POLICY.decide(failure(layer, hint), rng.randrange(1, 3), rng)
        assert isinstance(decision, Retry)
        smaller = [t for t in DEFAULT_TIERS if t.delay_ms < decision.tier.delay_ms]
        assert all(t.delay_ms < decision.due_in_ms for t in smaller)
        assert decision.due_in_ms <= decision.tier.delay_ms


def test_semantic_retries_are_repairs() -> None:
    rng = random.Random(0)
    assert retry_of(POLICY.decide(failure(M), 1, rng)).repair is True
    assert retry_of(POLICY.decide(failure(M), 2, rng)).repair is True
    assert retry_of(POLICY.decide(failure(T), 1, rng)).repair is False
    assert retry_of(POLICY.decide(failure(S), 2, rng)).repair is False


def test_repair_can_start_later() -> None:
    policy = RetryPolicy(repair_from_attempt=3)
    rng = random.Random(0)
    assert retry_of(policy.decide(failure(M), 1, rng)).repair is False  # the 2nd try is a plain retry
    assert retry_of(policy.decide(failure(M), 2, rng)).repair is True  # the 3rd is a repair


def test_custom_tiers() -> None:
    policy = RetryPolicy(tiers=(Tier("1s", 1_000), Tier("1m", 60_000)), base_delay_ms=500)
    decision = retry_of(policy.decide(failure(T, 2_000), 1, random.Random(0)))
    assert decision.tier == Tier("1m", 60_000)
    assert 2_000 <= decision.due_in_ms <= 2_500


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"tiers": ()}, id="no-tiers"),
        pytest.param({"tiers": (Tier("a", 5_000), Tier("b", 5_000))}, id="equal-delays"),
        pytest.param({"tiers": (Tier("b", 30_000), Tier("a", 5_000))}, id="decreasing"),
        pytest.param({"tiers": (Tier("z", 0),)}, id="zero-delay"),
        pytest.param({"tiers": (Tier("a", 1_000), Tier("a", 2_000))}, id="duplicate-names"),
        pytest.param({"max_attempts": {T: 6, S: 6, M: 3, B: 2}}, id="business-retried"),
        pytest.param({"max_attempts": {T: 6, S: 6, B: 1}}, id="missing-layer"),
        pytest.param({"max_attempts": {T: 0, S: 6, M: 3, B: 1}}, id="zero-budget"),
        pytest.param({"base_delay_ms": -1}, id="negative-base"),
        pytest.param({"escalation": Escalation(doublings=6)}, id="escalations-past-the-largest-maximum"),
    ],
)
def test_invalid_policies_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


# -- escalations: more room after a cut answer ----------------------------------------------------------------
CUT = Failure(M, TRUNCATED, "finish_reason=length: the answer was cut off after 64 completion tokens", 200)


def test_an_escalation_doubles_the_budget_sent_up_to_eight_times_the_request_s_own() -> None:
    escalation = Escalation()
    assert [escalation.grown(CUT, attempt, CompletionBudget(64, sent))
            for attempt, sent in [(1, 64), (2, 128), (3, 256)]] == [128, 256, 512]
    assert escalation.grown(CUT, 2, CompletionBudget(64, 512)) is None  # at the cap
    assert escalation.grown(CUT, 1, CompletionBudget(64, 10**9)) is None  # a budget past the cap is not raised
    assert escalation.grown(CUT, 2, CompletionBudget(100, 300)) == 600


def test_an_escalation_stops_at_the_room_the_window_leaves() -> None:
    escalation = Escalation()
    assert escalation.grown(CUT, 1, CompletionBudget(64, 64, room=100)) == 100
    assert escalation.grown(CUT, 2, CompletionBudget(64, 100, room=100)) is None
    assert escalation.grown(CUT, 1, CompletionBudget(64, 64, room=0)) is None


def test_only_a_cut_answer_with_a_budget_of_its_own_is_escalated_and_only_after_the_first_attempts() -> None:
    escalation = Escalation()
    assert escalation.grown(CUT, 4, CompletionBudget(64, 64)) is None  # after the 3rd attempt: used up
    assert escalation.grown(CUT, 1, CompletionBudget(None, None)) is None  # the server's default is unknown
    assert escalation.grown(CUT, 1, None) is None
    assert escalation.grown(Failure(M, "invalid_json", "not JSON"), 1, CompletionBudget(64, 64)) is None
    assert escalation.grown(Failure(T, TRUNCATED, "a body cut off"), 1, CompletionBudget(64, 64)) is None
    assert Escalation(doublings=0).grown(CUT, 1, CompletionBudget(64, 64)) is None
    with pytest.raises(ValueError, match="doublings"):
        Escalation(doublings=-1)


def test_an_escalation_is_due_at_once_not_a_repair_and_neither_stopped_nor_charged() -> None:
    asked, spend = budget(0)
    rng = random.Random(3)
    decision = POLICY.decide(CUT, 3, rng, within_budget("b", spend), CompletionBudget(64, 256))
    assert decision == Retry(DEFAULT_TIERS[0], 0, repair=False, max_tokens=512, charged=False)
    assert asked == []  # the batch's budget was not asked; the semantic layer's 3 attempts did not stop it
    assert rng.random() == random.Random(3).random()  # and no jitter was drawn


def test_a_cut_answer_that_cannot_grow_is_a_semantic_failure_like_any_other() -> None:
    asked, spend = budget(1)
    decision = retry_of(POLICY.decide(CUT, 1, random.Random(0), within_budget("b", spend), CompletionBudget(None,
                                                                                                          None)))
    assert (decision.repair, decision.max_tokens, decision.charged) == (True, None, True)
    assert asked == [True]
    assert POLICY.decide(CUT, 4, random.Random(0), None, CompletionBudget(64, 512)) == Terminal("max_attempts")


def test_a_retry_says_whether_it_was_charged() -> None:
    assert retry_of(POLICY.decide(failure(S), 1, random.Random(0))).charged is True
    assert retry_of(POLICY.decide(Failure(S, "rate_limit_exceeded", "HTTP 429", 429), 1, random.Random(0))
                    ).charged is False


@given(st.integers(0, 5), st.integers(1, 4096), st.integers(1, 10**6), st.none() | st.integers(-100, 10**5),
       st.integers(1, 6), st.data())
def test_a_request_cut_again_and_again_is_escalated_at_most_doublings_times_never_past_its_bounds(
        doublings: int, own: int, first_sent: int, room: int | None, first_attempt: int, data: st.DataObject) -> None:
    """Whatever the request's own budget, the budget its first record carries (a header anyone may write), the room
    and the attempt the cuts start at: at most ``doublings`` escalations, each a strict raise within the cap and
    the room, and no more calls than the largest maximum of attempts."""
    policy = RetryPolicy(escalation=Escalation(doublings))
    asked, spend = budget(1)
    sent, attempt, escalations = first_sent, first_attempt, 0
    while True:
        decision = policy.decide(CUT, attempt, random.Random(0), within_budget("b", spend),
                                 CompletionBudget(own, sent, room))
        if not (isinstance(decision, Retry) and decision.max_tokens is not None):
            break
        grown = decision.max_tokens
        assert sent < grown <= min(2 * sent, own * 2 ** doublings, room if room is not None else grown)
        assert decision == Retry(policy.tiers[0], 0, repair=False, max_tokens=grown, charged=False)
        assert asked == [] and attempt + 1 <= max(DEFAULT_MAX_ATTEMPTS.values())  # the call it makes
        sent, attempt, escalations = grown, attempt + 1, escalations + 1
        if data.draw(st.booleans()):  # a transport failure between two cuts carries the budget on
            attempt += 1
    assert escalations <= doublings


# -- the pieces the decision is made of ----------------------------------------------------------------------


def test_never_for_business_stops_business_failures_only() -> None:
    assert never_for_business(failure(B), 1) == Terminal("never_retried")
    assert [never_for_business(failure(layer), 5) for layer in (T, S, M)] == [None, None, None]


def test_after_max_attempts_stops_at_the_layer_s_budget() -> None:
    stop = after_max_attempts({T: 2, S: 4, M: 3, B: 1})
    assert stop(failure(T), 1) is None
    assert stop(failure(T), 2) == Terminal("max_attempts")
    assert stop(failure(S), 3) is None


def test_server_hint_is_the_retry_after_or_zero() -> None:
    rng = random.Random(0)
    assert server_hint()(failure(S, 1_500), 1, rng) == 1_500
    assert server_hint()(failure(S), 1, rng) == 0


def test_full_jitter_doubles_its_ceiling_up_to_the_cap() -> None:
    jitter = full_jitter(100, 1_000)
    for attempt, ceiling in [(1, 100), (2, 200), (4, 800), (5, 1_000), (60, 1_000)]:
        rng = random.Random(attempt)
        draws = [jitter(failure(T), attempt, rng) for _ in range(500)]
        assert min(draws) >= 0 and max(draws) <= ceiling
        assert max(draws) > 0.9 * ceiling


def test_plus_adds_the_waits_drawn_in_order() -> None:
    jitter = full_jitter(5_000, 600_000)
    assert plus(server_hint(), jitter)(failure(S, 1_500), 1, random.Random(9)) == 1_500 + jitter(
        failure(S), 1, random.Random(9))


def test_the_policy_s_wait_is_full_jitter_capped_at_the_largest_tier_on_top_of_the_hint() -> None:
    wait = plus(server_hint(), full_jitter(5_000, 600_000))
    for attempt in (1, 3, 12):
        assert wait(failure(S, 1_500), attempt, random.Random(attempt)) == POLICY.wait(
            failure(S, 1_500), attempt, random.Random(attempt))


def budget(allowed: int) -> tuple[list[bool], Callable[[], bool]]:
    """A spend function that allows ``allowed`` retries, recording each ask."""
    asked: list[bool] = []

    def spend() -> bool:
        asked.append(len(asked) < allowed)
        return asked[-1]

    return asked, spend


def test_within_budget_goes_on_while_the_budget_allows() -> None:
    asked, spend = budget(1)
    stop = within_budget("b-1", spend)
    assert stop(failure(S), 1) is None
    stopped = stop(Failure(S, "server_error", "HTTP 503", http_status=503, retry_after_ms=2_000), 1)
    assert stopped is not None and stopped.reason == "retry_budget_exhausted"
    assert stopped.failure == Failure(
        S, "retry_budget_exhausted",
        "server_error, not retried: the retry budget of batch 'b-1' is spent (backfill can replay it): HTTP 503",
        503, 2_000)
    assert asked == [True, False]


def test_a_rate_limit_429_spends_no_budget() -> None:
    """The limiter paces 429s: they must not starve the retries of requests that failed for real."""
    asked, spend = budget(0)
    stop = within_budget("b", spend)
    assert stop(Failure(S, "rate_limit_exceeded", "HTTP 429", http_status=429), 3) is None
    assert asked == []
    assert isinstance(POLICY.decide(Failure(S, "rate_limit_exceeded", "HTTP 429", 429), 5, random.Random(0), stop),
                      Retry)
    assert POLICY.decide(Failure(S, "rate_limit_exceeded", "HTTP 429", 429), 6, random.Random(0), stop) == Terminal(
        "max_attempts")  # the layer's attempts still bound it


def test_the_exhausted_message_is_cut_to_a_thousand_characters() -> None:
    stopped = within_budget("b", lambda: False)(Failure(S, "server_error", "x" * 2_000), 1)
    assert stopped is not None and stopped.failure is not None and len(stopped.failure.message) == 1_000


def test_the_budget_is_asked_only_when_a_retry_would_otherwise_happen() -> None:
    asked, spend = budget(0)
    stop = within_budget("b", spend)
    assert POLICY.decide(failure(B), 1, random.Random(0), stop) == Terminal("never_retried")
    assert POLICY.decide(failure(M), 3, random.Random(0), stop) == Terminal("max_attempts")
    assert asked == []
    decision = POLICY.decide(failure(S), 1, random.Random(0), stop)
    assert isinstance(decision, Terminal) and decision.reason == "retry_budget_exhausted"
    assert asked == [False]


def test_a_budget_that_allows_changes_nothing_and_draws_alike() -> None:
    _, spend = budget(100)
    with_budget, without = random.Random(5), random.Random(5)
    for attempt in (1, 2, 3):
        assert (POLICY.decide(failure(T, 700), attempt, with_budget, within_budget("b", spend))
                == POLICY.decide(failure(T, 700), attempt, without))


def test_a_spent_budget_draws_the_jitter_as_a_retry_would() -> None:
    """The wait is drawn before the budget is asked, so a shared rng goes on with the same sequence."""
    spent, fresh = random.Random(5), random.Random(5)
    POLICY.decide(failure(T), 1, spent, within_budget("b", lambda: False))
    POLICY.decide(failure(T), 1, fresh)
    assert spent.random() == fresh.random()


def test_a_tier_record_runs_at_its_due_time_but_never_later_than_one_tier_after_it_was_written() -> None:
    tier = Tier("5s", 5_000)
    assert due_within_tier(1_003_000, 1_000_000, tier) == 1_003_000
    assert due_within_tier(9_999_999_999_999, 1_000_000, tier) == 1_005_000  # far-future: clamped
    assert due_within_tier(-5, 1_000_000, tier) == -5  # in the past: at once
    assert due_within_tier(None, 1_000_000, tier) == 0
