"""The sink's consumer: its own group over the outcome topics, offsets committed after the rows.

At-least-once like a Kafka Connect sink: a poll's rows go to the database in one transaction, and only
once it committed are the poll's offsets committed. A crash in between (or a rebalance that takes a
partition away) makes the group read those records again, and the upserts write them into the same rows.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import CommitFailedError, IllegalStateError

from streamproc.app.topics import ensure_pipeline_topics
from streamproc.codec import SchemaLookup
from streamproc.core.replication import ReplicationRequest
from streamproc.core.topology import Topology
from streamproc.core.vocabulary import FailureLayer
from streamproc.kafka.clients import kafka_consumer
from streamproc.kafka.connection import KafkaConnection
from streamproc.sink.database import SinkDatabase, open_database
from streamproc.sink.rows import Kind, RowBatch
from streamproc.sink.target import Target

POLL_MS = 1000
MAX_ROWS = 5000  # records per poll, and so per transaction


def default_group(app_id: str) -> str:
    """The sink's consumer group: beside the workers' group ``app_id`` (whose offsets it must never move)."""
    return f"{app_id}.sink"


def topic_kinds(topology: Topology) -> dict[str, Kind]:
    return {topology.results: Kind.RESULT, topology.dead_letters: Kind.DEAD_LETTER,
            **{topology.failed(layer): Kind.FAILURE for layer in FailureLayer}}


@dataclass
class SinkTotals:
    """Rows written since the start (an upsert of a row already there counts too)."""

    results: int = 0
    failures: int = 0
    dead_letters: int = 0
    skipped: int = 0  # records that are no event of ours
    rejected: int = 0  # records set aside in rejected_rows (a row that could not be made or written)
    records: int = 0

    def add(self, rows: RowBatch, records: int, rejected: int) -> None:
        self.results += len(rows.results)
        self.failures += len(rows.failures)
        self.dead_letters += len(rows.dead_letters)
        self.skipped += rows.skipped
        self.rejected += rejected
        self.records += records

    def line(self) -> str:
        skipped = f", {self.skipped} foreign records skipped" if self.skipped else ""
        rejected = f", {self.rejected} set aside in rejected_rows" if self.rejected else ""
        return (f"{self.records} records: {self.results} results, {self.failures} failed attempts, "
                f"{self.dead_letters} dead letters written{skipped}{rejected}")


async def run_sink(kafka: KafkaConnection, topology: Topology, replication: ReplicationRequest, target: Target, *,
                   group: str, until_idle: bool, report: Callable[[str], None], report_every_s: float = 5.0,
                   stop: asyncio.Event | None = None, schema_lookup: SchemaLookup | None = None) -> SinkTotals:
    """Follow the outcome topics into ``target`` until ``stop`` is set (by default: SIGTERM or Ctrl-C, after
    the transaction under way), or, with ``until_idle``, until every record on them is in the database;
    ``schema_lookup`` (the registry's) reads Confluent-framed records."""
    if stop is None:
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    database = await asyncio.to_thread(open_database, target)
    try:
        await ensure_pipeline_topics(kafka, topology, replication)
        kinds = topic_kinds(topology)
        consumer = kafka_consumer(kafka, *kinds, group_id=group, enable_auto_commit=False,
                                    auto_offset_reset="earliest", max_partition_fetch_bytes=4 * 1024 * 1024)
        await consumer.start()
        report(f"sink: {target.describe()} (schema up to date), group {group}, {len(kinds)} topics")
        try:
            return await _follow(consumer, database, kinds, until_idle, report, report_every_s, stop, schema_lookup)
        finally:
            await consumer.stop()
    finally:
        database.close()


async def _follow(consumer: AIOKafkaConsumer, database: SinkDatabase, kinds: dict[str, Kind], until_idle: bool,
                  report: Callable[[str], None], report_every_s: float, stop: asyncio.Event,
                  schema_lookup: SchemaLookup | None) -> SinkTotals:
    totals = SinkTotals()
    next_report = time.monotonic() + report_every_s
    while not stop.is_set():
        polled = await consumer.getmany(timeout_ms=POLL_MS, max_records=MAX_ROWS)
        if polled:
            rows = RowBatch()
            for tp, records in polled.items():
                for record in records:
                    rows.add(kinds[tp.topic], record, tp.topic, schema_lookup)
            rejected = await asyncio.to_thread(database.write, rows)
            for row in rejected:
                report(f"sink: {row.topic}[{row.kafka_partition}]@{row.kafka_offset} (request "
                       f"{row.request_id or 'unknown'}) set aside in rejected_rows: {row.reason}")
            try:
                await consumer.commit({tp: records[-1].offset + 1 for tp, records in polled.items()})
            except (CommitFailedError, IllegalStateError) as exc:
                report(f"sink: offsets not committed ({exc}): their new owner writes the same rows again")
            totals.add(rows, sum(len(records) for records in polled.values()), len(rejected))
        elif until_idle and await _caught_up(consumer):
            report(f"sink: idle, {totals.line()}")
            return totals
        if time.monotonic() >= next_report:
            report(f"sink: {totals.line()}; {await _lag(consumer)} records behind")
            next_report = time.monotonic() + report_every_s
    report(f"sink: stopped, {totals.line()}")
    return totals


async def _lag(consumer: AIOKafkaConsumer) -> int:
    assigned = list(consumer.assignment())
    if not assigned:
        return 0
    ends = await consumer.end_offsets(assigned)
    behind = 0
    for tp in assigned:
        behind += max(0, ends[tp] - await consumer.position(tp))
    return behind


async def _caught_up(consumer: AIOKafkaConsumer) -> bool:
    """Every partition assigned and read to its end (before the group assigns any, nothing is caught up)."""
    return bool(consumer.assignment()) and await _lag(consumer) == 0
