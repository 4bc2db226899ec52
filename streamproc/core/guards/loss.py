"""Which 429s are congestion: the share of calls refused over a window, and whether it falls when the pace does.

A 429 that names no empty bucket (no ``x-ratelimit-remaining-*``; a ``retry-after`` at most) may come from
the server's limiter, or from a refusal of the server's own (a busy shard, a fair-share scheduler) that hits a
share of calls whatever their rate. Read as congestion one by one, a server that refuses 1 % of calls that way
cuts the pace every few seconds and holds a client near a fifth of its limit. BBRv2 treats loss the same way:
a loss rate under a threshold is noise, not a signal. So such 429s are counted over windows of answered calls,
and a window whose share of them is above the threshold is congestion.

A cut is then a test: the calls sent at the lower pace must see the share fall to half of what it was, or
less (``fallen``: the cut holds). If it does not, the cut may have been too small (a first estimate of what
the server admits is inflated by its burst), so the pace is cut once more, deeper (``deeper``); if the share
still does not fall, the 429s were not the pace's doing: the cuts are undone (``noise``) and the threshold
rises above that share, the server's own level of refusals. Calls sent before a cut say nothing about it and
are left out of its test.

Pure: time is passed in.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Literal

from streamproc.core.guards.timeouts import SlidingWindow

WINDOW_CALLS = 100  # answered calls per window: more than 10 refused of 100 at a 1 % noise share: 1 in 10^8
THRESHOLD = 0.1  # a window with a larger share of such 429s is congestion
HIGHEST_THRESHOLD = 0.5  # the threshold never rises past this: a server refusing more is congested whatever it says
LATENCY_SAMPLES = 50  # answers whose median is the usual latency an answer waits for before joining a window
FALLEN = 0.5  # after a cut, a share at most this fraction of the one that caused it confirms the congestion


Verdict = Literal["congestion", "deeper", "fallen", "noise"]


@dataclass(frozen=True)
class LossSignal:
    """What a closed window says: ``congestion`` (cut the pace: a test begins), ``deeper`` (the share did not
    fall: cut again, deeper), ``fallen`` (it fell: keep the cut) or ``noise`` (it did not fall after the deeper
    cut either: undo the cuts)."""

    verdict: Verdict
    share: float  # of the window's calls, refused with a 429 that named no empty bucket


@dataclass(frozen=True)
class _Test:
    """A cut waiting for the share of the calls sent after it."""

    share: float  # the share that caused the cut
    cut_at: float
    deeper: bool = False  # the second, deeper cut


@dataclass
class _Window:
    calls: int = 0
    refused: int = 0


class LossShare:
    """The share of calls refused by a 429 that named no empty bucket, over windows of ``window_calls`` answered
    calls; see the module docstring."""

    def __init__(self, window_calls: int = WINDOW_CALLS, threshold: float = THRESHOLD) -> None:
        if window_calls < 1:
            raise ValueError(f"window_calls must be >= 1, got {window_calls}")
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        self._window_calls = window_calls
        self._threshold = threshold
        self._window = _Window()
        self._testing: _Test | None = None
        self._last_share: float | None = None
        self._pending: list[tuple[float, int, bool]] = []  # answers waiting to join a window: (sent, order, refused)
        self._order = itertools.count()
        self._latencies = SlidingWindow(LATENCY_SAMPLES)

    @property
    def threshold(self) -> float:
        """The share above which a window is congestion: the configured one, or above the server's own level."""
        return self._threshold

    @property
    def last_share(self) -> float | None:
        """The share of such 429s in the last closed window (None before one closed)."""
        return self._last_share

    @property
    def testing(self) -> bool:
        """Whether a cut waits for its test window."""
        return self._testing is not None

    def record(self, refused: bool, started: float, now: float) -> LossSignal | None:
        """One answered call, sent at ``started``: ``refused`` with a 429 that named no empty bucket, or not.
        Returns what its window says when a call closes one.

        Windows hold calls in the order they were sent, not answered: a 429 answers at once while the calls
        sent with it take their latency, so while the rate grows (a slow start: x4 a round trip) the answers
        of any moment hold the refusals of the newest, largest round and the successes of an older one, and a
        3 % share read as 12 %. An answer joins its window once the calls sent with it had their usual
        latency to answer (the median of the last answers that were not refused)."""
        if not refused:
            self._latencies.add(max(0.0, now - started))
        heapq.heappush(self._pending, (started, next(self._order), refused))
        usual = self._latencies.median() if len(self._latencies) else 0.0
        while self._pending and self._pending[0][0] <= now - usual:
            sent, _, was_refused = heapq.heappop(self._pending)
            if (signal := self._count(was_refused, sent, now)) is not None:
                return signal
        return None

    def _count(self, refused: bool, started: float, now: float) -> LossSignal | None:
        if self._testing is not None and started < self._testing.cut_at:
            return None  # sent at the pace before the cut: no part of its test
        window = self._window
        window.calls += 1
        window.refused += refused
        if window.calls < self._window_calls:
            return None
        self._window = _Window()
        self._last_share = window.refused / window.calls
        return self._judge(self._last_share, now)

    def _judge(self, share: float, now: float) -> LossSignal | None:
        testing, self._testing = self._testing, None
        if testing is not None and share > FALLEN * testing.share:
            if not testing.deeper:
                self._testing = _Test(testing.share, now, deeper=True)
                return LossSignal("deeper", share)
            # the share did not fall with the pace: the server's own refusals, whatever the rate
            level = (testing.share + share) / 2
            self._threshold = min(HIGHEST_THRESHOLD, max(self._threshold, level + THRESHOLD))
            return LossSignal("noise", share)
        if share > self._threshold:
            self._testing = _Test(share, now)
            return LossSignal("congestion", share)
        return LossSignal("fallen", share) if testing is not None else None

