"""Consumer lag per group/topic/partition, and how long the backlog takes to drain (``streamproc lag``).

Offsets come straight from the broker: a group's committed offsets through the admin API
(``ListConsumerGroups``, ``OffsetFetch``), log start/end offsets through a throwaway consumer without a
group (``ListOffsets``). The worker's ``consumer_lag`` gauge reads the same way (:class:`LagReader`), so
the command and Prometheus show the same numbers.

Conventions (the same as ``kafka-consumer-groups --describe`` unless said otherwise):

* lag = log-end offset - committed offset, per partition, never negative;
* every partition of every topic the group has committed on is listed; a partition without a committed
  offset shows ``-`` as its current offset and counts from the log *start* offset, because streamproc's
  consumers start at the earliest record (``kafka-consumer-groups`` would print ``-`` for its lag);
* faust's own topics (table changelogs ``*-changelog``, ``*-__assignor-__leader``, ``f-reply-*``) are
  listed but marked ``internal`` and left out of a group's total: their "lag" is not work waiting;
* the drain estimate divides the lag by the *net* drain rate (records committed per second minus records
  arriving per second) over the sampling window: no estimate while the backlog is not shrinking. A group's
  estimate uses its total rate over all its topics (the workers' in-flight slots are shared by them).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

PartitionKey = tuple[str, str, int]
"""(group, topic, partition)"""

_INTERNAL_SUFFIXES = ("-changelog", "-__assignor-__leader")
_INTERNAL_PREFIXES = ("f-reply-", "__")


class LagError(RuntimeError):
    """Lag could not be read; the message is one line for the operator."""


class BrokerUnavailable(LagError):
    """The cluster did not answer."""


class GroupNotFound(LagError):
    """A requested consumer group is unknown to the cluster (no members and no committed offsets)."""


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
    taken_at: float = field(default_factory=time.time)
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


# -- reading from the broker --------------------------------------------------------------------------------
class LagReader:
    """An admin client and a group-less consumer, kept open for repeated readings."""

    def __init__(self, bootstrap: str, request_timeout_ms: int = 10_000) -> None:
        self._bootstrap = bootstrap
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms)
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                          request_timeout_ms=request_timeout_ms)
        self._started = False

    async def start(self) -> None:
        try:
            await self._admin.start()
            await self._consumer.start()
        except KafkaError as exc:
            await self.close()
            raise BrokerUnavailable(f"Kafka at {self._bootstrap} is not reachable ({exc})") from exc
        self._started = True

    async def close(self) -> None:
        self._started = False
        await self._consumer.stop()
        await self._admin.close()

    async def __aenter__(self) -> LagReader:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def groups(self) -> list[str]:
        """Every consumer group the cluster knows, sorted."""
        listed = await self._admin.list_consumer_groups()
        return sorted({entry[0] for entry in listed})

    async def read(self, groups: Iterable[str] | None = None,
                   topics: Mapping[str, Collection[str]] | None = None) -> LagReport:
        """One reading for ``groups`` (all groups when None).

        ``topics`` names, per group, topics to list even where the group has committed nothing yet (the
        worker's inputs: a backlog on a topic it never committed on is still a backlog); topics that do
        not exist are left out.
        """
        try:
            known = await self.groups()
            wanted = known if groups is None else list(dict.fromkeys(groups))
            missing = [g for g in wanted if g not in known]
            if missing:
                raise GroupNotFound(f"consumer group {missing[0]!r} does not exist on {self._bootstrap} "
                                    f"(known: {', '.join(known) or 'none'})")
            committed = {g: await self._admin.list_consumer_group_offsets(g) for g in wanted}
            described = await self._describe(wanted)
            existing = await self._consumer.topics()
            per_group: dict[str, set[TopicPartition]] = {}
            for group in wanted:
                names = {tp.topic for tp in committed[group]} | set((topics or {}).get(group, ()))
                per_group[group] = {TopicPartition(name, p) for name in names if name in existing
                                    for p in self._consumer.partitions_for_topic(name) or ()}
            everything = sorted(set().union(*per_group.values()))
            ends = await self._consumer.end_offsets(everything) if everything else {}
            starts = await self._consumer.beginning_offsets(everything) if everything else {}
        except KafkaError as exc:
            raise BrokerUnavailable(f"could not read offsets from Kafka at {self._bootstrap} ({exc})") from exc
        now = time.time()
        report = []
        for group in wanted:
            rows = []
            for tp in sorted(per_group[group]):
                meta = committed[group].get(tp)
                offset = meta.offset if meta is not None and meta.offset >= 0 else None
                rows.append(PartitionLag(group, tp.topic, tp.partition, offset, ends[tp], starts[tp]))
            state, members = described.get(group, (None, None))
            report.append(GroupLag(group, tuple(rows), state, members))
        return LagReport(tuple(report), taken_at=now)

    async def partitions(self, group: str, partitions: Collection[tuple[str, int]]) -> list[PartitionLag]:
        """Committed and end offsets of the given partitions only (the worker's own assignment)."""
        tps = sorted(TopicPartition(topic, partition) for topic, partition in partitions)
        if not tps:
            return []
        committed = await self._admin.list_consumer_group_offsets(group, partitions=tps)
        ends = await self._consumer.end_offsets(tps)
        starts = await self._consumer.beginning_offsets(tps)
        rows = []
        for tp in tps:
            meta = committed.get(tp)
            offset = meta.offset if meta is not None and meta.offset >= 0 else None
            rows.append(PartitionLag(group, tp.topic, tp.partition, offset, ends[tp], starts[tp]))
        return rows

    async def _describe(self, groups: list[str]) -> dict[str, tuple[str | None, int | None]]:
        """State and member count per group; best effort (the offsets are what matters)."""
        out: dict[str, tuple[str | None, int | None]] = {}
        try:
            responses = await self._admin.describe_consumer_groups(groups) if groups else []
        except KafkaError:
            return out
        for response in responses:
            for entry in response.to_object().get("groups", []):
                if not entry.get("error_code"):
                    out[entry["group"]] = (entry.get("state") or None, len(entry.get("members") or []))
        return out


async def read_lag(bootstrap: str, groups: list[str] | None,
                   topics: Mapping[str, Collection[str]] | None = None) -> LagReport:
    """One reading of the lag of ``groups`` (every group of the cluster when None).

    Raises :class:`BrokerUnavailable` or :class:`GroupNotFound` (both :class:`LagError`).
    """
    async with LagReader(bootstrap) as reader:
        return await reader.read(groups, topics)


async def sample_lag(bootstrap: str, groups: list[str] | None, interval_s: float,
                     topics: Mapping[str, Collection[str]] | None = None) -> LagReport:
    """Two readings ``interval_s`` apart: the second one, with rates and drain estimates."""
    estimator = DrainEstimator(window_s=max(interval_s * 2, 1.0))
    async with LagReader(bootstrap) as reader:
        first = await reader.read(groups, topics)
        estimator.add(first.taken_at, first.committed(), first.ends())
        await asyncio.sleep(interval_s)
        second = await reader.read([g.group for g in first.groups], topics)
        estimator.add(second.taken_at, second.committed(), second.ends())
    return second.estimated(estimator)


# -- drain estimate (pure) ----------------------------------------------------------------------------------
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


# -- output (pure) ------------------------------------------------------------------------------------------
COLUMNS = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "RATE/s", "ETA")


def format_duration(seconds: float | None) -> str:
    """``-`` (unknown), ``0s``, ``42s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    if seconds is None or math.isnan(seconds):
        return "-"
    total = math.ceil(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h{total % 3600 // 60:02d}m"
    return f"{total // 86400}d{total % 86400 // 3600:02d}h"


def _format_rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.1f}"


def format_table(report: LagReport) -> str:
    """Aligned columns like ``kafka-consumer-groups --describe``, then one summary line per group.

    Internal (faust) topics are marked with ``*`` and left out of the totals.
    """
    rows: list[tuple[str, ...]] = [COLUMNS]
    for group in report.groups:
        for p in group.partitions:
            rows.append((group.group, p.topic + ("*" if p.internal else ""), str(p.partition),
                         "-" if p.committed is None else str(p.committed), str(p.end), str(p.lag),
                         _format_rate(p.rate), format_duration(p.eta_seconds)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.append("")
    for group in report.groups:
        lines.append(summary_line(group, report.interval_s))
    if any(p.internal for g in report.groups for p in g.partitions):
        lines.append("* faust's internal topic (table changelog, leader or reply topic): not counted in the lag")
    return "\n".join(lines)


def summary_line(group: GroupLag, interval_s: float | None) -> str:
    """``streamproc: lag 420, consuming 12.5 records/s, drained in ~34s (Stable, 2 members)``."""
    text = f"{group.group}: lag {group.lag}"
    if interval_s is not None:
        text += f", consuming {_format_rate(group.rate)} records/s"
        if group.lag == 0:
            text += ", nothing to drain"
        elif group.eta_seconds is None:
            text += ", not draining (no progress, or records arrive as fast as they are consumed)"
        else:
            text += f", drained in ~{format_duration(group.eta_seconds)}"
    if group.state is not None:
        members = f", {group.members} member{'' if group.members == 1 else 's'}" if group.members is not None else ""
        text += f" ({group.state}{members})"
    if not group.partitions:
        text += "; no committed offsets"
    return text


def _number(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def to_json(report: LagReport, max_lag: int | None = None) -> dict[str, Any]:
    """The stable JSON document of ``streamproc lag --json`` (keys documented in the README)."""
    return {
        "taken_at": round(report.taken_at, 3),
        "interval_s": _number(report.interval_s),
        "max_lag": max_lag,
        "over_max_lag": [g.group for g in report.over(max_lag)] if max_lag is not None else [],
        "groups": [{
            "group": g.group,
            "state": g.state,
            "members": g.members,
            "lag": g.lag,
            "rate": _number(g.rate),
            "eta_seconds": _number(g.eta_seconds),
            "partitions": [{
                "topic": p.topic,
                "partition": p.partition,
                "internal": p.internal,
                "committed": p.committed,
                "end": p.end,
                "start": p.start,
                "lag": p.lag,
                "rate": _number(p.rate),
                "eta_seconds": _number(p.eta_seconds),
            } for p in g.partitions],
        } for g in report.groups],
    }


def dumps(report: LagReport, max_lag: int | None = None) -> str:
    return json.dumps(to_json(report, max_lag), indent=2)
