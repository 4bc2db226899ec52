"""The broker's own compaction of a state changelog after ``forget`` (issue 29), for ``scripts/bench state
--restore-only --forgotten N``.

The changelog is created with the deployment's settings (``STATE_CHANGELOG``) whose times are shortened from
hours to seconds, so the cleaner drops the forgotten values, and later their tombstones, while the bench waits:
the same passes a deployment sees over a few hours. A segment rolls only on an append, so the bench appends a
tombstone of a key no state has (one per partition) each poll: it stands for the writes a running deployment
never stops making, and it is the few records per partition a converged log keeps beyond the live states.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streamproc.app.topics import STATE_CHANGELOG, ensure_topics
from streamproc.kafka.connection import KafkaConnection

# the deployment's settings, hours made seconds (the broker's cleaner itself looks every 15 s)
SHORTENED = {**STATE_CHANGELOG, "segment.ms": "1000", "max.compaction.lag.ms": "1000", "delete.retention.ms": "5000"}
NUDGE_KEY = b"bench/no-such-request"
POLL_S = 10.0


@dataclass(frozen=True)
class LogCount:
    values: int
    tombstones: int  # the nudges' aside
    nudges: int


async def create_shortened(bootstrap: str, topic: str, partitions: int) -> None:
    """The changelog, before ``ensure_pipeline_topics`` (which keeps a topic that exists), with :data:`SHORTENED`."""
    await ensure_topics(KafkaConnection(bootstrap=bootstrap), {topic: partitions}, configs={topic: SHORTENED})


async def count_log(bootstrap: str, topic: str, partitions: int) -> LogCount:
    """The values and tombstones the changelog holds now, read from its start to its end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                                max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    values = tombstones = nudges = 0
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        pending = {tp for tp in tps if ends[tp] > 0}
        await consumer.seek_to_beginning(*tps)
        while pending:
            for tp, batch in (await consumer.getmany(*pending, timeout_ms=500, max_records=50_000)).items():
                for record in batch:
                    if record.offset < ends[tp] and record.key == NUDGE_KEY:
                        nudges += 1
                    elif record.offset < ends[tp]:
                        values += record.value is not None
                        tombstones += record.value is None
            pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    return LogCount(values, tombstones, nudges)


async def _nudge(bootstrap: str, topic: str, partitions: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await asyncio.gather(*[producer.send_and_wait(topic, None, key=NUDGE_KEY, partition=p)
                               for p in range(partitions)])
    finally:
        await producer.stop()


async def await_compaction(bootstrap: str, topic: str, partitions: int, live: int, timeout_s: float) -> float:
    """Seconds until the changelog holds the ``live`` values and no tombstone but the nudges'; raises
    ``TimeoutError`` past ``timeout_s``."""
    started = time.monotonic()
    while True:
        await _nudge(bootstrap, topic, partitions)
        count = await count_log(bootstrap, topic, partitions)
        waited = time.monotonic() - started
        print(f"  compaction after {waited:.0f}s: {count.values:,} values, {count.tombstones:,} tombstones "
              f"(and {count.nudges} of the nudges)",
              flush=True)
        if count.values == live and count.tombstones == 0:
            return waited
        if waited > timeout_s:
            raise TimeoutError(f"{topic} not compacted to {live:,} values within {timeout_s:.0f}s: {count}")
        await asyncio.sleep(POLL_S)
