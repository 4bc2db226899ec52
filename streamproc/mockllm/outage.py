"""The outage switch: while it is on, every chat/completions call answers 503.

A window comes from the profile (relative to server start) or from the control endpoint (from now on, for
T seconds or until switched off). Time is passed in, so the logic is testable without waiting.
"""

from __future__ import annotations

import math

from streamproc.mockllm.profiles import OutageWindow


class OutageSwitch:
    def __init__(self, window: OutageWindow | None, started_at: float) -> None:
        self.begin = self.end = 0.0
        if window is not None and window.seconds > 0:
            self.begin = started_at + window.start
            self.end = self.begin + window.seconds

    def active(self, now: float) -> bool:
        return self.begin <= now < self.end

    def remaining(self, now: float) -> float | None:
        """Seconds left in the current outage; None when it has no planned end (or is not active)."""
        if not self.active(now) or math.isinf(self.end):
            return None
        return self.end - now

    def switch_on(self, now: float, seconds: float | None = None) -> None:
        self.begin = now
        self.end = math.inf if seconds is None else now + seconds

    def switch_off(self) -> None:
        self.begin = self.end = 0.0

    def describe(self, now: float) -> dict[str, object]:
        active = self.active(now)
        return {
            "active": active,
            "remaining_s": self.remaining(now),
            "starts_in_s": self.begin - now if self.begin > now else None,
        }
