"""Stalled partitions seen from outside the workers: the group's committed offsets, read from the broker.

Each worker's watchdog keeps its clock in memory, so a worker that crash-loops on a record never reports
the partition it wedges: every incarnation starts the clock again. This watch runs in the chaos run itself,
across worker restarts, with the workers' own rule (``core.stalls``) and threshold.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from streamproc.core.lag import PartitionLag
from streamproc.core.stalls import StallWatch
from streamproc.devstack.chaos.worker_metrics import StallReading
from streamproc.kafka.clients import kafka_admin, kafka_consumer
from streamproc.kafka.connection import KafkaConnection

log = logging.getLogger(__name__)
GROUP = -1  # the "worker" of a stall reading made from outside


class GroupStallWatch:
    """Reads committed and end offsets of the workers' input topics; keeps every stalled reading."""

    def __init__(self, kafka: KafkaConnection, group: str, topics: Sequence[str], partitions: int,
                 threshold_s: float) -> None:
        self._kafka = kafka
        self._group = group
        self._partitions = [TopicPartition(topic, p) for topic in topics for p in range(partitions)]
        self._watch = StallWatch(threshold_s)
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self.readings: list[StallReading] = []

    async def start(self) -> None:
        self._admin = kafka_admin(self._kafka, request_timeout_ms=10_000)
        self._consumer = kafka_consumer(self._kafka, group_id=None,
                                          enable_auto_commit=False)
        await self._admin.start()
        await self._consumer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._admin is not None:
            await self._admin.close()

    def excuse(self, seconds: float) -> None:
        """A fault the run inflicted kept every consumer from committing for ``seconds``: not a wedge."""
        self._watch.excuse(seconds)

    async def observe(self, at_s: float) -> None:
        """One reading; skipped while the broker does not answer (a planned restart)."""
        assert self._admin is not None and self._consumer is not None
        try:
            committed = await self._admin.list_consumer_group_offsets(self._group)
            starts = await self._consumer.beginning_offsets(self._partitions)
            ends = await self._consumer.end_offsets(self._partitions)
        except KafkaError as exc:
            log.info("group offsets unreadable now: %r", exc)
            return
        rows = []
        for tp in self._partitions:
            meta = committed.get(tp)
            offset = meta.offset if meta is not None and meta.offset >= 0 else None
            rows.append(PartitionLag(self._group, tp.topic, tp.partition, offset, ends[tp], starts[tp]))
        self._watch.observe(rows, at_s)
        self.readings += [StallReading(at_s, GROUP, topic, partition) for topic, partition in self._watch.stalled]
