"""Token buckets and their headers, driven by a fake clock."""

from __future__ import annotations

import pytest

from streamproc.mockllm.limits import ServerBucket, ServerLimiter, format_duration, retry_headers
from streamproc.mockllm.profiles import ServerLimits


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0004, "1ms"),
        (0.12, "120ms"),
        (0.1 + 1e-12, "100ms"),
        (0.9999, "1s"),
        (1.5, "1.5s"),
        (1.0, "1s"),
        (17.281, "17.281s"),
        (90, "1m30s"),
        (61.25, "1m1.25s"),
    ],
)
def test_durations_read_like_openai(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_bucket_admits_its_capacity_then_the_refill_rate() -> None:
    bucket = ServerBucket(600, burst_seconds=0.5, now=0.0)  # 10/s, capacity 5
    admitted = 0
    for _ in range(20):
        if bucket.can_take(1, 0.0):
            bucket.take(1)
            admitted += 1
    assert admitted == 5
    assert not bucket.can_take(1, 0.05)
    assert bucket.can_take(1, 0.1)


def test_wait_time_is_exactly_when_the_next_request_fits() -> None:
    bucket = ServerBucket(600, burst_seconds=0.1, now=0.0)  # capacity 1
    bucket.take(1)
    wait = bucket.wait_time(1, 0.0)
    assert wait == pytest.approx(0.1)
    assert not bucket.can_take(1, wait - 0.001)
    assert bucket.can_take(1, wait)


def test_a_cost_above_capacity_waits_for_a_full_bucket_and_pays_in_full() -> None:
    bucket = ServerBucket(60_000, burst_seconds=0.25, now=0.0)  # 1,000 tokens/s, capacity 250
    assert bucket.can_take(1_000, 0.0)
    bucket.take(1_000)
    assert bucket.level == pytest.approx(-750)
    assert bucket.wait_time(1, 0.0) == pytest.approx(0.751)  # pays the debt before anything else fits
    assert bucket.reset_time(0.0) == pytest.approx(1.0)


def test_remaining_and_reset_describe_the_bucket() -> None:
    bucket = ServerBucket(6_000, burst_seconds=1.0, now=0.0)  # 100/s, capacity 100
    assert bucket.remaining(0.0) == 100
    assert bucket.reset_time(0.0) == 0.0
    bucket.take(40)
    assert bucket.remaining(0.0) == 60
    assert bucket.reset_time(0.0) == pytest.approx(0.4)
    assert bucket.remaining(0.2) == 80


def test_limiter_admits_only_when_both_buckets_do_and_then_charges_both() -> None:
    limiter = ServerLimiter(ServerLimits(rpm=600, tpm=6_000, burst_seconds=1.0), now=0.0)  # 10 req, 100 tok
    first = limiter.admit(60, 0.0)
    assert first.admitted
    refused = limiter.admit(60, 0.0)
    assert not refused.admitted
    assert refused.limited_by == "tokens"
    assert refused.retry_after == pytest.approx(0.2)  # 40 tokens left, 60 needed, 100/s
    assert limiter.requests is not None and limiter.requests.remaining(0.0) == 9  # the refusal cost nothing
    assert limiter.admit(60, 0.2).admitted


def test_limiter_reports_the_requests_bucket_first() -> None:
    limiter = ServerLimiter(ServerLimits(rpm=60, tpm=1_000_000, burst_seconds=1.0), now=0.0)  # 1 request
    assert limiter.admit(10, 0.0).admitted
    refused = limiter.admit(10, 0.0)
    assert refused.limited_by == "requests"
    assert refused.limit == 60
    assert refused.retry_after == pytest.approx(1.0)


def test_headers_tell_the_truth() -> None:
    limiter = ServerLimiter(ServerLimits(rpm=600, tpm=60_000, burst_seconds=1.0), now=0.0)
    admission = limiter.admit(250, 0.0)
    assert admission.headers == {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "100ms",
        "x-ratelimit-limit-tokens": "60000",
        "x-ratelimit-remaining-tokens": "750",
        "x-ratelimit-reset-tokens": "250ms",
    }
    for _ in range(9):
        limiter.admit(1, 0.0)
    refused = limiter.admit(1, 0.0)
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["retry-after-ms"] == "100"
    assert refused.headers["retry-after"] == "1"


def test_no_limits_no_headers() -> None:
    limiter = ServerLimiter(ServerLimits(), now=0.0)
    assert not limiter.active
    assert limiter.admit(10**9, 0.0).admitted
    assert limiter.headers(0.0) == {}


def test_retry_headers_round_up() -> None:
    assert retry_headers(1.5) == {"retry-after-ms": "1500", "retry-after": "2"}
    assert retry_headers(0.0001) == {"retry-after-ms": "1", "retry-after": "1"}
    assert retry_headers(2.0000000001) == {"retry-after-ms": "2000", "retry-after": "2"}


def test_steady_hammering_admits_the_minute_rate() -> None:
    """The same property the HTTP test checks in real time: ~100 of a flood in 10 s at RPM 600."""
    limiter = ServerLimiter(ServerLimits(rpm=600), now=0.0)
    admitted = sum(limiter.admit(1, step / 1000).admitted for step in range(10_000))
    assert 100 <= admitted <= 103
