"""Stalled partitions: a committed offset that stays put while records wait behind it.

Any wedge (a record that can never be acked, a sleeping tier that never wakes, a bug not yet known) shows
the same way from outside: the group's committed offset on a partition does not move although its lag is
above zero. A partition is *stalled* once that has lasted longer than ``threshold_s``, which the worker
sets to its slowest retry tier plus the LLM timeout: the longest a healthy head record may take. Readings
come from the consumer-lag rows the worker already reads; time is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from streamproc.core.lag import PartitionLag

Key = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class Stall:
    topic: str
    partition: int
    committed: int | None
    lag: int
    since: float  # when the committed offset last moved (or the lag appeared)


class StallWatch:
    """Folds lag readings into the set of stalled partitions; reports each stall once when it begins."""

    def __init__(self, threshold_s: float) -> None:
        if not threshold_s > 0:
            raise ValueError(f"threshold_s must be > 0, got {threshold_s}")
        self._threshold_s = threshold_s
        self._last: dict[Key, tuple[int | None, float]] = {}  # committed offset, and since when
        self._stalled: dict[Key, Stall] = {}

    @property
    def stalled(self) -> dict[Key, Stall]:
        return dict(self._stalled)

    def excuse(self, seconds: float) -> None:
        """Stop every partition's clock for ``seconds``: time in which no consumer could commit (the broker
        was down, a dead member's session had not expired yet) says nothing about a wedge."""
        self._last = {key: (committed, since + seconds) for key, (committed, since) in self._last.items()}

    def observe(self, rows: Iterable[PartitionLag], now: float) -> list[Stall]:
        """Fold one reading of this worker's partitions; returns the stalls that began with it."""
        began: list[Stall] = []
        seen: set[Key] = set()
        for row in rows:
            key = (row.topic, row.partition)
            seen.add(key)
            committed, since = self._last.get(key, (row.committed, now))
            if row.lag == 0 or row.committed != committed:
                since = now
            self._last[key] = (row.committed, since)
            if row.lag > 0 and now - since > self._threshold_s:
                stall = Stall(row.topic, row.partition, row.committed, row.lag, since)
                if key not in self._stalled:
                    began.append(stall)
                self._stalled[key] = stall
            else:
                self._stalled.pop(key, None)
        for gone in set(self._last) - seen:  # revoked: another worker owns it now
            self._last.pop(gone)
            self._stalled.pop(gone, None)
        return began
