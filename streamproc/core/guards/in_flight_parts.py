"""How the worker's calls in flight are shared among its deployments: each within its own adaptive limit, all
within the worker's total, and each sure of its part of that total.

Each deployment has its own in-flight limit (:mod:`streamproc.core.guards.gradient`), learnt from its own
latency: a slow replica's answers must not read as a queue at a fast one. The worker's total stays bounded
(``STREAMPROC_IN_FLIGHT``). Within it every deployment known is sure of ``min(its limit, total / n)`` slots,
its *part*: a deployment may start a call beyond its part only with slots no other deployment's part needs.
Slots cannot be taken back from a call, so without the parts a replica that hangs would keep every slot it
took while the others were quiet, and the healthy replica's calls would wait for its timeouts. With one
deployment (the single endpoint) its part is the whole total and this is its limit alone.

Pure: the caller counts the calls it starts and ends and says each deployment's limit now.
"""

from __future__ import annotations

from collections.abc import Mapping


class InFlightParts:
    """The calls in flight of each deployment (by key) within the worker's ``total``."""

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError(f"total must be >= 1, got {total}")
        self.total = total
        self._in_use: dict[str, int] = {}  # only deployments with calls in flight

    def in_use(self, key: str) -> int:
        return self._in_use.get(key, 0)

    @property
    def total_in_use(self) -> int:
        return sum(self._in_use.values())

    def part(self, key: str, limits: Mapping[str, int]) -> int:
        """The slots ``key`` is sure of: its limit, or an equal part of the total when that is less (none when
        there are more deployments than slots: then every slot is first come)."""
        return min(limits[key], self.total // max(1, len(limits)))

    def may_start(self, key: str, limits: Mapping[str, int]) -> bool:
        """Whether a call of ``key`` may start now; ``limits`` holds the limit of every deployment known."""
        used = self.in_use(key)
        if used >= limits[key] or self.total_in_use >= self.total:
            return False
        if used < self.part(key, limits):
            return True
        kept_for_others = sum(max(0, self.part(other, limits) - self.in_use(other)) for other in limits if other != key)
        return self.total_in_use + 1 + kept_for_others <= self.total

    def start(self, key: str) -> None:
        self._in_use[key] = self.in_use(key) + 1

    def end(self, key: str) -> None:
        left = self.in_use(key) - 1
        if left < 0:
            raise RuntimeError(f"InFlightParts: a call of {key!r} ended without a start")
        if left:
            self._in_use[key] = left
        else:
            del self._in_use[key]
