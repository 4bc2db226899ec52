"""Read whole topics up to "now", incrementally: the building block of status, results and backfill.

Each ``read_to_end`` call returns the records between the previous position and the end offsets taken
at the call, so a snapshot is consistent and a poll loop reads only what is new. No consumer group is
used: these reads never disturb the workers' committed offsets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any

from aiokafka.structs import ConsumerRecord, TopicPartition

from streamproc.kafka.clients import kafka_admin, kafka_consumer
from streamproc.kafka.connection import KafkaConnection

FETCH_MAX_WAIT_MS = 20


class TopicReader:
    """An assigned (group-less) consumer over every partition of some topics, from the beginning (or from the
    offsets in ``start``, for a reader that keeps its own position across restarts)."""

    def __init__(self, kafka: KafkaConnection, topics: Iterable[str],
                 start: Mapping[TopicPartition, int] | None = None) -> None:
        self._topics = list(topics)
        self._start = dict(start or {})
        self._kafka = kafka
        # fetch_max_wait_ms: the broker holds a fetch of a partition with nothing new that long, and the consumer's
        # next request on that connection (the end offsets of the next read) waits behind it: at aiokafka's 500 ms,
        # every read of a topic with an empty partition (no beats, no manifest yet) took half a second more.
        self._consumer = kafka_consumer(kafka, group_id=None, enable_auto_commit=False,
                                          auto_offset_reset="earliest", max_partition_fetch_bytes=4 * 1024 * 1024,
                                          fetch_max_wait_ms=FETCH_MAX_WAIT_MS)
        self._partitions: list[TopicPartition] = []

    async def __aenter__(self) -> TopicReader:
        try:
            await self._consumer.start()  # inside: a consumer that could not bootstrap is closed too
            await self._discover()
        except BaseException:
            await self._consumer.stop()
            raise
        return self

    async def _discover(self) -> None:
        """Assign the partitions of topics that exist now (a worker creates its changelog topic late)."""
        known = {tp.topic for tp in self._partitions}
        if known == set(self._topics):
            return
        new = [TopicPartition(topic, partition) for topic, partitions in
               (await self._describe([t for t in self._topics if t not in known])).items()
               for partition in partitions]
        if not new:
            return
        positions = {tp: await self._consumer.position(tp) for tp in self._partitions}
        self._partitions += new
        self._consumer.assign(self._partitions)
        for tp, offset in positions.items():
            self._consumer.seek(tp, offset)
        await self._consumer.seek_to_beginning(*new)
        for tp in new:
            if tp in self._start:
                self._consumer.seek(tp, self._start[tp])

    async def _describe(self, topics: list[str]) -> dict[str, list[int]]:
        """Partition ids of the topics that exist (the consumer's own metadata cache misses new topics)."""
        admin = kafka_admin(self._kafka)
        await admin.start()
        try:
            described = await admin.describe_topics(topics)
        finally:
            await admin.close()
        return {str(d["topic"]): sorted(int(p["partition"]) for p in d["partitions"])
                for d in described if d.get("error_code", 0) == 0 and d.get("partitions")}

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._consumer.stop()

    async def read_to_end(self) -> list[ConsumerRecord[Any, Any]]:
        """Every record from the current position up to the end offsets as of this call."""
        return [record async for chunk in self.chunks_to_end() for record in chunk]

    async def chunks_to_end(self) -> AsyncIterator[list[ConsumerRecord[Any, Any]]]:
        """The same records in chunks, for readers that fold millions of records in constant memory."""
        await self._discover()
        if not self._partitions:
            return
        ends = await self._consumer.end_offsets(self._partitions)
        while True:
            behind = [tp for tp in self._partitions if await self._consumer.position(tp) < ends[tp]]
            if not behind:
                return
            batches = await self._consumer.getmany(*behind, timeout_ms=500, max_records=10_000)
            chunk: list[ConsumerRecord[Any, Any]] = []
            for tp, messages in batches.items():
                chunk.extend(message for message in messages if message.offset < ends[tp])
                if messages and messages[-1].offset >= ends[tp]:
                    self._consumer.seek(tp, ends[tp])  # newer records belong to the next call
            if chunk:
                yield chunk
