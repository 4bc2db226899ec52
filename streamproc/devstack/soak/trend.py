"""What a soak run's samples say: the slope of each measure, and whether it is a leak (pure, no I/O).

A worker's memory and open files start again when it is restarted, so a slope across restarts would show the
restarts, not a leak. The slope is taken *within* each incarnation (each start of a worker process) and
pooled: the least-squares slope with one intercept per incarnation (a fixed-effects regression), which is what
a leak shows as whatever the restarts do. The first minutes of an incarnation are left out (warm-up: imports,
caches, the table's restore).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    group: Hashable  # e.g. (worker, incarnation); one intercept each
    minute: float  # since the run's start
    value: float


def pooled_slope(points: Iterable[Point]) -> float | None:
    """Change per minute within groups (one intercept per group); None when no group has two distinct times."""
    by_group: dict[Hashable, list[Point]] = defaultdict(list)
    for point in points:
        by_group[point.group].append(point)
    covariance = variance = 0.0
    for group in by_group.values():
        mean_t = sum(p.minute for p in group) / len(group)
        mean_v = sum(p.value for p in group) / len(group)
        covariance += sum((p.minute - mean_t) * (p.value - mean_v) for p in group)
        variance += sum((p.minute - mean_t) ** 2 for p in group)
    return covariance / variance if variance > 0 else None


def slope(points: Iterable[tuple[float, float]]) -> float | None:
    """The least-squares slope of (minute, value) points: one group."""
    return pooled_slope(Point(0, minute, value) for minute, value in points)


@dataclass(frozen=True)
class Bound:
    """A measure's leak bound: its slope per minute must stay at or below ``per_minute``."""

    measure: str
    unit: str
    per_minute: float


@dataclass(frozen=True)
class Verdict:
    measure: str
    unit: str
    slope: float | None
    bound: float

    @property
    def leaks(self) -> bool:
        return self.slope is not None and self.slope > self.bound

    def line(self) -> str:
        shown = "n/a (too few samples)" if self.slope is None else f"{self.slope:+.3f} {self.unit}/min"
        return f"{self.measure:<28} {shown:<28} bound {self.bound:g} {self.unit}/min  {'LEAK' if self.leaks else 'ok'}"


def judge(bound: Bound, measured: float | None) -> Verdict:
    return Verdict(bound.measure, bound.unit, measured, bound.per_minute)
