"""The open provider batches on the compacted ``<prefix>.provider-batches`` topic (issue 31): writing a record,
each step awaited until the broker has it (the ``creating`` record must be durable before the create call it
announces), forgetting one with a tombstone, and reading back the latest record of each gather whose request
partition a worker owns (what it takes over after a rebalance or a restart).

The worker's route (``app.provider_batch_route``) writes and reads it (design §8).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol

from streamproc.app.topic_reader import TopicReader
from streamproc.codec.provider_batch_record import decode_provider_batch, encode_provider_batch
from streamproc.core.provider_batch_takeover import ProviderBatchRecord


class RecordSender(Protocol):
    """A started producer (aiokafka's, or the worker's faust producer adapted), returning once the broker has it."""

    async def send_and_wait(self, topic: str, key: bytes, value: bytes | None) -> Any: ...


class ProviderBatchLog:
    """Writes to the topic through a started producer (the worker's, with its durability options)."""

    def __init__(self, producer: RecordSender, topic: str) -> None:
        self._producer = producer
        self._topic = topic

    async def write(self, record: ProviderBatchRecord) -> None:
        """The record, on the broker when this returns (``RecordTooLarge`` before anything is sent)."""
        value = encode_provider_batch(record)
        await self._producer.send_and_wait(self._topic, key=record.gather_id.encode(), value=value)

    async def forget(self, gather_id: str) -> None:
        """The tombstone of an ended gather: compaction drops its record."""
        await self._producer.send_and_wait(self._topic, key=gather_id.encode(), value=None)


async def owned_records(reader: TopicReader, owned: Collection[int],
                        unreadable: Callable[[str], None]) -> dict[str, ProviderBatchRecord]:
    """The latest record of each gather of the ``owned`` request partitions, read to the end of the topic. A
    record this version cannot read (a newer worker's, a broken one) goes to ``unreadable`` and hides the older
    records of its key: acting on a state its writer has moved past could create the batch twice."""
    latest: dict[str, ProviderBatchRecord | None] = {}
    for message in await reader.read_to_end():
        if message.key is None:
            unreadable(f"a record without a key at offset {message.offset}")
            continue
        gather_id = message.key.decode(errors="replace")
        if message.value is None:
            latest[gather_id] = None
            continue
        try:
            latest[gather_id] = decode_provider_batch(message.key, message.value)
        except ValueError as exc:
            latest.pop(gather_id, None)
            unreadable(f"gather {gather_id!r} at offset {message.offset}: {exc}")
    return {gather_id: record for gather_id, record in latest.items()
            if record is not None and record.partition in owned}
