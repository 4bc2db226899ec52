"""The per-model limiter: configured and advertised limits, share, pacing, and 429 congestion vs refusal."""

from __future__ import annotations

import math

import pytest

from streamproc.core.guards.rate_limits import ModelRateLimiter, RateLimited, RateLimiter, RateLimits


def exhausted_tokens(remaining: int = 0, reset: str = "6s") -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "599",
        "x-ratelimit-reset-requests": "100ms",
        "x-ratelimit-limit-tokens": "60000",
        "x-ratelimit-remaining-tokens": str(remaining),
        "x-ratelimit-reset-tokens": reset,
    }


# -- limits -------------------------------------------------------------------------------------------------
def test_no_known_limit_never_waits() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    assert limiter.limits == RateLimits(None, None)
    assert all(limiter.reserve(100_000, 0.0) == 0.0 for _ in range(1000))


def test_configured_limits_are_scaled_by_the_share() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=600, tpm=60_000), share=0.25, now=0.0)
    assert limiter.limits == RateLimits(rpm=150, tpm=15_000)


def test_requests_are_paced_at_the_share_of_the_rate_after_a_small_burst() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=1200), share=0.5, now=0.0)  # 10/s; capacity max(1, 1) = 1
    waits = [limiter.reserve(0, 0.0) for _ in range(4)]
    assert waits == pytest.approx([0.0, 0.1, 0.2, 0.3])


def test_the_burst_is_a_tenth_of_a_second_of_traffic() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=60_000), share=1.0, now=0.0)  # 1000/s: capacity 100
    waits = [limiter.reserve(0, 0.0) for _ in range(101)]
    assert waits[:100] == [0.0] * 100
    assert waits[100] == pytest.approx(0.001)


def test_a_longer_burst_window_can_be_configured() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=600), share=1.0, now=0.0, burst_s=1.0)  # 10/s: capacity 10
    assert [limiter.reserve(0, 0.0) for _ in range(11)][-2:] == pytest.approx([0.0, 0.1])


def test_tokens_are_paced_and_the_slower_bucket_decides() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=6000, tpm=60_000), share=1.0, now=0.0)  # 100 req/s, 1000 tok/s
    assert limiter.reserve(100, 0.0) == 0.0  # the tokens bucket holds 100
    assert limiter.reserve(500, 0.0) == pytest.approx(0.5)
    assert limiter.reserve(1, 0.0) == pytest.approx(0.501)


def test_a_call_larger_than_the_bucket_is_admitted_after_its_own_debt() -> None:
    limiter = ModelRateLimiter(RateLimits(tpm=6000), share=1.0, now=0.0)  # 100 tok/s, capacity 10
    assert limiter.reserve(1010, 0.0) == pytest.approx(10.0)


def test_negative_token_counts_cost_nothing() -> None:
    limiter = ModelRateLimiter(RateLimits(tpm=6000), share=1.0, now=0.0)
    limiter.reserve(-50, 0.0)
    assert limiter.reserve(10, 0.0) == 0.0


def test_an_advertised_limit_is_adopted_when_none_was_configured() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=0.5, now=0.0)
    limiter.observe({"x-ratelimit-limit-requests": "600", "x-ratelimit-limit-tokens": "90000"}, now=0.0)
    assert limiter.limits == RateLimits(rpm=300, tpm=45_000)
    assert limiter.reserve(0, 0.0) == 0.0
    assert limiter.reserve(0, 0.0) == pytest.approx(0.2)  # 5/s, capacity 1


def test_the_lower_of_configured_and_advertised_wins() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=100, tpm=1_000_000), share=1.0, now=0.0)
    limiter.observe({"x-ratelimit-limit-requests": "600", "x-ratelimit-limit-tokens": "90000"}, now=0.0)
    assert limiter.limits == RateLimits(rpm=100, tpm=90_000)


def test_the_latest_advertised_limit_counts() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    limiter.observe({"x-ratelimit-limit-requests": "600"}, now=0.0)
    limiter.observe({"x-ratelimit-limit-requests": "60"}, now=1.0)
    limiter.observe({"x-ratelimit-limit-tokens": "1000"}, now=2.0)  # tokens only: requests stays
    assert limiter.limits == RateLimits(rpm=60, tpm=1000)


def test_header_keys_are_matched_in_any_case() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    limiter.observe({"X-RateLimit-Limit-Requests": "120"}, now=0.0)
    assert limiter.limits.rpm == 120


@pytest.mark.parametrize("value", ["", "many", "-5", "0", "nan", "inf", "1e999"])
def test_garbage_limit_headers_are_ignored(value: str) -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=100), share=1.0, now=0.0)
    limiter.observe({"x-ratelimit-limit-requests": value, "x-ratelimit-limit-tokens": value}, now=0.0)
    assert limiter.limits == RateLimits(rpm=100, tpm=None)


def test_a_lower_advertised_limit_keeps_the_debt_and_slows_its_repayment() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=1200), share=1.0, now=0.0)  # 20/s, capacity 2
    for _ in range(12):
        limiter.reserve(0, 0.0)  # level 2 - 12 = -10: 0.5 s at 20/s
    limiter.observe({"x-ratelimit-limit-requests": "600"}, now=0.0)  # 10/s
    assert limiter.reserve(0, 0.0) == pytest.approx(1.1)  # -11 at 10/s


def test_time_before_a_rate_change_refills_at_the_old_rate() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    limiter.observe({"x-ratelimit-limit-requests": "600"}, now=0.0)  # 10/s, capacity 1
    assert limiter.reserve(0, 0.0) == 0.0
    assert limiter.reserve(0, 0.0) == pytest.approx(0.1)  # level -1
    limiter.observe({"x-ratelimit-limit-requests": "60"}, now=0.1)  # refilled to 0 at 10/s, then 1/s
    assert limiter.reserve(0, 0.1) == pytest.approx(1.0)


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_the_share_must_be_in_zero_one(share: float) -> None:
    with pytest.raises(ValueError):
        ModelRateLimiter(RateLimits(), share=share, now=0.0)
    with pytest.raises(ValueError):
        RateLimiter(RateLimits(), share=share)


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_configured_limits_must_be_positive(value: float) -> None:
    with pytest.raises(ValueError):
        RateLimits(rpm=value)
    with pytest.raises(ValueError):
        RateLimits(tpm=value)


def test_burst_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ModelRateLimiter(RateLimits(), share=1.0, now=0.0, burst_s=0.0)


# -- 429s ---------------------------------------------------------------------------------------------------
EMPTY_REQUESTS = {"x-ratelimit-remaining-requests": "0"}


def test_exhausted_requests_are_congestion_and_pause_until_the_requests_reset() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=600, tpm=600_000), share=1.0, now=0.0)
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s",
               "x-ratelimit-remaining-tokens": "5000", "x-ratelimit-reset-tokens": "30s"}
    assert limiter.on_rate_limited(headers, None, tokens=100, now=10.0) == RateLimited(True, 0.0)
    assert limiter.paused_until == pytest.approx(11.5)
    assert limiter.reserve(0, 10.0) >= 1.5
    assert limiter.reserve(0, 10.0) == pytest.approx(1.5 + 2 / 9, abs=1e-6)  # paced after the pause, at 0.9 x 10/s


def test_too_few_remaining_tokens_are_congestion_and_pause_until_the_tokens_reset() -> None:
    limiter = ModelRateLimiter(RateLimits(tpm=60_000), share=1.0, now=0.0)
    assert limiter.on_rate_limited(exhausted_tokens(remaining=499, reset="1m30s"), None, tokens=500, now=0.0).congestion
    assert limiter.paused_until == pytest.approx(90.0)
    assert limiter.reserve(1, 0.0) == pytest.approx(90.0, abs=0.01)


def test_when_both_are_exhausted_the_longer_reset_wins() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=60), share=1.0, now=0.0)
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "120ms",
               "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "6m0s"}
    assert limiter.on_rate_limited(headers, None, tokens=1, now=0.0).congestion
    assert limiter.paused_until == pytest.approx(360.0)


def test_retry_after_wins_over_the_reset_headers() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=60), share=1.0, now=0.0)
    assert limiter.on_rate_limited(exhausted_tokens(reset="6s"), 2.5, tokens=10, now=1.0).congestion
    assert limiter.paused_until == pytest.approx(3.5)


def test_a_zero_retry_after_is_a_real_hint() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    assert limiter.on_rate_limited(EMPTY_REQUESTS, 0.0, tokens=10, now=5.0).congestion
    assert limiter.paused_until == 5.0
    assert limiter.on_rate_limited({}, 0.0, tokens=10, now=6.0) == RateLimited(False, 0.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_an_unusable_retry_after_falls_back_to_the_reset(bad: float) -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    assert limiter.on_rate_limited(exhausted_tokens(reset="2s"), bad, tokens=10, now=0.0).congestion
    assert limiter.paused_until == pytest.approx(2.0)


def test_a_429_that_names_no_bucket_pauses_only_its_call_for_its_hint_or_a_second() -> None:
    """One such 429 may be the server's own refusal: the model goes on at its pace (the share decides)."""
    limiter = ModelRateLimiter(RateLimits(rpm=6000), share=1.0, now=0.0)
    assert limiter.on_rate_limited({"retry-after": "3"}, 3.0, tokens=10, now=0.0) == RateLimited(False, 3.0)
    assert limiter.on_rate_limited({"content-type": "application/json"}, None, tokens=10, now=0.0) == RateLimited(
        False, 1.0)
    assert limiter.paused_until == -math.inf
    assert limiter.pace == 1.0
    assert limiter.reserve(0, 0.0) == 0.0


def test_garbage_remaining_headers_count_as_absent() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    headers = {"x-ratelimit-remaining-requests": "lots", "x-ratelimit-reset-requests": "3s"}
    assert limiter.on_rate_limited(headers, None, tokens=10, now=0.0) == RateLimited(False, 1.0)
    assert limiter.paused_until == -math.inf


@pytest.mark.parametrize("reset", ["soon", "", "-3s", "1x"])
def test_a_garbage_reset_falls_back_to_one_second(reset: str) -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    assert limiter.on_rate_limited(exhausted_tokens(reset=reset), None, tokens=10, now=0.0).congestion
    assert limiter.paused_until == pytest.approx(1.0)


def test_a_429_while_buckets_have_room_is_a_refusal_of_that_call_alone() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=600), share=1.0, now=0.0)
    headers = {"x-ratelimit-remaining-requests": "599", "x-ratelimit-remaining-tokens": "59000",
               "x-ratelimit-reset-tokens": "6s"}
    assert limiter.on_rate_limited(headers, 6.0, tokens=500, now=0.0) == RateLimited(False, 6.0)
    assert limiter.paused_until == -math.inf
    assert limiter.reserve(0, 0.0) == 0.0


def test_only_the_remaining_header_present_decides() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    assert not limiter.on_rate_limited({"x-ratelimit-remaining-tokens": "10"}, None, tokens=10, now=0.0).congestion
    assert limiter.on_rate_limited({"x-ratelimit-remaining-tokens": "9"}, None, tokens=10, now=0.0).congestion
    assert not limiter.on_rate_limited({"x-ratelimit-remaining-requests": "1"}, None, tokens=10, now=0.0).congestion


def test_a_pause_applies_even_with_no_limit_known_and_a_pace_is_learnt() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    assert limiter.on_rate_limited(EMPTY_REQUESTS, 2.0, tokens=10, now=0.0).congestion
    assert limiter.reserve(10, 0.5) == pytest.approx(1.5 + 1 / 0.9)  # nothing was sent: 1/s, cut to 0.9/s
    limiter.reserve(10, 2.0)
    assert limiter.pace == pytest.approx(0.9)  # no climb during the pause ...
    limiter.reserve(10, 3.0)
    assert limiter.pace == pytest.approx(0.99)  # ... then x1.1 a second


def test_a_limit_learnt_during_a_pause_does_not_end_it() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    assert limiter.on_rate_limited(EMPTY_REQUESTS, 5.0, tokens=10, now=0.0).congestion
    limiter.observe({"x-ratelimit-limit-requests": "600"}, now=0.0)  # a fresh bucket would start full
    assert limiter.reserve(0, 0.0) == pytest.approx(5 + 1 / 9)  # the call's own request is paid after the pause
    assert limiter.reserve(0, 0.0) == pytest.approx(5 + 2 / 9)  # at 0.9 x 10/s


def test_a_shorter_pause_never_shortens_a_longer_one() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    limiter.on_rate_limited(EMPTY_REQUESTS, 10.0, tokens=1, now=0.0)
    limiter.on_rate_limited(EMPTY_REQUESTS, 1.0, tokens=1, now=0.0)
    assert limiter.paused_until == 10.0


def test_a_pause_ends_on_time() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=60_000), share=1.0, now=0.0)
    limiter.on_rate_limited(EMPTY_REQUESTS, 1.0, tokens=1, now=0.0)
    assert limiter.reserve(0, 1.0) == pytest.approx(1 / 900)  # the paused slot, at 0.9 x 1000/s
    assert limiter.reserve(0, 3.0) == 0.0  # refilled


# -- the pace: cut on congestion, quickly back to the last good pace -----------------------------------------
def test_congestion_cuts_the_pace_once_a_second_and_it_climbs_back_quickly() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=6000), share=1.0, now=0.0)
    limiter.on_rate_limited(EMPTY_REQUESTS, 0.0, tokens=1, now=10.0)
    limiter.on_rate_limited(EMPTY_REQUESTS, 0.0, tokens=1, now=10.5)  # the same burst of 429s: one cut
    assert limiter.pace == pytest.approx(0.9)
    limiter.reserve(0, 11.2)  # 1.2 s later: x1.1 a second reached the pace before the cut
    assert limiter.pace == 1.0 and limiter.limits == RateLimits(rpm=6000)  # never above the known limit


def test_congestion_again_soon_after_a_cut_lowers_the_good_pace() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=6000), share=1.0, now=0.0)
    limiter.on_rate_limited(EMPTY_REQUESTS, 0.0, tokens=1, now=10.0)
    limiter.on_rate_limited(EMPTY_REQUESTS, 0.0, tokens=1, now=11.0)  # 1.0 then 0.9 met congestion
    assert limiter.pace == pytest.approx(0.81)
    recovering_s = math.log(0.9 * 0.95 / 0.81) / math.log(1.1)  # back quickly to 95 % of the pace that met it again
    limiter.reserve(0, 11.0 + recovering_s)
    assert limiter.pace == pytest.approx(0.855)
    limiter.reserve(0, 21.0 + recovering_s)
    assert limiter.pace == pytest.approx(0.955)  # then 1 % of the limit a second
    limiter.reserve(0, 40.0)
    assert limiter.pace == 1.0


def test_the_pace_has_a_floor() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=6000), share=1.0, now=0.0)
    for second in range(100):
        limiter.on_rate_limited(EMPTY_REQUESTS, 0.0, tokens=1, now=float(second))
    assert limiter.pace == pytest.approx(0.1)


def test_with_no_limit_known_congestion_learns_the_rate_sent_and_probes_beyond_it() -> None:
    """A server that sends x-ratelimit-* only on its 429s, and this one named no limit: pace at what got through."""
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    for i in range(500):  # 100 calls/s for 5 s, 20 tokens each
        assert limiter.reserve(20, i / 100) == 0.0
    assert limiter.on_rate_limited(EMPTY_REQUESTS, 0.0, tokens=20, now=5.0).congestion
    assert limiter.limits.rpm == pytest.approx(6000, rel=0.01)  # the rate sent, per minute
    assert limiter.limits.tpm == pytest.approx(120_000, rel=0.01)
    assert limiter.pace == pytest.approx(0.9)
    limiter.reserve(0, 35.0)  # 30 s without congestion: back to the full rate, then beyond it
    assert limiter.pace == 1.0 and limiter.limits.rpm is not None and limiter.limits.rpm > 6000 * 1.1


def test_a_rate_sent_beyond_what_is_kept_is_still_learnt_from_the_newest_sends() -> None:
    """2,000 calls/s for 5 s: more sends than are kept; the newest span less time, at the same rate."""
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    for i in range(10_000):
        limiter.reserve(10, i / 2000)
    assert limiter.on_rate_limited(EMPTY_REQUESTS, 0.0, tokens=10, now=5.0).congestion
    assert limiter.limits.rpm == pytest.approx(120_000, rel=0.01)
    assert limiter.limits.tpm == pytest.approx(1_200_000, rel=0.01)


def test_an_advertised_limit_replaces_a_learnt_one() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    limiter.on_rate_limited(EMPTY_REQUESTS, 0.0, tokens=1, now=1.0)
    limiter.observe({"x-ratelimit-limit-requests": "3000"}, now=1.0)
    assert limiter.limits == RateLimits(rpm=3000)


# -- hedges go through the limiter ---------------------------------------------------------------------------
def test_a_hedge_is_charged_like_any_call_and_goes_at_once() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=600), share=1.0, now=0.0)  # 10/s, capacity 1
    assert limiter.reserve(0, 0.0) == 0.0
    assert limiter.reserve(0, 0.0) == pytest.approx(0.1)
    assert limiter.charge_hedge(0, 0.0)  # not made to wait ...
    assert limiter.reserve(0, 0.0) == pytest.approx(0.3)  # ... but the call after it waits its share


def test_no_hedge_goes_while_the_model_is_paused() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    assert limiter.charge_hedge(10, 0.0)  # no limit known: nothing to charge
    limiter.on_rate_limited(EMPTY_REQUESTS, 2.0, tokens=10, now=1.0)
    assert not limiter.charge_hedge(10, 2.0)
    assert limiter.charge_hedge(10, 3.0)


# -- per model ----------------------------------------------------------------------------------------------
def test_each_model_gets_its_own_limiter_created_on_first_use() -> None:
    limiter = RateLimiter(RateLimits(rpm=600), share=0.5)
    a = limiter.for_model("a", now=0.0)
    assert limiter.for_model("a", now=5.0) is a
    b = limiter.for_model("b", now=0.0)
    assert b is not a
    assert b.limits == RateLimits(rpm=300)
    a.observe({"x-ratelimit-limit-requests": "60"}, now=0.0)
    assert a.limits.rpm == 30
    assert b.limits.rpm == 300
    a.on_rate_limited(EMPTY_REQUESTS, 10.0, tokens=1, now=0.0)
    assert b.reserve(0, 0.0) == 0.0


def test_the_burst_setting_reaches_the_model_limiters() -> None:
    limiter = RateLimiter(RateLimits(rpm=600), share=1.0, burst_s=1.0)  # 10/s, capacity 10
    model = limiter.for_model("m", now=0.0)
    assert [model.reserve(0, 0.0) for _ in range(10)] == [0.0] * 10
    assert model.reserve(0, 0.0) > 0


def test_limits_by_model_lists_the_models_seen_with_their_effective_limits() -> None:
    limiter = RateLimiter(RateLimits(tpm=1000), share=0.5)
    assert limiter.limits_by_model() == {}
    limiter.for_model("a", now=0.0).observe({"x-ratelimit-limit-requests": "60"}, now=0.0)
    limiter.for_model("b", now=0.0)
    assert limiter.limits_by_model() == {"a": RateLimits(rpm=30, tpm=500), "b": RateLimits(tpm=500)}


def test_the_backlog_is_the_wait_of_the_calls_reserved_before_and_of_a_pause() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=60), share=1.0, now=0.0)  # 1/s, a burst of one
    assert limiter.backlog_s(0.0) == 0.0
    limiter.reserve(1, 0.0)
    limiter.reserve(1, 0.0)
    assert limiter.backlog_s(0.0) == pytest.approx(1.0)  # the second is due in a second
    assert limiter.backlog_s(0.5) == pytest.approx(0.5)
    limiter.on_rate_limited({"x-ratelimit-remaining-requests": "0"}, 4.0, 1, 0.5)
    assert limiter.backlog_s(0.5) == pytest.approx(4.0)  # the congestion pause


def test_calls_queued_to_reserve_count_as_waiting_until_they_leave_the_queue() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=60, tpm=60_000), share=1.0, now=0.0)
    limiter.queued(3, 300)
    assert limiter.waiting(0.0) == (3.0, 300.0)
    assert limiter.backlog_s(0.0) == 0.0  # queued, not reserved: nobody's wait yet
    limiter.queued(-3, -300)
    assert limiter.waiting(0.0) == (0.0, 0.0)
