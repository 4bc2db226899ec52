"""The limiter's share set at run time (the fleet's, design §5.8), and what waits at its pace."""

from __future__ import annotations

import pytest

from streamproc.core.guards.rate_limits import ModelRateLimiter, RateLimiter, RateLimits, Waiting


def test_a_smaller_share_paces_the_calls_reserved_after_it() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=1200), share=1.0, now=0.0)  # 20/s; capacity 2
    assert [limiter.reserve(0, 0.0) for _ in range(2)] == [0.0, 0.0]
    limiter.set_share(0.5, 0.0)
    assert limiter.limits == RateLimits(rpm=600)
    assert [limiter.reserve(0, 0.0) for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])


def test_a_larger_share_starts_where_the_calls_already_waiting_leave() -> None:
    """Ten calls were told to wait up to 1 s at 10/s; at 20/s a new call would be told 0.5 s and leave beside
    them: it is told to wait until their schedule ends, and the calls after it leave at the new pace."""
    limiter = ModelRateLimiter(RateLimits(rpm=1200), share=0.5, now=0.0)  # 10/s; capacity 1
    waits = [limiter.reserve(0, 0.0) for _ in range(11)]
    assert waits[-1] == pytest.approx(1.0)
    limiter.set_share(1.0, 0.0)
    assert [limiter.reserve(0, 0.0) for _ in range(2)] == pytest.approx([1.05, 1.1])


def test_a_smaller_share_keeps_the_calls_owed() -> None:
    """Calls already told to wait at the old pace are owed at the new one: the next call waits for all of them."""
    limiter = ModelRateLimiter(RateLimits(rpm=1200), share=1.0, now=0.0)  # 20/s; capacity 2
    for _ in range(12):
        limiter.reserve(0, 0.0)  # 10 owed: 0.5 s at 20/s
    limiter.set_share(0.5, 0.0)
    assert limiter.reserve(0, 0.0) == pytest.approx(1.1)  # 11 owed at 10/s


def test_what_waits_is_the_debt_of_each_bucket_and_drains_with_time() -> None:
    limiter = ModelRateLimiter(RateLimits(rpm=600, tpm=60_000), share=1.0, now=0.0)  # 10/s, 1000 tok/s
    assert limiter.waiting(0.0) == Waiting(0.0, 0.0)
    for _ in range(6):
        limiter.reserve(50, 0.0)  # capacity 1 call and 100 tokens
    assert limiter.waiting(0.0) == pytest.approx(Waiting(5.0, 200.0))
    assert limiter.waiting(0.25) == pytest.approx(Waiting(2.5, 0.0))
    assert limiter.waiting(10.0) == Waiting(0.0, 0.0)


def test_without_a_known_limit_nothing_waits() -> None:
    limiter = ModelRateLimiter(RateLimits(), share=1.0, now=0.0)
    for _ in range(100):
        limiter.reserve(1000, 0.0)
    limiter.set_share(0.25, 0.0)
    assert limiter.waiting(0.0) == Waiting(0.0, 0.0)


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5, float("nan")])
def test_a_share_outside_0_to_1_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="share"):
        ModelRateLimiter(RateLimits(rpm=60), share=1.0, now=0.0).set_share(share, 0.0)
    with pytest.raises(ValueError, match="share"):
        RateLimiter(RateLimits(rpm=60), share=1.0).set_shares({}, share, 0.0)


def test_every_model_takes_its_share_and_a_model_called_later_the_default() -> None:
    limiter = RateLimiter(RateLimits(rpm=600), share=1.0)
    for model in ("a", "b", "c"):
        limiter.for_model(model, 0.0)
    limiter.set_shares({"a": 0.5, "b": 0.25}, 0.2, 0.0)
    limiter.for_model("d", 0.0)
    assert limiter.limits_by_model() == {"a": RateLimits(rpm=300), "b": RateLimits(rpm=150),
                                         "c": RateLimits(rpm=120), "d": RateLimits(rpm=120)}


def test_setting_shares_keeps_which_model_was_used_last() -> None:
    """The fleet sets every model's share each beat: that is no use of a model (the least recently called go
    first when there are too many)."""
    limiter = RateLimiter(RateLimits(rpm=600), share=1.0)
    for model in ("a", "b", "c"):
        limiter.for_model(model, 0.0)
    limiter.set_shares({"a": 0.5, "b": 0.5, "c": 0.5}, 0.5, 0.0)
    assert list(limiter.limits_by_model()) == ["a", "b", "c"]
    assert list(limiter.waiting_by_model(0.0)) == ["a", "b", "c"]


def test_waiting_by_model_reads_each_model_s_pace() -> None:
    limiter = RateLimiter(RateLimits(rpm=600), share=1.0)  # 10/s; capacity 1
    for _ in range(4):
        limiter.for_model("a", 0.0).reserve(0, 0.0)
    limiter.for_model("b", 0.0).reserve(0, 0.0)
    assert limiter.waiting_by_model(0.0) == {"a": Waiting(3.0, 0.0), "b": Waiting(0.0, 0.0)}
