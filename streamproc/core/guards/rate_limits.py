"""Pace one worker's calls under the provider's requests/min and tokens/min limits.

The limits come from the settings, from the provider's ``x-ratelimit-limit-*`` headers, or both (then the
lower wins: a configured limit is how much of the account this deployment may use). Limits are per account,
so each worker paces at its ``share`` of them: the one its fleet derives and sets at run time (design §5.8),
or a fixed one. Buckets hold only a tenth of a second of traffic:
providers enforce "per minute" limits over much shorter windows, so a full minute's burst would be refused.

A 429 is *congestion* when the provider says a bucket is empty (``x-ratelimit-remaining-*``): then that
model's calls pause until the bucket refills, and its pace is cut (:mod:`pace`: x0.9, then quickly back to the
last good pace). A 429 that says nothing about buckets may be congestion or a refusal of the server's own,
which comes to a share of calls whatever their rate: it is congestion only when the share of such 429s over a
window of calls is above a threshold, and stays so only if the share falls with the pace (:mod:`loss`). Any
other 429, and one while the buckets still have room (e.g. a single call larger than the tokens/min limit), is
that one call's: the call waits its ``retry-after`` and the model goes on.

When no limit is known at all (no setting, and the server sends ``x-ratelimit-*`` only on its 429s, or never),
congestion sets one: from the rate the server admitted over the window of calls that showed it, else from the
rate actually sent over the last few seconds; the same cut and recovery apply to it, and a learnt limit keeps
probing above itself, slowly, until congestion again.
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
from streamproc.core.guards.loss import LossShare, LossSignal
from streamproc.core.guards.pace import BACKOFF, Pace

DEFAULT_WAIT_S = 1.0  # a 429 that names no wait at all
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


@dataclass(frozen=True)
class RateLimited:
    """What a 429 did: whether it was congestion (the model's pace was cut, its calls pause), and how long the
    refused call itself waits before it may be sent again (its calls' pause comes on top, through
    :meth:`ModelRateLimiter.reserve`)."""

    congestion: bool
    wait_s: float


class Waiting(NamedTuple):
    """Calls and tokens reserved at a model's pace but not yet due."""

    calls: float
    tokens: float


class Pacing(NamedTuple):
    """How one model is paced, for people watching: its limits (after the share), the pace (a fraction of them)
    and the share of the last window of calls refused by a 429 that named no bucket (None before one closed)."""

    limits: RateLimits
    pace: float
    refused_share: float | None


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
        self._pace = Pace(now)  # the fraction of the limits sent at: cut by congestion, back to the good pace
        self._loss = LossShare()  # which 429s that name no bucket are congestion
        self._learned = NO_LIMITS  # from the rate admitted (or sent) when congestion came with no limit known
        self._learned_before_test = NO_LIMITS  # to forget a limit learnt from 429s that proved the server's own
        # (time, tokens) of recent reservations, to learn from
        self._sent: deque[tuple[float, int]] = deque(maxlen=SENT_KEPT)
        self._queued = Waiting(0.0, 0.0)  # calls (and their tokens) waiting to reserve
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
        return self._pace.value

    @property
    def refused_share(self) -> float | None:
        """The share of the last window of calls refused by a 429 that named no bucket (:mod:`loss`)."""
        return self._loss.last_share

    @property
    def loss_threshold(self) -> float:
        """The share of 429s naming no bucket above which a window of calls is congestion (it rises above a
        server's own level of such refusals)."""
        return self._loss.threshold

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
        """Calls and tokens reserved but not yet due (the buckets' debt, a congestion pause's included), and
        those queued to reserve (:meth:`queued`): what this worker wants beyond its pace."""
        return Waiting(self._waiting_in(self._requests, now) + self._queued.calls,
                       self._waiting_in(self._tokens, now) + self._queued.tokens)

    def queued(self, calls: int, tokens: int) -> None:
        """``calls`` calls of ``tokens`` tokens in all joined (or, negative, left) the queue of calls that wait
        to reserve (:meth:`backlog_s`): they count in :meth:`waiting` though the buckets do not hold them yet."""
        self._queued = Waiting(self._queued.calls + calls, self._queued.tokens + tokens)

    def backlog_s(self, now: float) -> float:
        """How long a call reserved now would wait for the calls reserved before it and for a congestion pause,
        whatever its own cost. Callers reserve only once this is short: a reservation keeps its time, so the
        calls reserved far ahead would keep the old pace through a cut, a pause or a new share."""
        self._step(now)
        backlog = max(0.0, self._paused_until - now)
        for bucket in (self._requests, self._tokens):
            if bucket is not None:
                backlog = max(backlog, self._waiting_in(bucket, now) / bucket.rate_per_s)
        return backlog

    @staticmethod
    def _waiting_in(bucket: TokenBucket | None, now: float) -> float:
        return max(0.0, -bucket.level(now)) if bucket is not None else 0.0

    def reserve(self, tokens: int, now: float) -> float:
        """Seconds to wait before sending one call of ``tokens`` tokens; both buckets are charged now."""
        self._step(now)
        self._sending(tokens, now)
        wait = max(0.0, self._paused_until - now)
        if self._requests is not None:
            wait = max(wait, self._requests.reserve(1, now))
        if self._tokens is not None:
            wait = max(wait, self._tokens.reserve(max(0, tokens), now))
        return wait

    def charge_hedge(self, tokens: int, now: float) -> bool:
        """A hedge of one call of ``tokens`` tokens: charged to the buckets like any call, so the calls reserved
        after it wait that much longer and the pace holds over time, but sent now (it copies a call that is
        already late); none while the model is paused by congestion. Returns whether it may go."""
        self._step(now)
        if now < self._paused_until:
            return False
        self._sending(tokens, now)
        for bucket, cost in ((self._requests, 1), (self._tokens, max(0, tokens))):
            if bucket is not None:
                bucket.reserve(cost, now)
        return True

    def _sending(self, tokens: int, now: float) -> None:
        self._remember_sent(max(0, tokens), now)  # what congestion compares with what the server admits

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

    @property
    def told(self) -> bool:
        """Whether its limits were configured or advertised (not learnt from congestion): another worker of the
        fleet may pace by them."""
        return self._known()

    def adopt(self, limits: RateLimits, now: float) -> None:
        """Limits another worker of the fleet was told (design §5.8): with none configured or advertised here,
        they are taken as advertised, so this worker paces by them before its own first 429 tells it."""
        if self._known() or limits == NO_LIMITS:
            return
        self._advertised = limits
        self._apply(now)

    def on_answer(self, started: float, now: float) -> bool:
        """A call sent at ``started`` was answered, with anything but a 429; it counts in the share of 429s.
        Returns whether that share now says congestion (the pace was cut)."""
        return self._react(self._loss.record(False, started, now), now)

    def on_rate_limited(self, headers: Mapping[str, str], retry_after_s: float | None, tokens: int, now: float,
                        started: float | None = None) -> RateLimited:
        """A call of ``tokens`` tokens sent at ``started`` (default ``now``) was answered with a 429: congestion
        when its headers say a bucket is empty, or when the share of 429s that name no bucket says so (see the
        module docstring); else the refused call alone waits its hint.

        Callers pass the 429's headers to :meth:`observe` as well: this method reads only the
        ``remaining`` and ``reset`` headers.
        """
        hint = _finite_non_negative(retry_after_s)
        exhausted = self._exhausted(headers, tokens)
        if exhausted is None or not exhausted:  # names no bucket, or one with room: not the pace, unless many
            congestion = self._react(self._loss.record(exhausted is None, started if started is not None else now,
                                                       now), now)
            return RateLimited(congestion, hint if hint is not None else DEFAULT_WAIT_S)
        wait = hint
        if wait is None:
            resets = [_duration_s(_header(headers, f"x-ratelimit-reset-{unit}")) for unit in exhausted]
            wait = max((reset for reset in resets if reset is not None), default=DEFAULT_WAIT_S)
        until = now + wait
        self._paused_until = max(self._paused_until, until)
        if self._limits == NO_LIMITS:
            self._learned = self._rate_sent(now, refused=0.0)
        self._pace.cut(now, resume_at=until)
        self._apply(now)
        for bucket in (self._requests, self._tokens):
            if bucket is not None:
                bucket.pause_until(until, now)
        return RateLimited(True, 0.0)

    def _react(self, signal: LossSignal | None, now: float) -> bool:
        """Act on what a window of calls said (:mod:`loss`): cut the pace to below what the server admitted
        (learning a limit if none is known), cut deeper, keep the cut, or undo it. Returns whether it cut."""
        if signal is None:
            return False
        match signal.verdict:
            case "congestion":
                self._pace.keep()  # a test still running ends: its share fell, but not below the threshold
                self._learned_before_test = self._learned
                self._pace.test(now, to=self._admitted_pace(signal, now))
            case "deeper":
                self._pace.test(now, deeper=True)
            case "fallen":
                self._pace.keep()
                return False
            case "noise":
                self._pace.undo()
                self._learned = self._learned_before_test
        self._apply(now)
        return signal.verdict != "noise"

    def _admitted_pace(self, signal: LossSignal, now: float) -> float | None:
        """Below the pace the server admitted lately (the rate sent, less the share refused), as a fraction of
        the limit. With no limit known, or one learnt, the limit becomes that rate. None when no requests limit
        is known to compare with."""
        admitted = self._rate_sent(now, signal.share)
        if not self._known():
            self._learned = admitted
            self._pace.rebase()
            self._apply(now)
            return None
        rpm = self._limits.rpm
        return BACKOFF * admitted.rpm * self._share / rpm if admitted.rpm is not None and rpm is not None else None

    def _step(self, now: float) -> None:
        """Move the pace for the time passed (:mod:`pace`) and re-rate the buckets; a learnt limit grows beyond
        itself while the pace probes above it."""
        grown = self._pace.step(now, beyond=self._probing_learnt())
        if grown is None:
            return
        if grown > 1.0:
            self._learned = RateLimits(*(value * grown if value is not None else None
                                         for value in (self._learned.rpm, self._learned.tpm)))
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

    def _rate_sent(self, now: float, refused: float) -> RateLimits:
        """Requests and tokens per minute actually sent over the last few seconds (before the share), less the
        ``refused`` share of them."""
        recent = [(at, cost) for at, cost in self._sent if at >= now - SENT_WINDOW_S]
        if not recent:
            return RateLimits(rpm=60.0 / self._share)  # one a second: something to probe up from
        span = max(1.0, now - recent[0][0])
        per_minute = 60.0 / span / self._share * (1 - refused)
        tokens = sum(cost for _, cost in recent)
        return RateLimits(rpm=len(recent) * per_minute, tpm=tokens * per_minute if tokens > 0 else None)

    @staticmethod
    def _exhausted(headers: Mapping[str, str], tokens: int) -> tuple[str, ...] | None:
        """The units the headers say are exhausted (none: the buckets have room); None if they say nothing."""
        remaining_requests = parse_number(_header(headers, "x-ratelimit-remaining-requests"))
        remaining_tokens = parse_number(_header(headers, "x-ratelimit-remaining-tokens"))
        if remaining_requests is None and remaining_tokens is None:
            return None
        return tuple(
            unit
            for unit, empty in (
                ("requests", remaining_requests is not None and remaining_requests <= 0),
                ("tokens", remaining_tokens is not None and remaining_tokens < tokens),
            )
            if empty
        )

    def _apply(self, now: float) -> None:
        source = RateLimits(_lower(self._configured.rpm, self._advertised.rpm),
                            _lower(self._configured.tpm, self._advertised.tpm)) if self._known() else self._learned
        self._limits = RateLimits(
            rpm=source.rpm * self._share if source.rpm is not None else None,
            tpm=source.tpm * self._share if source.tpm is not None else None,
        )
        self._requests = self._bucket(self._requests, _times(self._limits.rpm, self._pace.value), now)
        self._tokens = self._bucket(self._tokens, _times(self._limits.tpm, self._pace.value), now)

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

    def __init__(self, configured: RateLimits, share: float, burst_s: float = 0.1,
                 configured_by_model: Mapping[str, RateLimits] | None = None) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self._configured = configured
        self._configured_by_model = dict(configured_by_model or {})  # a deployment's own rpm/tpm (model list)
        self._share = share
        self._burst_s = burst_s
        self._models: LruDict[str, ModelRateLimiter] = LruDict(MAX_MODELS)  # least recently called go first
        self._told_elsewhere: LruDict[str, RateLimits] = LruDict(MAX_MODELS)  # for models not called here yet

    def for_model(self, model: str, now: float) -> ModelRateLimiter:
        limiter = self._models.get(model)
        if limiter is None:
            configured = self._configured_by_model.get(model, self._configured)
            limiter = self._models[model] = ModelRateLimiter(configured, self._share, now, self._burst_s)
            told = self._told_elsewhere.get(model)
            if told is not None:
                limiter.adopt(told, now)
        return limiter

    def adopt(self, model: str, limits: RateLimits, now: float) -> None:
        """The limits another worker of the fleet was told for ``model`` (:meth:`ModelRateLimiter.adopt`)."""
        limiter = self._models.get(model)
        if limiter is None:
            self._told_elsewhere[model] = limits
        else:
            limiter.adopt(limits, now)

    def told_for(self, model: str) -> bool:
        """Whether ``model``'s limits were configured or advertised here (:attr:`ModelRateLimiter.told`)."""
        limiter = self._models.get(model)
        return limiter is not None and limiter.told

    def told_by_model(self) -> dict[str, bool]:
        """Whether each model's limits were configured or advertised (:attr:`ModelRateLimiter.told`)."""
        return {model: limiter.told for model, limiter in self._models.items()}

    def limits_by_model(self) -> dict[str, RateLimits]:
        """The effective per-minute limits of each model seen so far."""
        return {model: limiter.limits for model, limiter in self._models.items()}

    def pacing_by_model(self) -> dict[str, Pacing]:
        """How each model seen so far is paced (for metrics)."""
        return {model: Pacing(limiter.limits, limiter.pace, limiter.refused_share)
                for model, limiter in self._models.items()}

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
