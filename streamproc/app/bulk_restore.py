"""A table restore that reads the changelog in bulk, before faust's own record-by-record one (issue 29).

faust restores a table one record at a time through its stream machinery (a message, an event, a queue put
and a ``wait_for`` task per record, and a check of every partition's remaining count after each): about
200 to 400 µs of CPU per record here, 5,507 records/s for a million states (docs/benchmarks.md). Here, once faust
has taken the changelog's highwaters and the offsets its RocksDB stored (``Recovery._build_offsets`` for the
active partitions), a consumer of our own (no group, the partitions assigned) reads every active changelog
partition from the stored offset up to that highwater in large fetches, and writes each fetch's latest value
per key to the partition's RocksDB in one ``WriteBatch`` together with faust's stored offset (the same key
faust writes, so a crash mid-way resumes from the last batch written). faust's offsets are then set to
where this read ended, so its recovery seeks past it and reads only what is left: nothing, unless the time
below ran out. faust's own path stays for the rest: standby partitions, and stores other than rocksdict.

A tombstone deletes, as faust's ``apply_changelog_batch`` does. faust waits for the step under its
``broker_request_timeout`` (past it, it takes the recovery as stopped); that wait is lifted for this step,
which stops by itself when no record comes for that long (faust then reads the remainder, and its own
timeouts apply). When faust's tracing wraps the step, the wait keeps its timeout and the read stops at half
of it. A rebalance during the read cancels it: what was written stays, with its offset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka import TopicPartition
from faust.tables.recovery import Recovery
from rocksdict import WriteBatch

from streamproc.core.changelog_reads import Applied, Span, changelog_reads
from streamproc.kafka.clients import kafka_consumer
from streamproc.kafka.connection import KafkaConnection

BULK_RESTORE = "_streamproc_bulk_restore"  # on the app: the connection the bulk read uses
UNTIMED = "_streamproc_bulk_read_untimed"  # on the Recovery: faust waits for the step without its timeout
FETCH_WAIT_MS = 500
PARTITION_FETCH_BYTES = 1024 * 1024  # per partition and fetch (faust's): 4 MiB took the same CPU per record and
# raised the worker's peak RSS by 48 MB (218 against 170 MB after 200,000 states)
MAX_RECORDS = 10_000  # handed over per getmany: the loop (and the consumer group's heartbeat) waits on each
SHARE_OF_STEP_TIMEOUT = 0.5
_build_offsets: Callable[..., Awaitable[None]] = Recovery._build_offsets
_wait: Callable[..., Awaitable[None]] = Recovery._wait
log = logging.getLogger(__name__)


def enable_bulk_restore(app: Any, connection: KafkaConnection) -> None:
    """Restore ``app``'s rocksdict tables in bulk on ``connection`` (apps without it keep faust's restore)."""
    app.__dict__[BULK_RESTORE] = connection


async def _build_offsets_then_read(self: Any, consumer: Any, tps: Any, destination: Any, title: str) -> None:
    """faust's start offsets; for the active partitions, then the bulk read, and faust's offsets past it."""
    untimed = self.__dict__.pop(UNTIMED, False)
    await _build_offsets(self, consumer, tps, destination, title)
    connection: KafkaConnection | None = self.app.__dict__.get(BULK_RESTORE)
    if connection is None or destination is not self.active_offsets:
        return
    reads = {tp: span for tp, span in changelog_reads(tps, destination, self.active_highwaters).items()
             if getattr(self.tp_to_table[tp].data, "use_rocksdict", False)}
    if not reads:
        return
    step_timeout_s = self.app.conf.broker_request_timeout
    read_to = await read_changelogs(connection, reads, self.tp_to_table,
                                    None if untimed else step_timeout_s * SHARE_OF_STEP_TIMEOUT, step_timeout_s,
                                    read_committed=self.app.in_transaction)
    for tp, offset in read_to.items():  # one by one: faust's offsets are a Counter, whose update() adds
        destination[tp] = offset


async def _wait_for_step(self: Any, coro: Any, timeout: Any = None) -> None:  # noqa: ASYNC109 (faust's own)
    """faust's wait for a recovery step (it raises when a rebalance starts), without the step's timeout for
    the one that holds the bulk read: that read stops itself once the changelog stops coming. The step is
    known by its coroutine (faust's tracing, when on, wraps it: then the read keeps within the timeout)."""
    if getattr(coro, "cr_code", None) is _build_offsets_then_read.__code__:
        self.__dict__[UNTIMED] = True
        timeout = None
    await _wait(self, coro, timeout)


async def read_changelogs(connection: KafkaConnection, reads: Mapping[Any, Span], tables: Mapping[Any, Any],
                          budget_s: float | None, stall_s: float, read_committed: bool = False) -> dict[Any, int]:
    """Read each partition's span into its table's store; returns the last offset applied per partition: the
    span's end once it is read through, an earlier one when ``budget_s`` (None: no limit) ran out first or no
    record came for ``stall_s``."""
    started, cpu_started = time.monotonic(), time.process_time()
    partitions = {TopicPartition(tp.topic, tp.partition): tp for tp in reads}
    # a start below the log's (compacted or deleted meanwhile) resets to its first record, not past them all
    consumer = kafka_consumer(connection, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                              max_partition_fetch_bytes=PARTITION_FETCH_BYTES,
                              isolation_level="read_committed" if read_committed else "read_uncommitted")
    await consumer.start()
    read_to: dict[Any, int] = {}
    records = 0
    try:
        consumer.assign(list(partitions))
        for partition, tp in partitions.items():
            consumer.seek(partition, reads[tp].first)
        pending = set(partitions)
        last_record = started
        while pending and (budget_s is None or time.monotonic() - started < budget_s):
            fetched = await consumer.getmany(*pending, timeout_ms=FETCH_WAIT_MS, max_records=MAX_RECORDS)
            if fetched:
                last_record = time.monotonic()
            elif time.monotonic() - last_record > stall_s:
                break
            for partition, batch in fetched.items():
                tp = partitions[partition]
                applied = Applied.of(((r.offset, r.key, r.value) for r in batch), reads[tp])
                if applied.last_offset is not None:
                    _write(tables[tp].data, tp.partition, applied)
                    read_to[tp] = applied.last_offset
                    records += len(batch)
            for partition in list(pending):  # read through: past the span (compaction may have left no record)
                tp = partitions[partition]
                if await consumer.position(partition) > reads[tp].last:
                    pending.discard(partition)
                    if read_to.get(tp) != reads[tp].last:
                        read_to[tp] = reads[tp].last
                        tables[tp].data.set_persisted_offset(tp, reads[tp].last)
    finally:
        await consumer.stop()
    elapsed, cpu_s = time.monotonic() - started, time.process_time() - cpu_started
    log.info("bulk restore: %d changelog records of %d partitions in %.1f s (%.0f/s, %.1f µs of the process's CPU "
             "per record)%s", records, len(reads), elapsed, records / max(elapsed, 1e-9),
             cpu_s * 1e6 / max(records, 1), "" if not pending else
             f"; {len(pending)} partitions not read through (time or no records), faust reads the rest")
    return read_to


def _write(store: Any, partition: int, applied: Applied) -> None:
    """One fetch into the partition's RocksDB: its writes and faust's stored offset, in one atomic batch."""
    batch = WriteBatch(raw_mode=True)
    for key, value in applied.writes.items():
        if value is None:
            batch.delete(key)
        else:
            batch.put(key, value)
    batch.put(store.offset_key, str(applied.last_offset).encode())
    store._db_for_partition(partition).write(batch)


Recovery._build_offsets = _build_offsets_then_read  # type: ignore[method-assign]
Recovery._wait = _wait_for_step  # type: ignore[method-assign]
