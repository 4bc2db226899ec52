"""Requests-per-minute and tokens-per-minute token buckets shared by all clients, and their headers.

Pure logic with the time passed in, so tests drive a fake clock. The headers tell the truth about the
buckets: ``remaining`` is what can be admitted right now, ``reset`` is when the bucket is full again, and a
429's ``retry-after`` is the wait after which the same request is admitted (if nobody else came first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from streamproc.mockllm.profiles import ServerLimits


def format_duration(seconds: float) -> str:
    """OpenAI's duration style for ``x-ratelimit-reset-*`` and "try again in": ``120ms``, ``1.5s``, ``1m30s``."""
    if seconds <= 0:
        return "0s"
    millis = _ceil_ms(seconds)
    if millis < 1000:
        return f"{millis}ms"
    if millis < 60_000:
        return f"{millis / 1000:g}s"
    minutes, rest = divmod(millis, 60_000)
    return f"{minutes}m{rest / 1000:g}s"


def _ceil_ms(seconds: float) -> int:
    """Whole milliseconds, rounded up, ignoring float noise (0.1 s is 100 ms, not 101)."""
    return max(1, math.ceil(seconds * 1000 - 1e-6))


class ServerBucket:
    """A bucket of ``capacity`` refilled at ``limit_per_minute / 60`` per second.

    A cost larger than the capacity is admitted when the bucket is full and drives it below zero, so big
    requests are possible but still pay for their tokens in the long-run rate.
    """

    def __init__(self, limit_per_minute: int, burst_seconds: float, now: float) -> None:
        self.limit = limit_per_minute
        self.rate = limit_per_minute / 60.0
        self.capacity = max(1.0, self.rate * burst_seconds)
        self.level = self.capacity
        self._stamp = now

    def _refill(self, now: float) -> None:
        if now > self._stamp:
            self.level = min(self.capacity, self.level + (now - self._stamp) * self.rate)
            self._stamp = now

    def _needed(self, cost: float) -> float:
        return min(cost, self.capacity)

    def can_take(self, cost: float, now: float) -> bool:
        self._refill(now)
        return self.level >= self._needed(cost) - 1e-9

    def take(self, cost: float) -> None:
        self.level -= cost

    def wait_time(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` can be admitted."""
        self._refill(now)
        missing = self._needed(cost) - self.level
        return max(0.0, missing / self.rate)

    def remaining(self, now: float) -> int:
        self._refill(now)
        return max(0, math.floor(self.level + 1e-9))

    def reset_time(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        self._refill(now)
        return max(0.0, (self.capacity - self.level) / self.rate)


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class Admission:
    """The limiter's answer for one request: admitted or not, by which bucket, and the headers to send."""

    admitted: bool
    headers: dict[str, str]
    limited_by: str | None = None  # "requests" or "tokens"
    retry_after: float = 0.0
    limit: int = 0
    used: int = 0


class ServerLimiter:
    """Both buckets together: a request is admitted only if both admit it, and then pays both."""

    def __init__(self, limits: ServerLimits, now: float) -> None:
        self.requests = ServerBucket(limits.rpm, limits.burst_seconds, now) if limits.rpm is not None else None
        self.tokens = ServerBucket(limits.tpm, limits.burst_seconds, now) if limits.tpm is not None else None

    @property
    def active(self) -> bool:
        return self.requests is not None or self.tokens is not None

    def admit(self, tokens: int, now: float, *, headers: bool = True) -> Admission:
        """Admit or refuse; ``headers`` False leaves an admitted request's headers empty (a refusal has them)."""
        for unit, bucket, cost in (("requests", self.requests, 1), ("tokens", self.tokens, tokens)):
            if bucket is not None and not bucket.can_take(cost, now):
                wait = bucket.wait_time(cost, now)
                return Admission(
                    False,
                    self.headers(now, retry_after=wait),
                    limited_by=unit,
                    retry_after=wait,
                    limit=bucket.limit,
                    used=bucket.limit - bucket.remaining(now),
                )
        if self.requests is not None:
            self.requests.take(1)
        if self.tokens is not None:
            self.tokens.take(tokens)
        return Admission(True, self.headers(now) if headers else {})

    def headers(self, now: float, retry_after: float | None = None) -> dict[str, str]:
        """``x-ratelimit-*`` for the buckets in use, plus ``retry-after(-ms)`` when a wait is asked for."""
        headers: dict[str, str] = {}
        for unit, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is not None:
                headers[f"x-ratelimit-limit-{unit}"] = str(bucket.limit)
                headers[f"x-ratelimit-remaining-{unit}"] = str(bucket.remaining(now))
                headers[f"x-ratelimit-reset-{unit}"] = format_duration(bucket.reset_time(now))
        if retry_after is not None:
            headers.update(retry_headers(retry_after))
        return headers


def retry_headers(seconds: float) -> dict[str, str]:
    """``retry-after-ms`` (exact, read first by OpenAI's client) and ``retry-after`` (whole seconds, rounded up)."""
    millis = _ceil_ms(seconds)
    return {"retry-after-ms": str(millis), "retry-after": str(max(1, -(-millis // 1000)))}
