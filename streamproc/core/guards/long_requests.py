"""A pool for long requests: calls whose estimated size (prompt + completion budget) is over a threshold hold at
most a share of a deployment's in-flight slots while short calls are about, so short calls keep flowing.

A 2,000-token generation holds a server slot a hundred times longer than a 20-token label: with nothing to stop
them, a few long calls take every slot the in-flight limit gives, and hundreds of labels wait behind them (at
the server's queue or at the gate). The size is estimated cheaply from the body (characters / 4 and
``max_tokens``, uncalibrated so the gate and the client classify a body alike). The pool is work-conserving:
when no short call has been in flight or waiting for ``quiet_s``, long calls may take every slot (a batch of
summaries alone is not throttled); a short call that comes then waits for the first long call to end, and the
long calls after it are held to their share again.

The two classes are also measured apart: a long call's latency is no queue signal for the adaptive in-flight
limit while short calls feed it, and each class has its own adaptive read timeout (:func:`timing_key`).

The worker's hand holds long records to the same share (design §5.11): a long record waiting at the gate for its
share would otherwise hold a place the short records behind it need, and the pool would cap everyone's pace. The
hand knows a record's size from its ``x-estimated-tokens`` header (:data:`SIZE_HEADER`, set by ``submit``) without
decoding it.

Pure: the gate says what starts, ends and waits, and the time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from streamproc.core.guards.token_estimate import TokenEstimator

SIZE_HEADER: Final = "x-estimated-tokens"  # a request record's estimated size, for scheduling without decoding
LONG_TIMING_SUFFIX: Final = "#long"  # never in a model name (core.model_names allows no '#')
_ESTIMATOR: Final = TokenEstimator()  # uncalibrated: the same body is the same size everywhere


@dataclass(frozen=True)
class LongRequests:
    """Which calls are long and what share of the slots they get; ``threshold_tokens`` 0: no pool."""

    threshold_tokens: int
    share: float
    quiet_s: float = 2.0  # short calls are "about" this long after the last one ended or waited

    def __post_init__(self) -> None:
        if self.threshold_tokens < 0:
            raise ValueError(f"threshold_tokens must be >= 0, got {self.threshold_tokens}")
        if not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], got {self.share}")
        if self.quiet_s < 0:
            raise ValueError(f"quiet_s must be >= 0, got {self.quiet_s}")

    def is_long(self, body: Mapping[str, Any]) -> bool:
        return self.is_long_size(estimated_size(body))

    def is_long_size(self, size_tokens: int) -> bool:
        return self.threshold_tokens > 0 and size_tokens > self.threshold_tokens

    def is_long_record(self, record_headers: Mapping[str, bytes]) -> bool:
        """Whether a record is long by its :data:`SIZE_HEADER` (none or not a number: short, as far as scheduling
        goes; the gate still sizes the body)."""
        raw = record_headers.get(SIZE_HEADER)
        if raw is None or not raw.isdigit() or len(raw) > 12:
            return False
        return self.is_long_size(int(raw))

    def cap(self, limit: int) -> int:
        """The long calls a deployment with this in-flight limit may have while short calls are about: at
        least one, so long requests never stop."""
        return max(1, math.floor(limit * self.share))


NO_POOL: Final = LongRequests(threshold_tokens=0, share=1.0)


def estimated_size(body: Mapping[str, Any]) -> int:
    """Prompt tokens (characters / 4, as the rate limiter estimates them before calibration) plus the
    completion budget (``max_completion_tokens``, ``max_tokens``, else 256)."""
    return _ESTIMATOR.raw(body) + _ESTIMATOR.max_tokens(body)


def size_header(body: Mapping[str, Any]) -> tuple[str, bytes]:
    """The :data:`SIZE_HEADER` of a request record whose body is ``body``."""
    return SIZE_HEADER, str(estimated_size(body)).encode()


def timing_key(model: str, long: bool) -> str:
    """The key of a call's adaptive timeout and own queue: a long call is timed against long calls."""
    return f"{model}{LONG_TIMING_SUFFIX}" if long else model


class LongPool:
    """Per deployment key: the long calls in flight, and whether short calls are about."""

    def __init__(self, policy: LongRequests) -> None:
        self.policy = policy
        self._long_in_use: dict[str, int] = {}
        self._short_in_use: dict[str, int] = {}
        self._short_seen_at: dict[str, float] = {}  # when a short call last ended or waited (bounded by the keys)

    def long_in_use(self, key: str) -> int:
        return self._long_in_use.get(key, 0)

    def shorts_about(self, key: str, now: float, short_waiting: bool = False) -> bool:
        """Whether short calls of ``key`` are in flight, waiting, or were within ``quiet_s``."""
        if short_waiting or self._short_in_use.get(key, 0) > 0:
            return True
        seen = self._short_seen_at.get(key)
        return seen is not None and now - seen < self.policy.quiet_s

    def may_start(self, key: str, long: bool, limit: int, now: float, short_waiting: bool) -> bool:
        """Whether a call of this class may start as far as the pool is concerned (the gate checks the slots):
        a short call always; a long one within its share while short calls are about."""
        if not long or not self.shorts_about(key, now, short_waiting):
            return True
        return self.long_in_use(key) < self.policy.cap(limit)

    def start(self, key: str, long: bool, now: float) -> None:
        counts = self._long_in_use if long else self._short_in_use
        counts[key] = counts.get(key, 0) + 1
        if not long:
            self._short_seen_at[key] = now

    def end(self, key: str, long: bool, now: float) -> None:
        counts = self._long_in_use if long else self._short_in_use
        left = counts.get(key, 0) - 1
        if left < 0:
            raise RuntimeError(f"LongPool: a {'long' if long else 'short'} call of {key!r} ended without a start")
        counts[key] = left
        if not long:
            self._short_seen_at[key] = now

    def saw_short_waiting(self, key: str, now: float) -> None:
        self._short_seen_at[key] = now
