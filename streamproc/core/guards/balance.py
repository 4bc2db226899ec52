"""Which deployment of a model takes a call: the least expected wait for its weight.

Each deployment's outstanding calls (sent, or waiting at its own pace) are counted from the routing's pick to
the answer, and its answers' latency is averaged. A call goes to the deployment whose outstanding calls, with
this one, times its latency, divided by its weight, is lowest (a deployment not heard from yet counts at the
fastest known latency, so it is tried); ties go to the one given the fewest calls for its weight. A replica
twice as slow is picked about half as often whatever the in-flight limit. Failures do not count here: a
deployment that fails is its breaker's to take out (and its calls go on to the others meanwhile); counting
them as slowness would starve it of the calls that open the breaker, and of the probes that bring it back.
Deployments the caller says cannot take a call now (breaker open, paused) are not offered.

Pure: the caller says which deployments may be called, when each call starts and how it ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

SMOOTHING: Final = 0.3  # weight of the latest answer in a deployment's latency average


@dataclass(frozen=True)
class Choice:
    """A deployment that may take the call: its key and weight."""

    key: str
    weight: float = 1.0


class DeploymentLoad:
    """The outstanding calls, the calls given and the latency of each deployment (bounded by the model list)."""

    def __init__(self) -> None:
        self._outstanding: dict[str, int] = {}
        self._given: dict[str, int] = {}
        self._latency_s: dict[str, float] = {}

    def outstanding(self, key: str) -> int:
        return self._outstanding.get(key, 0)

    def latency_s(self, key: str) -> float | None:
        """The deployment's latency average, None before its first ended call."""
        return self._latency_s.get(key)

    def pick(self, choices: Sequence[Choice]) -> Choice | None:
        """The choice that should take the next call, or None when there is none."""
        known = [latency for choice in choices if (latency := self.latency_s(choice.key)) is not None]
        untried = min(known, default=1.0)

        def expected_wait(choice: Choice) -> tuple[float, float]:
            latency = self._latency_s.get(choice.key, untried)
            return ((self.outstanding(choice.key) + 1) * latency / choice.weight,
                    (self._given.get(choice.key, 0) + 1) / choice.weight)

        return min(choices, key=expected_wait, default=None)

    def begin(self, key: str) -> None:
        self._outstanding[key] = self.outstanding(key) + 1
        self._given[key] = self._given.get(key, 0) + 1

    def abandon(self, key: str) -> None:
        """A call ended without an answer that says how fast the deployment is (refused below, cancelled, failed)."""
        left = self.outstanding(key) - 1
        if left < 0:
            raise RuntimeError(f"DeploymentLoad: a call to {key!r} ended without a begin")
        self._outstanding[key] = left

    def end(self, key: str, answered_after_s: float) -> None:
        """A call was answered after ``answered_after_s`` seconds."""
        self.abandon(key)
        before = self._latency_s.get(key)
        self._latency_s[key] = answered_after_s if before is None else before + SMOOTHING * (answered_after_s - before)
