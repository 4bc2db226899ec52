"""Fill a deployment's ``request_state`` changelog with the states of an old, finished batch (issue 16), and
with the tombstones ``forget`` writes for a batch (issue 29).

The records are what a worker's table writes put there: the key is the request id as bytes, the value the
Avro-framed :class:`RequestState` (``codec.encode``, as ``TableStore.put`` writes it), and the partition is
the one the key hashes to with Kafka's default partitioner, the partition the request's own records (and so
its table writes) land on. They are sent in per-partition batches, not one ``send`` per record, so a million
take tens of seconds rather than minutes; the encoding dominates.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from streamproc import codec
from streamproc.core.events import RequestState
from streamproc.core.identity import request_id_for
from streamproc.core.vocabulary import RequestStatus

_IN_FLIGHT_BATCHES = 16  # batches sent and not yet acknowledged, over all partitions


def finished_states(batch_id: str, count: int, finished_ms: int) -> Iterator[RequestState]:
    """``count`` requests of ``batch_id`` as they end after one successful call (usage and model set)."""
    for i in range(count):
        yield RequestState(request_id=request_id_for(batch_id, f"request-{i}"), status=RequestStatus.SUCCEEDED,
                           input_hash=f"{i:032x}", attempts=1, batch_id=batch_id, created_ms=finished_ms - 60_000,
                           updated_ms=finished_ms, model="mock-small", prompt_tokens=41, completion_tokens=23)


def tombstones(states: Iterable[RequestState]) -> Iterator[RequestState | bytes]:
    """The keys of ``states``, each standing for a tombstone (a delete): what ``forget`` writes for them."""
    return (state.request_id.encode() for state in states)


@dataclass(frozen=True)
class Filled:
    records: int
    bytes: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds


async def fill_changelog(bootstrap: str, topic: str, partitions: int, states: Iterable[RequestState | bytes],
                         compression: str | None = "gzip") -> Filled:
    """Write every state to ``topic`` (``partitions`` partitions), acks=all, a key alone (bytes) as a tombstone;
    returns what was written."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type=compression,
                                max_batch_size=512 * 1024, max_request_size=4 * 1024 * 1024)
    await producer.start()
    started = time.monotonic()
    all_partitions = list(range(partitions))
    partitioner = DefaultPartitioner()
    pending: set[asyncio.Future[object]] = set()
    open_batches = {p: producer.create_batch() for p in all_partitions}
    records = size = 0

    async def send(partition: int) -> None:
        batch, open_batches[partition] = open_batches[partition], producer.create_batch()
        batch.close()
        pending.add(await producer.send_batch(batch, topic, partition=partition))
        if len(pending) >= _IN_FLIGHT_BATCHES:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                future.result()  # a failed batch fails the fill
            pending.difference_update(done)

    try:
        for state in states:
            key, value = (state, None) if isinstance(state, bytes) else (state.request_id.encode(), codec.encode(state))
            partition = partitioner(key, all_partitions, all_partitions)
            while open_batches[partition].append(key=key, value=value, timestamp=None) is None:
                await send(partition)  # full: send it and append to a new one
            records += 1
            size += len(key) + len(value or b"")
        for partition in all_partitions:
            if open_batches[partition].record_count():
                await send(partition)
        for future in asyncio.as_completed(pending):
            await future
    finally:
        await producer.stop()
    return Filled(records, size, time.monotonic() - started)
