"""The pace of one model: the fraction of its rate limits its calls are sent at.

Congestion cuts it (x0.9, at most once per ``COOLDOWN_S``), then it climbs back *quickly* to the last good
pace, the one calls were sent at before the cut (x``RECOVERY_PER_S`` per second: 0.9 is back at 1.0 in about
a second), and only then probes above it *slowly* (``PROBE_PER_S`` of the limit per second). A pace that met
congestion once after a stretch of calm was good and the 429 was jitter (our clock against the server's, a
burst the event loop let out at once); congestion again within ``GOOD_FOR_S`` of the last cut says the good
pace was not good, and it falls to ``REPEAT_BACKOFF`` of itself. Climbing back 1 % of the limit a second
instead, a pace cut three times takes 30 s to return.

A cut made on the share of 429s is a test (:mod:`loss`): when the share falls with the pace, the pace it cut to
is the good one (:meth:`Pace.keep`), and the pace probes slowly above it; when it does not, the 429s were not
the pace's doing, and the test's cuts are undone (:meth:`Pace.undo`).

Pure: time is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BACKOFF = 0.9  # the pace after congestion, as a fraction of the pace before
DEEPER = 0.5  # a test's second cut, when the first did not lower the share of 429s
COOLDOWN_S = 1.0  # one cut per burst of 429s: the calls in flight when it came were sent at the old pace
RECOVERY_PER_S = 1.1  # back towards the last good pace, multiplied by this per second
PROBE_PER_S = 0.01  # above the last good pace, this fraction of the limit per second
GOOD_FOR_S = 10.0  # congestion again within this of the last cut: the good pace was too fast
REPEAT_BACKOFF = 0.95  # ... and falls to this fraction of itself
MIN_PACE = 0.1  # never slower than this fraction of the limit
STEP_S = 0.1  # the pace moves in steps at least this far apart (each re-rates the buckets)


@dataclass(frozen=True)
class _Before:
    """The pace before a cut, to undo it."""

    value: float
    good: float
    last_cut: float


class Pace:
    """A fraction of the limits: :attr:`value`; :meth:`cut` on congestion, :meth:`step` as time passes."""

    def __init__(self, now: float) -> None:
        self._value = 1.0
        self._good = 1.0  # where recovery returns to quickly
        self._stepped_at = now
        self._last_cut = -math.inf
        self._before: _Before | None = None  # the last cut, while it may be undone

    @property
    def value(self) -> float:
        return self._value

    @property
    def good(self) -> float:
        """The last good pace: recovery returns here quickly."""
        return self._good

    def step(self, now: float, beyond: bool = False) -> float | None:
        """Move the pace for the time since the last step: quickly back to the good pace, then slowly above it,
        up to 1 (the limit), or beyond it when ``beyond`` (a limit learnt from the rate sent is a floor). Returns
        None when the pace did not move; else the factor a learnt limit grows by (1 when it does not)."""
        elapsed = now - self._stepped_at
        if elapsed < STEP_S or (self._value >= 1.0 and not beyond) or self._before is not None:
            return None  # a test's cut holds until its window of calls judged it
        self._stepped_at = now
        if self._value < self._good:
            recovering_s = math.log(self._good / self._value) / math.log(RECOVERY_PER_S)
            if elapsed <= recovering_s:
                self._value *= RECOVERY_PER_S**elapsed
                return 1.0
            self._value, elapsed = self._good, elapsed - recovering_s
        self._value += PROBE_PER_S * elapsed
        self._good = max(self._good, min(1.0, self._value))
        if self._value <= 1.0:
            return 1.0
        grown, self._value = self._value, 1.0
        return grown if beyond else 1.0

    def cut(self, now: float, resume_at: float | None = None) -> bool:
        """Congestion at ``now``: x``BACKOFF``, at most once per ``COOLDOWN_S``; the climb back starts at
        ``resume_at`` (the end of the model's pause), not before. Returns whether it cut."""
        if now - self._last_cut < COOLDOWN_S:
            return False
        self._before = None
        self._lower(now, self._value * BACKOFF)
        self._stepped_at = max(now, resume_at if resume_at is not None else now)
        return True

    def test(self, now: float, to: float | None = None, *, deeper: bool = False) -> None:
        """A cut the share of 429s asks for (:mod:`loss`): x``BACKOFF`` or to ``to``, or x``DEEPER`` when the
        first did not lower the share; undone by :meth:`undo`, kept by :meth:`keep`, and held until then (the
        test measures it). A window of calls is a round trip: no cooldown."""
        if self._before is None or not deeper:
            self._before = _Before(self._value, self._good, self._last_cut)
        factor = DEEPER if deeper else BACKOFF
        self._lower(now, self._value * factor if to is None else min(self._value * factor, to))

    def rebase(self) -> None:
        """The limit itself changed to what the server admits now (a learnt one): pace at all of it."""
        self._value = self._good = 1.0
        self._before = None

    def keep(self) -> None:
        """The test's cut lowered the share of 429s: the pace it cut to is the good one, probed above slowly."""
        self._before = None
        self._good = self._value

    def undo(self) -> None:
        """Back to the pace before the test's cuts: the share of 429s did not fall with the pace."""
        if self._before is not None:
            self._value, self._good, self._last_cut = self._before.value, self._before.good, self._before.last_cut
            self._before = None

    def _lower(self, now: float, to: float) -> None:
        again = now - self._last_cut < GOOD_FOR_S
        self._good = min(self._good, self._value) * REPEAT_BACKOFF if again else self._value
        self._value = max(MIN_PACE, to)
        self._last_cut = self._stepped_at = now
