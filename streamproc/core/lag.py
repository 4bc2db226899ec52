"""Consumer lag per group/topic/partition, and how long the backlog takes to drain: the model and its math.

Conventions (the same as ``kafka-consumer-groups --describe`` unless said otherwise):

* lag = log-end offset - committed offset, per partition, never negative;
* a partition without a committed offset counts from the log *start* offset, because streamproc's consumers
  start at the earliest record (``kafka-consumer-groups`` would print ``-`` for its lag);
* faust's own topics (table changelogs ``*-changelog``, ``*-__assignor-__leader``, ``f-reply-*``) are
  listed but marked ``internal`` and left out of a group's total: their "lag" is not work waiting;
* the drain estimate divides the lag by the *net* drain rate (records committed per second minus records
  arriving per second) over the sampling window: no estimate while the backlog is not shrinking. A group's
  estimate uses its total rate over all its topics (the workers' in-flight slots are shared by them).

Nothing here reads the broker or the clock: offsets and the times they were read come in as arguments.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

PartitionKey = tuple[str, str, int]
"""(group, topic, partition)"""

_INTERNAL_SUFFIXES = ("-changelog", "-__assignor-__leader")
_INTERNAL_PREFIXES = ("f-reply-", "__")


def is_internal_topic(topic: str) -> bool:
    """faust's changelog, leader and reply topics, and Kafka's own ``__*`` topics."""
    return topic.endswith(_INTERNAL_SUFFIXES) or topic.startswith(_INTERNAL_PREFIXES)


@dataclass(frozen=True)
class PartitionLag:
    group: str
    topic: str
    partition: int
    committed: int | None
    """The group's committed offset (the next record it will read); None when it has committed none."""
    end: int
    """Log-end offset: the offset the next produced record gets."""
    start: int = 0
    """Log-start offset: the first record still on the broker."""
    rate: float | None = None
    """Records committed per second over the sampling window; None when not sampled twice."""
    eta_seconds: float | None = None

    @property
    def key(self) -> PartitionKey:
        return (self.group, self.topic, self.partition)

    @property
    def internal(self) -> bool:
        return is_internal_topic(self.topic)

    @property
    def lag(self) -> int:
        position = self.committed if self.committed is not None else self.start
        return max(self.end - position, 0)


@dataclass(frozen=True)
class GroupLag:
    group: str
    partitions: tuple[PartitionLag, ...]
    state: str | None = None
    """The coordinator's view: ``Stable``, ``Empty`` (no member running), ``PreparingRebalance``, ..."""
    members: int | None = None
    rate: float | None = None
    eta_seconds: float | None = None

    @property
    def lag(self) -> int:
        """Total lag over the group's partitions, internal topics excluded."""
        return sum(p.lag for p in self.partitions if not p.internal)


@dataclass(frozen=True)
class LagReport:
    groups: tuple[GroupLag, ...]
    taken_at: float
    """Unix time of the (last) reading."""
    interval_s: float | None = None
    """Seconds between the two readings the rates come from; None when not sampled twice."""

    def group(self, name: str) -> GroupLag:
        for group in self.groups:
            if group.group == name:
                return group
        raise KeyError(name)

    def committed(self) -> dict[PartitionKey, int]:
        return {p.key: p.committed for g in self.groups for p in g.partitions if p.committed is not None}

    def ends(self) -> dict[PartitionKey, int]:
        return {p.key: p.end for g in self.groups for p in g.partitions}

    def over(self, max_lag: int) -> list[GroupLag]:
        """The groups whose total lag exceeds ``max_lag``."""
        return [g for g in self.groups if g.lag > max_lag]

    def estimated(self, estimator: DrainEstimator) -> LagReport:
        """This report with rates and drain estimates from ``estimator`` (which must have seen it last).

        A group's estimate uses its total net rate over all its (non-internal) topics: a worker's in-flight
        slots are shared by the requests and every retry tier, so the topics drain together, not apart.
        """
        groups = []
        for group in self.groups:
            partitions = tuple(
                replace(p, rate=estimator.rate(p.group, p.topic, p.partition),
                        eta_seconds=estimator.estimate_seconds(p.lag, p.group, p.topic, p.partition))
                for p in group.partitions)
            topics = sorted({p.topic for p in partitions if not p.internal})
            known = [r for r in (estimator.rate(group.group, topic) for topic in topics) if r is not None]
            rate = sum(known) if known else None
            arriving = sum(estimator.arrival_rate(group.group, topic) or 0.0 for topic in topics)
            eta = _drain_seconds(group.lag, rate, arriving)
            groups.append(replace(group, partitions=partitions, rate=rate, eta_seconds=eta))
        return replace(self, groups=tuple(groups), interval_s=estimator.span_s())


def _drain_seconds(lag: int, consumed: float | None, arriving: float) -> float | None:
    if lag <= 0:
        return 0.0
    if consumed is None or consumed - arriving <= 0:
        return None
    return lag / (consumed - arriving)


# -- drain estimate -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Sample:
    at: float
    committed: Mapping[PartitionKey, int]
    ends: Mapping[PartitionKey, int] | None


class DrainEstimator:
    """Consumption and arrival rates from timestamped offset samples, over a sliding window.

    Feed it ``add(timestamp, committed_offsets, end_offsets)`` as readings come in; ask for the rate of a
    group, one of its topics or one partition, and for the seconds a lag takes to drain at that pace.
    Rates compare the oldest and newest sample in the window; the oldest sample kept is the newest one
    that is at least ``window_s`` old, so a slow sampler still gets a rate. A partition counts only when
    both samples have it; an offset that went backwards (an offset reset) counts as no progress.
    """

    def __init__(self, window_s: float = 60.0) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self._window_s = window_s
        self._samples: deque[_Sample] = deque()

    def add(self, timestamp: float, committed: Mapping[PartitionKey, int],
            ends: Mapping[PartitionKey, int] | None = None) -> None:
        if self._samples and timestamp < self._samples[-1].at:
            raise ValueError("samples must come in time order")
        self._samples.append(_Sample(timestamp, dict(committed), dict(ends) if ends is not None else None))
        while len(self._samples) > 2 and self._samples[1].at <= timestamp - self._window_s:
            self._samples.popleft()

    def span_s(self) -> float | None:
        """Seconds between the oldest and newest sample in use; None with fewer than two."""
        if len(self._samples) < 2 or self._samples[-1].at <= self._samples[0].at:
            return None
        return self._samples[-1].at - self._samples[0].at

    def rate(self, group: str, topic: str | None = None, partition: int | None = None) -> float | None:
        """Records committed per second by ``group`` (on ``topic``, on ``partition``); None if unknown."""
        return self._rate(group, topic, partition, ends=False)

    def arrival_rate(self, group: str, topic: str | None = None, partition: int | None = None) -> float | None:
        """Records produced per second to the partitions of the same selection; None if not sampled."""
        return self._rate(group, topic, partition, ends=True)

    def estimate_seconds(self, lag: int, group: str, topic: str | None = None,
                         partition: int | None = None) -> float | None:
        """Seconds until ``lag`` records are consumed at the net pace; 0 without lag, None if not draining."""
        return _drain_seconds(lag, self.rate(group, topic, partition),
                              self.arrival_rate(group, topic, partition) or 0.0)

    def _rate(self, group: str, topic: str | None, partition: int | None, ends: bool) -> float | None:
        span = self.span_s()
        if span is None:
            return None
        first, last = self._samples[0], self._samples[-1]
        old, new = (first.ends, last.ends) if ends else (first.committed, last.committed)
        if old is None or new is None:
            return None
        progress, matched = 0, False
        for key, offset in new.items():
            if key[0] != group or (topic is not None and key[1] != topic) or (
                    partition is not None and key[2] != partition):
                continue
            before = old.get(key)
            if before is None:
                continue
            matched = True
            progress += max(offset - before, 0)
        return progress / span if matched else None
