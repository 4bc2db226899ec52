"""Reading consumer lag from the broker (``streamproc lag`` and the worker's ``consumer_lag`` gauge).

Offsets come straight from the broker: a group's committed offsets through the admin API
(``ListConsumerGroups``, ``OffsetFetch``), log start/end offsets through a throwaway consumer without a
group (``ListOffsets``). The worker's ``consumer_lag`` gauge reads the same way (:class:`LagReader`), so
the command and Prometheus show the same numbers.

Every partition of every topic a group has committed on is listed, as ``kafka-consumer-groups --describe``
does. What lag and the drain estimate mean: :mod:`streamproc.core.lag`; how they are shown:
:mod:`streamproc.ops.lag_report`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Iterable, Mapping
from types import TracebackType

from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from streamproc.core.lag import DrainEstimator, GroupLag, LagReport, PartitionLag
from streamproc.errors import ExitCode, UserFacingError
from streamproc.kafka.clients import kafka_admin, kafka_consumer
from streamproc.kafka.connection import KafkaConnection


class LagError(UserFacingError):
    """Lag could not be read; the message is one line for the operator."""


class BrokerUnavailable(LagError):
    """The cluster did not answer."""


class GroupNotFound(LagError):
    """A requested consumer group is unknown to the cluster (no members and no committed offsets)."""

    exit_code = ExitCode.USAGE


class LagReader:
    """An admin client and a group-less consumer, kept open for repeated readings."""

    def __init__(self, kafka: KafkaConnection, request_timeout_ms: int = 10_000) -> None:
        self._kafka = kafka
        self._admin = kafka_admin(kafka, request_timeout_ms=request_timeout_ms)
        self._consumer = kafka_consumer(kafka, group_id=None, enable_auto_commit=False,
                                          request_timeout_ms=request_timeout_ms)
        self._started = False

    async def start(self) -> None:
        try:
            await self._admin.start()
            await self._consumer.start()
        except KafkaError as exc:
            await self.close()
            raise BrokerUnavailable(f"Kafka at {self._kafka.bootstrap} is not reachable ({exc})") from exc
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
                raise GroupNotFound(f"consumer group {missing[0]!r} does not exist on {self._kafka.bootstrap} "
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
            raise BrokerUnavailable(f"could not read offsets from Kafka at {self._kafka.bootstrap} ({exc})") from exc
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


async def read_lag(kafka: KafkaConnection, groups: list[str] | None,
                   topics: Mapping[str, Collection[str]] | None = None) -> LagReport:
    """One reading of the lag of ``groups`` (every group of the cluster when None).

    Raises :class:`BrokerUnavailable` or :class:`GroupNotFound` (both :class:`LagError`).
    """
    async with LagReader(kafka) as reader:
        return await reader.read(groups, topics)


async def sample_lag(kafka: KafkaConnection, groups: list[str] | None, interval_s: float,
                     topics: Mapping[str, Collection[str]] | None = None) -> LagReport:
    """Two readings ``interval_s`` apart: the second one, with rates and drain estimates."""
    estimator = DrainEstimator(window_s=max(interval_s * 2, 1.0))
    async with LagReader(kafka) as reader:
        first = await reader.read(groups, topics)
        estimator.add(first.taken_at, first.committed(), first.ends())
        await asyncio.sleep(interval_s)
        second = await reader.read([g.group for g in first.groups], topics)
        estimator.add(second.taken_at, second.committed(), second.ends())
    return second.estimated(estimator)
