"""Pace one worker's calls under the provider's requests/min and tokens/min limits.

The limits come from the settings, from the provider's ``x-ratelimit-limit-*`` headers, or both (then the
lower wins: a configured limit is how much of the account this deployment may use). Limits are per account,
so each worker paces at its ``share`` of them: the one its fleet derives and sets at run time (design §5.8),
or a fixed one. Buckets hold only a tenth of a second of traffic:
providers enforce "per minute" limits over much shorter windows, so a full minute's burst would be refused.

A 429 is *congestion* only when the provider says a bucket is empty (or says nothing about its buckets):
then that model's calls pause until the bucket refills. A 429 while the buckets still have room is a refusal
of that one request (e.g. a single call larger than the tokens/min limit), and pausing everyone for it would
only slow the batch down.

Congestion also lowers the pace, multiplicatively (x0.9, once per second at most), and the pace then probes
back up by 1 % of the limit per second without congestion: pacing at exactly the advertised limit leaves no
margin for the jitter between our clock and the server's, whatever its burst. When no limit is known at all
(no setting, and the server sends ``x-ratelimit-*`` only on its 429s, or never), the first congestion sets
one from the rate actually sent over the last few seconds, and the same decrease and probe apply to it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

from streamproc.core.durations import parse_duration_ms, parse_number
from streamproc.core.guards.bounded import MAX_MODELS, LruDict
from streamproc.core.guards.bucket import TokenBucket

DEFAULT_CONGESTION_WAIT_S = 1.0  # a 429 that names no wait at all
_UNITS = ("requests", "tokens")
BACKOFF = 0.9  # the pace after congestion, as a fraction of the pace before
PROBE_PER_S = 0.01  # how fast the pace climbs back, as a fraction of the limit per second without congestion
MIN_PACE = 0.1  # never slower than this fraction of the limit
SENT_WINDOW_S = 5.0  # how far back the rate actually sent is measured, for a limit learnt from congestion
SENT_KEPT = 4096  # at most this many of those sends are kept (the newest: the rate over their span is the same)


@dataclass(frozen=True)
class RateLimits:
    """Per-minute limits; ``None`` means unknown, i.e. unlimited until a header says otherwise."""

    rpm: float | None = None
    tpm: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("rpm", self.rpm), ("tpm", self.tpm)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {value}")


NO_LIMITS: Final = RateLimits()


class Waiting(NamedTuple):
    """Calls and tokens reserved at a model's pace but not yet due."""

    calls: float
    tokens: float


class ModelRateLimiter:
    """Requests/min and tokens/min buckets of one model endpoint, shared by all calls of a worker."""

    def __init__(self, configured: RateLimits, share: float, now: float, burst_s: float = 0.1) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        if not (burst_s > 0 and math.isfinite(burst_s)):
            raise ValueError(f"burst_s must be a finite number > 0, got {burst_s}")
        self._configured = configured
        self._share = share
        self._burst_s = burst_s
        self._advertised = NO_LIMITS  # the latest x-ratelimit-limit-* values
        self._limits = NO_LIMITS
        self._requests: TokenBucket | None = None
        self._tokens: TokenBucket | None = None
        self._paused_until = -math.inf  # also holds a pause while no limit (so no bucket) is known
        self._pace = 1.0  # the fraction of the limits sent at: lowered by congestion, probing back up
        self._paced_at = now
        self._last_cut = -math.inf
        self._learned = NO_LIMITS  # from the rate sent when congestion came with no limit known
        # (time, tokens) of recent reservations, to learn from
        self._sent: deque[tuple[float, int]] = deque(maxlen=SENT_KEPT)
        self._apply(now)

    @property
    def limits(self) -> RateLimits:
        """The effective per-minute limits of this worker (after ``share``)."""
        return self._limits

    @property
    def paused_until(self) -> float:
        """The end of the latest congestion pause (``-inf`` if there was none)."""
        return self._paused_until

    @property
    def pace(self) -> float:
        """The fraction of the limits this model is paced at now (1.0 until congestion)."""
        return self._pace

    def set_share(self, share: float, now: float) -> None:
        """Pace at ``share`` of the limits from ``now`` on (the fleet re-derives it, design §5.8). Calls already
        told to wait keep their times, so a larger share starts where their schedule ends: new calls sent beside
        that schedule would exceed the share while it lasts."""
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        booked = [(bucket, now + self._waiting_in(bucket, now) / bucket.rate_per_s)
                  for bucket in (self._requests, self._tokens) if bucket is not None]
        self._share = share
        self._apply(now)
        for bucket, until in booked:
            bucket.pause_until(until, now)

    def waiting(self, now: float) -> Waiting:
        """Calls and tokens reserved but not yet due (the buckets' debt, a congestion pause's included): what
        this worker wants beyond its pace."""
        return Waiting(self._waiting_in(self._requests, now), self._waiting_in(self._tokens, now))

    @staticmethod
    def _waiting_in(bucket: TokenBucket | None, now: float) -> float:
        return max(0.0, -bucket.level(now)) if bucket is not None else 0.0

    def reserve(self, tokens: int, now: float) -> float:
        """Seconds to wait before sending one call of ``tokens`` tokens; both buckets are charged now."""
        self._probe(now)
        if self._limits == NO_LIMITS:  # only then can congestion need the rate sent, to learn a limit from it
            self._remember_sent(max(0, tokens), now)
        wait = max(0.0, self._paused_until - now)
        if self._requests is not None:
            wait = max(wait, self._requests.reserve(1, now))
        if self._tokens is not None:
            wait = max(wait, self._tokens.reserve(max(0, tokens), now))
        return wait

    def observe(self, headers: Mapping[str, str], now: float) -> None:
        """Learn the account limits from a response's ``x-ratelimit-limit-*`` headers (any status)."""
        rpm = _positive(_header(headers, "x-ratelimit-limit-requests"))
        tpm = _positive(_header(headers, "x-ratelimit-limit-tokens"))
        if rpm is None and tpm is None:
            return
        self._advertised = RateLimits(
            rpm=rpm if rpm is not None else self._advertised.rpm,
            tpm=tpm if tpm is not None else self._advertised.tpm,
        )
        self._apply(now)

    def on_rate_limited(self, headers: Mapping[str, str], retry_after_s: float | None, tokens: int,
                        now: float) -> bool:
        """Handle a 429: pause the worker and return True if it is congestion; else change nothing.

        Callers pass the 429's headers to :meth:`observe` as well: this method reads only the
        ``remaining`` and ``reset`` headers.
        """
        exhausted = self._exhausted(headers, tokens)
        if exhausted is None:
            return False
        wait = _finite_non_negative(retry_after_s)
        if wait is None:
            resets = [_duration_s(_header(headers, f"x-ratelimit-reset-{unit}")) for unit in exhausted]
            wait = max((reset for reset in resets if reset is not None), default=DEFAULT_CONGESTION_WAIT_S)
        until = now + wait
        self._paused_until = max(self._paused_until, until)
        self._slow_down(now)
        for bucket in (self._requests, self._tokens):
            if bucket is not None:
                bucket.pause_until(until, now)
        return True

    def _slow_down(self, now: float) -> None:
        """Congestion: learn a limit from the rate sent if none is known, and cut the pace (once a second)."""
        if self._limits == NO_LIMITS:
            self._learned = self._rate_sent(now)
        if now - self._last_cut >= 1.0:
            self._last_cut = now
            self._pace = max(MIN_PACE, self._pace * BACKOFF)
            self._paced_at = now
        self._apply(now)

    def _probe(self, now: float) -> None:
        """Climb back towards the full limit while no congestion comes; re-rate the buckets at 1 % steps."""
        if self._pace >= 1.0 and not self._probing_learnt():
            return
        elapsed = now - self._paced_at
        if elapsed < 1.0:
            return
        self._paced_at = now
        self._pace = self._pace + PROBE_PER_S * elapsed
        if self._pace > 1.0:
            if self._probing_learnt():  # a learnt limit is a floor estimate: grow it beyond, until congestion
                self._learned = RateLimits(*(value * self._pace if value is not None else None
                                             for value in (self._learned.rpm, self._learned.tpm)))
            self._pace = 1.0
        self._apply(now)

    def _known(self) -> bool:
        """Whether a limit was configured or advertised (else the learnt one, if any, applies)."""
        return self._configured != NO_LIMITS or self._advertised != NO_LIMITS

    def _probing_learnt(self) -> bool:
        return self._learned != NO_LIMITS and not self._known()

    def _remember_sent(self, tokens: int, now: float) -> None:
        """O(1) amortised: the oldest fall off the left (rebuilding the list once it held 4,096 sends in the
        window, above ~820 calls/s, cost 16 % of the worker's CPU)."""
        self._sent.append((now, tokens))
        while self._sent[0][0] < now - SENT_WINDOW_S:
            self._sent.popleft()

    def _rate_sent(self, now: float) -> RateLimits:
        """Requests and tokens per minute actually sent over the last few seconds (before the share)."""
        recent = [(at, cost) for at, cost in self._sent if at >= now - SENT_WINDOW_S]
        if not recent:
            return RateLimits(rpm=60.0 / self._share)  # one a second: something to probe up from
        span = max(1.0, now - recent[0][0])
        per_minute = 60.0 / span / self._share
        tokens = sum(cost for _, cost in recent)
        return RateLimits(rpm=len(recent) * per_minute, tpm=tokens * per_minute if tokens > 0 else None)

    def _exhausted(self, headers: Mapping[str, str], tokens: int) -> tuple[str, ...] | None:
        """The units the headers say are exhausted; all units if they say nothing; None if none is."""
        remaining_requests = parse_number(_header(headers, "x-ratelimit-remaining-requests"))
        remaining_tokens = parse_number(_header(headers, "x-ratelimit-remaining-tokens"))
        if remaining_requests is None and remaining_tokens is None:
            return _UNITS
        exhausted = tuple(
            unit
            for unit, empty in (
                ("requests", remaining_requests is not None and remaining_requests <= 0),
                ("tokens", remaining_tokens is not None and remaining_tokens < tokens),
            )
            if empty
        )
        return exhausted or None

    def _apply(self, now: float) -> None:
        source = RateLimits(_lower(self._configured.rpm, self._advertised.rpm),
                            _lower(self._configured.tpm, self._advertised.tpm)) if self._known() else self._learned
        self._limits = RateLimits(
            rpm=source.rpm * self._share if source.rpm is not None else None,
            tpm=source.tpm * self._share if source.tpm is not None else None,
        )
        self._requests = self._bucket(self._requests, _times(self._limits.rpm, self._pace), now)
        self._tokens = self._bucket(self._tokens, _times(self._limits.tpm, self._pace), now)

    def _bucket(self, bucket: TokenBucket | None, per_minute: float | None, now: float) -> TokenBucket | None:
        if per_minute is None:
            return None
        rate = per_minute / 60.0
        capacity = max(1.0, rate * self._burst_s)
        if bucket is None:
            bucket = TokenBucket(rate, capacity, now)
            bucket.pause_until(self._paused_until, now)  # a limit learnt during a pause must not end it
        elif bucket.rate_per_s != rate or bucket.capacity != capacity:
            bucket.set_rate(rate, capacity, now)
            bucket.pause_until(self._paused_until, now)  # a pause is time: a faster rate must not shorten it
        return bucket


class RateLimiter:
    """One :class:`ModelRateLimiter` per model (each model has its own limits), created on first use."""

    def __init__(self, configured: RateLimits, share: float, burst_s: float = 0.1) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self._configured = configured
        self._share = share
        self._burst_s = burst_s
        self._models: LruDict[str, ModelRateLimiter] = LruDict(MAX_MODELS)  # least recently called go first

    def for_model(self, model: str, now: float) -> ModelRateLimiter:
        limiter = self._models.get(model)
        if limiter is None:
            limiter = self._models[model] = ModelRateLimiter(self._configured, self._share, now, self._burst_s)
        return limiter

    def limits_by_model(self) -> dict[str, RateLimits]:
        """The effective per-minute limits of each model seen so far (for metrics)."""
        return {model: limiter.limits for model, limiter in self._models.items()}

    def set_shares(self, shares: Mapping[str, float], default: float, now: float) -> None:
        """Pace each model at its share from ``shares`` (``default`` when not named) from ``now`` on, and a model
        first called later at ``default`` (the fleet re-derives them, design §5.8); the order of use is kept."""
        if not 0 < default <= 1:
            raise ValueError(f"share must be in (0, 1], got {default}")
        self._share = default
        for model, limiter in self._models.items():
            limiter.set_share(shares.get(model, default), now)

    def waiting_by_model(self, now: float) -> dict[str, Waiting]:
        """What waits at the pace of each model seen so far (for the fleet's demand)."""
        return {model: limiter.waiting(now) for model, limiter in self._models.items()}


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """``name`` (lower case) from ``headers``, whatever the case of their keys."""
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value


def _positive(text: str | None) -> float | None:
    value = parse_number(text)
    return value if value is not None and value > 0 else None


def _finite_non_negative(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def _duration_s(text: str | None) -> float | None:
    millis = parse_duration_ms(text) if text is not None else None
    return millis / 1000 if millis is not None and millis >= 0 else None


def _times(value: float | None, factor: float) -> float | None:
    return value * factor if value is not None else None


def _lower(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
