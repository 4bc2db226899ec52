"""An in-flight limit that finds the server's capacity from latency: a gradient limiter (the Vegas/gradient
family of Netflix's concurrency-limits), plus a multiplicative cut on 429 congestion.

A server answers ``c`` calls at once and queues the rest, so past ``c`` every extra call in flight adds
queueing time to every call: latency grows with the limit while throughput does not. The limiter compares
the mean latency of the last window of calls with the best single call seen (the no-load latency, as
Vegas's minimum RTT) and moves the limit by their ratio, the gradient:

    gradient  = clamp(tolerance * baseline / recent, 0.5, 1)
    new limit = limit * gradient + sqrt(limit)        (smoothed; the sqrt term keeps probing upwards)

Against a server with one slot the limit settles at a few calls (the fixed point of ``L = L/2 + sqrt(L)``
is 4), so no call waits behind a long queue the client itself made; against a server whose latency does
not grow with load the gradient stays 1 and the limit grows to its ceiling (x4 per window while latency
stays where it was, as TCP's slow start, then by ``sqrt`` per window).

Slow start ends as HyStart++ (RFC 9406) ends it: a window clearly slower than the one before (x1.25, and
by more than ``min_rise_s``) starts a *conservative* phase that grows by a quarter of the slow-start rate.
If latency comes back to its level before the rise, the rise was noise (a burst of slow answers, a
connection warming up) and slow start resumes; after five conservative windows still above it, growth
goes on by ``sqrt`` only. A window the gradient cuts (a queue measured against the best call, or a burst)
counts as a conservative window. Ending slow start on the first slow window stranded the limit at a tenth
of a fast server's ceiling for minutes after one early burst of slow answers.

The first window has no window before it: it grows x4 if its mean raw latency is within
``FIRST_WINDOW_SPREAD`` of its fastest call's (its calls all started at once, and the first to answer did
not wait). Otherwise its latencies are spread by a queue, by a stall, or by the answers themselves, and its
best call may itself have waited (behind other calls, or behind answers that fed no sample): the baseline
cannot tell which. So the limiter *probes*, once, as BBR's ProbeRTT drains its queue to measure the path's
own delay: the limit drops to its minimum until the calls out have drained and one call went alone. If the
first window's calls waited, by their median, more than ``PROBE_WAITED`` such calls beyond their own
length at its pace, the window was a queue the client made: the limit falls by that much (at most x4) and
slow start ends. Otherwise the limit goes back where it was and the next window is a first window again
(grown by ``sqrt`` if it is not calm, and the one after judged against it). A probe whose calls hang
gives up at :attr:`GradientLimit.probe_expires_at` (the caller keeps the timer) and the limit goes back.
Against a real one-slot llama.cpp server, a baseline taken from a queued first window was 3x the real one
and the limit hovered at 11-16, once climbing to 61, instead of settling at a few calls.

Latency is compared per completion token when the answers say how many they produced: an LLM's latency is
mostly its output length, and a batch mixing 5-token labels with 500-token summaries must not read as a
queue. A rise must also exceed ``min_rise_s`` of raw latency, so milliseconds of scheduler noise (a local
mock, a saturated event loop) never cut the limit. That rise is the window's mean latency beyond what its
calls would have taken at the baseline's pace (its tokens times the best latency per token), not beyond the
best call's own latency: the best call per token is often a long answer that itself waited in a queue, and
against a one-slot server its seconds hid the queue of the short answers around it (the limit went x4 to 64;
a real llama.cpp server then timed calls out). The tolerance (3) leaves room for the spread of
healthy latencies around their best. The baseline relaxes slowly towards each window's best call, so a
lasting change (a slower model version) becomes the new normal; under a queue that lasts, it drifts up
too, which lets the limit creep (Vegas has the same trade-off). Windows where fewer than half the slots
were used say nothing about capacity and do not grow the limit. After a change, only calls started after it
count: a window is one round trip at the new limit, so slow start cannot double past a queue it has not
seen yet.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

MIN_GRADIENT = 0.5  # at most halve per window: one slow window must not collapse the limit
SLOW_START_GROWTH = 4  # per window while nothing queues: 16 -> 256 in two round trips, from the first
SLOW_START_RISE = 1.25  # a window this much slower than the one before ends slow start (as HyStart)
CONSERVATIVE_GROWTH = 1 + (SLOW_START_GROWTH - 1) / 4  # HyStart++'s conservative slow start: a quarter of the rate
CONSERVATIVE_WINDOWS = 5  # windows of conservative growth before growth is by sqrt only (RFC 9406's CSS_ROUNDS)
FIRST_WINDOW_SPREAD = 2.0  # the first window grows x4 only if its mean raw latency is within this of its fastest
BASELINE_RELAX = 0.002  # per window, the fraction of the gap to the window's best call the baseline moves up
PROBE_WAITED = 2.0  # the first window's median call waited this many alone calls: it was a queue of ours
PROBE_EXPIRY = 2.0  # the probe gives up after twice the drain a one-slot server would take: a call hung
PROBE_ATTEMPTS = 5  # calls sent alone that generated nothing (refused, failed) before the probe gives up


@dataclass
class _Window:
    samples: int = 0
    per_token: float = 0.0  # sum of latency per completion token (or raw latency when tokens are unknown)
    raw: float = 0.0  # sum of raw latency, seconds
    units: float = 0.0  # sum of completion tokens (1 for a call without a token count)
    busiest: int = 0  # most calls in flight seen during the window
    best: float = math.inf  # the fastest call's latency per token
    fastest_s: float = math.inf  # the fastest call's raw latency
    slowest_s: float = 0.0  # the slowest call's raw latency
    calls: list[tuple[float, float]] = field(default_factory=list)  # (raw latency, tokens or 1) of each call

    def add(self, latency_s: float, tokens: int | None, in_flight: int) -> None:
        per_token = latency_s / tokens if tokens else latency_s
        self.samples += 1
        self.per_token += per_token
        self.raw += latency_s
        self.units += tokens or 1
        self.busiest = max(self.busiest, in_flight)
        self.best = min(self.best, per_token)
        self.fastest_s = min(self.fastest_s, latency_s)
        self.slowest_s = max(self.slowest_s, latency_s)
        self.calls.append((latency_s, tokens or 1))

    def median_wait_s(self, alone: float) -> float:
        """The median of the calls' latency beyond what each would take at ``alone`` (seconds per token): the
        time they waited. The median, not the mean: a few stalled calls move the mean, a queue moves this."""
        return statistics.median(latency - alone * units for latency, units in self.calls)

    def excess_s(self, baseline: float) -> float:
        """Mean seconds per call beyond what the window's calls take at ``baseline`` (seconds per token)."""
        return (self.raw - baseline * self.units) / self.samples

    def spread(self) -> float:
        """Mean raw latency over the fastest call's."""
        return self.raw / self.samples / self.fastest_s if self.fastest_s > 0 else 1.0


@dataclass
class _Probe:
    """A call to be sent alone, after the first window: what that window showed, and where the limit was."""

    window: _Window  # the first window
    value: float  # the limit before the probe
    expires_at: float  # a drain or a probe call slower than this is a stall, not a measurement
    attempts: int = 0


@dataclass(frozen=True)
class ProbeVerdict:
    """What the last probe found: ``queue`` (the first window was the client's own queue), ``unclear`` (spread
    answers, or a queue one call cannot tell), ``no_answer`` (its calls generated nothing), ``expired`` (a call
    hung) or ``congestion`` (a 429 ended it); for the first two, the alone call and the median wait."""

    verdict: str
    alone_s: float | None = None
    tokens: int | None = None
    waited: float | None = None  # the first window's median wait, in alone calls

    def __str__(self) -> str:
        if self.alone_s is None:
            return self.verdict
        return (f"{self.verdict}: a call alone took {self.alone_s:.2f} s for {self.tokens or '?'} tokens, the first "
                f"window's calls waited {self.waited:.1f} such calls (median)")


class GradientLimit:
    """Concurrency limit from the latency gradient, cut by ``backoff`` on congestion; within [minimum, maximum].

    Feed it every answered call (:meth:`on_sample`) and every 429 that says a bucket is empty
    (:meth:`on_congestion`); read :attr:`limit`. Time is passed in; nothing here waits.
    """

    def __init__(self, minimum: int, maximum: int, initial: int | None = None, *, tolerance: float = 3.0,
                 smoothing: float = 0.5, window: int = 10, backoff: float = 0.9, cooldown_s: float = 1.0,
                 min_rise_s: float = 0.5) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum}, {maximum}")
        if initial is not None and not minimum <= initial <= maximum:
            raise ValueError(f"initial must be within [{minimum}, {maximum}], got {initial}")
        if not tolerance >= 1:
            raise ValueError(f"tolerance must be >= 1, got {tolerance}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if not 0 < backoff < 1:
            raise ValueError(f"backoff must be in (0, 1), got {backoff}")
        if not cooldown_s >= 0:
            raise ValueError(f"cooldown_s must be >= 0, got {cooldown_s}")
        self._arguments = (minimum, maximum, initial, tolerance, smoothing, window, backoff, cooldown_s, min_rise_s)
        self._minimum = minimum
        self._maximum = maximum
        self._tolerance = tolerance
        self._smoothing = smoothing
        self._window_size = window
        self._backoff = backoff
        self._cooldown_s = cooldown_s
        self._min_rise_s = min_rise_s
        self._value = float(initial if initial is not None else minimum)
        self._slow_start = True
        self._conservative: tuple[float, int] | None = None  # (latency level before the rise, windows spent)
        self._previous_recent: float | None = None  # the last window's mean latency per token
        self._window = _Window()
        self._baseline: float | None = None  # the best call's latency per token
        self._last_cut = -math.inf
        self._changed_at = -math.inf  # calls started before the last change say nothing about the new limit
        self._probe: _Probe | None = None
        self._probed = False  # one probe, after the first window
        self.last_probe: ProbeVerdict | None = None
        self._listeners: list[Callable[[], None]] = []

    def fresh(self) -> GradientLimit:
        """A new limit with the same bounds and tuning, at the same start: another deployment's, which learns
        from its own calls."""
        minimum, maximum, initial, tolerance, smoothing, window, backoff, cooldown_s, min_rise_s = self._arguments
        return GradientLimit(minimum, maximum, initial, tolerance=tolerance, smoothing=smoothing, window=window,
                             backoff=backoff, cooldown_s=cooldown_s, min_rise_s=min_rise_s)

    @property
    def limit(self) -> int:
        return min(self._maximum, max(self._minimum, math.floor(self._value + 1e-9)))

    @property
    def maximum(self) -> int:
        return self._maximum

    @property
    def probing(self) -> bool:
        """True while the limit waits, at its minimum, for a call sent alone."""
        return self._probe is not None

    @property
    def baseline_s(self) -> float | None:
        """The no-load latency per completion token the limiter compares with (seconds; per call when answers
        carry no token counts), once a window completed."""
        return self._baseline

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever :attr:`limit` changes (a gate wakes its waiters when it grows)."""
        self._listeners.append(listener)

    def on_sample(self, latency_s: float, in_flight: int, now: float, completion_tokens: int | None = None) -> None:
        """A call answered after ``latency_s`` with ``in_flight`` calls running (itself included)."""
        if not (latency_s >= 0 and math.isfinite(latency_s)) or now - latency_s < self._changed_at:
            return
        tokens = completion_tokens if completion_tokens and completion_tokens > 0 else None
        if self._probe is not None:
            self._judge_probe(self._probe, latency_s, tokens, now)
            return
        self._window.add(latency_s, tokens, in_flight)
        if self._window.samples >= self._window_size:
            window, self._window = self._window, _Window()
            self._close(window, now)

    def on_unsampled(self, latency_s: float, now: float, completion_tokens: int | None = None) -> None:
        """A call answered without a sample: an answer that failed its checks (``completion_tokens`` generated),
        or a failure or refusal. Only a probe hears it: a generation sent alone measures as well as a success;
        anything else taught nothing, and after ``PROBE_ATTEMPTS`` of those the limit goes back where it was."""
        probe = self._probe
        if probe is None or now - latency_s < self._changed_at:
            return
        if completion_tokens:
            self._judge_probe(probe, latency_s, completion_tokens, now)
            return
        probe.attempts += 1
        if probe.attempts >= PROBE_ATTEMPTS:
            self._give_up_probe(now, "no_answer")

    @property
    def probe_expires_at(self) -> float | None:
        """When a probe still waiting (for the calls out to drain, or for its own answer) gives up."""
        return self._probe.expires_at if self._probe is not None else None

    def on_probe_expired(self, now: float) -> None:
        """The caller's timer for :attr:`probe_expires_at`: a call that hangs must not hold every other call
        back for a whole read timeout. The limit goes back where it was."""
        if self._probe is not None and now >= self._probe.expires_at:
            self._give_up_probe(now, "expired")

    def _give_up_probe(self, now: float, verdict: str) -> None:
        assert self._probe is not None
        value, self._probe = self._probe.value, None
        self.last_probe = ProbeVerdict(verdict)
        self._set(value, now)

    def on_congestion(self, now: float) -> None:
        """The provider pushed back (a 429 saying a limit is exhausted): cut, at most once per cooldown."""
        if now - self._last_cut < self._cooldown_s:
            return
        self._last_cut = now
        self._slow_start = False
        self._conservative = None
        if self._probe is not None:
            self._value, self._probe = self._probe.value, None  # cut from where it was, in one change
            self.last_probe = ProbeVerdict("congestion")
        self._set(max(float(self._minimum), self._value * self._backoff), now)

    def _close(self, window: _Window, now: float) -> None:
        recent = window.per_token / window.samples
        if self._baseline is None or window.best < self._baseline:
            self._baseline = window.best
        risen = window.excess_s(self._baseline) > self._min_rise_s
        gradient = self._gradient(recent, risen)
        self._baseline += BASELINE_RELAX * (window.best - self._baseline)
        used_half = window.busiest * 2 >= self.limit
        if gradient >= 1.0 and not used_half:
            return  # the client, not the server, kept the calls few: nothing learnt about capacity
        previous, self._previous_recent = self._previous_recent, recent
        level_before = recent if previous is None else previous
        # The first window has no level before it to judge a rise by, and its calls all started at once. The
        # first to answer did not wait; if the mean took FIRST_WINDOW_SPREAD times as long, the others may have
        # waited behind it (per token it does not show: a long answer that waited can be the best per token).
        # Then a call sent alone tells.
        calm = not risen and window.spread() <= FIRST_WINDOW_SPREAD
        if previous is None and self._slow_start and not calm and not self._probed:
            self._probed = True
            # against one slot, the calls out drain in about (limit / window) times the window's slowest call
            drain_s = window.slowest_s * max(1.0, self._value / window.samples)
            self._probe = _Probe(window, self._value, now + PROBE_EXPIRY * drain_s)
            self._set(float(self._minimum), now)
            return
        if gradient >= 1.0 and self._slow_start and (previous is not None or calm):
            growth = self._slow_start_growth(recent, risen, level_before)
            if growth is not None:
                self._set(min(float(self._maximum), self._value * growth), now)
                return
        self._follow(gradient, level_before, now)

    def _follow(self, gradient: float, level_before: float, now: float) -> None:
        """Move the limit halfway to ``limit * gradient + sqrt(limit)``; a cut in slow start is a doubt."""
        if gradient < 1.0 and self._slow_start:
            self._doubt(level_before)
        target = self._value * gradient + math.sqrt(self._value)
        smoothed = self._value + self._smoothing * (target - self._value)
        self._set(min(float(self._maximum), max(float(self._minimum), smoothed)), now)

    def _judge_probe(self, probe: _Probe, latency_s: float, tokens: int | None, now: float) -> None:
        """The call sent alone answered after ``latency_s``: a latency with no queue of ours before it. If the
        first window's calls waited, by their median, more than ``PROBE_WAITED`` such calls beyond their own
        length at its pace, the window was a queue the client made: the limit falls by ``tolerance / (1 +
        waited)`` (at most x4) and slow start ends. Otherwise the limit goes back and the next window is a
        first window again."""
        self._probe = None
        alone = latency_s / tokens if tokens else latency_s
        assert self._baseline is not None
        self._baseline = min(self._baseline, alone)
        self._value = probe.value
        self._previous_recent = None
        waited = probe.window.median_wait_s(alone) / latency_s if latency_s > 0 else 0.0
        queue = waited > PROBE_WAITED
        self.last_probe = ProbeVerdict("queue" if queue else "unclear", latency_s, tokens, waited)
        if not queue:  # spread answers, or a queue one call cannot tell: start again, as before
            self._set(probe.value, now)
            return
        self._slow_start = False
        self._conservative = None
        shrink = max(1 / SLOW_START_GROWTH, self._tolerance / (1 + waited))
        self._set(max(float(self._minimum), probe.value * shrink), now)

    def _slow_start_growth(self, recent: float, risen: bool, previous: float) -> float | None:
        """The factor slow start grows by after this window, or None once it is over (HyStart++)."""
        if self._conservative is None:
            if recent <= SLOW_START_RISE * previous or not risen:
                return SLOW_START_GROWTH
            self._conservative = (previous, 0)  # latency rose with the last growth: a queue, or noise?
            return CONSERVATIVE_GROWTH
        level, spent = self._conservative
        if recent <= SLOW_START_RISE * level or not risen:
            self._conservative = None  # back to where it was: the rise was noise
            return SLOW_START_GROWTH
        if spent + 1 >= CONSERVATIVE_WINDOWS:
            self._slow_start = False
            self._conservative = None
            return None
        self._conservative = (level, spent + 1)
        return CONSERVATIVE_GROWTH

    def _doubt(self, previous: float) -> None:
        """A window cut during slow start: a queue, or a burst of slow answers. It counts as a conservative
        window: slow start resumes if latency comes back to its level before, and ends after
        ``CONSERVATIVE_WINDOWS`` windows that do not."""
        level, spent = self._conservative or (previous, 0)
        if spent + 1 >= CONSERVATIVE_WINDOWS:
            self._slow_start = False
            self._conservative = None
        else:
            self._conservative = (level, spent + 1)

    def _gradient(self, recent: float, risen: bool) -> float:
        assert self._baseline is not None
        if recent <= 0 or not risen:
            return 1.0
        return max(MIN_GRADIENT, min(1.0, self._tolerance * self._baseline / recent))

    def _set(self, value: float, now: float) -> None:
        before = self.limit
        self._value = value
        if self.limit != before:
            self._changed_at = now
            self._window = _Window()
            for listener in self._listeners:
                listener()
