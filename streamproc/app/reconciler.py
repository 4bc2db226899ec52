"""The reconciler: a worker's periodic search for stranded requests, and their re-drive (design §4).

Every ``reconcile_interval_s`` the worker reads the group's committed offsets, walks (sweeps) the
``request_state`` entries of the partitions it owns, and asks :func:`streamproc.core.reconcile.stranded`
which requests have nothing left to move them. For each, it reads the record that should have moved the
request from Kafka and sends a copy (see :func:`streamproc.core.reconcile.redrive_headers`); the state
machine admits it once. It should rarely fire: it is the belt to the pipeline's braces, and every re-drive
is logged and counted (``streamproc_requests_redriven_total{why}``).

A pass reads every entry only after the worker's partitions changed; otherwise only the entries open at
the last pass and those written since (:class:`streamproc.core.sweep_scope.SweepScope`), so a table full of
finished requests costs one sweep per start or rebalance, not one per interval.

That full sweep also sums the retries each batch has spent (``retries_spent`` of its states) and hands them
to the retry budget, so a restarted worker does not start its batches' budgets from zero.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import ConsumerRecord, TopicPartition

from streamproc import codec
from streamproc.core import headers
from streamproc.core.events import RequestState
from streamproc.core.guards.budget import SpentTally
from streamproc.core.reconcile import Redrive, redrive_headers, stranded
from streamproc.core.sweep_scope import SweepScope
from streamproc.core.topology import Topology
from streamproc.core.vocabulary import RequestStatus
from streamproc.kafka.clients import kafka_admin, kafka_consumer
from streamproc.kafka.connection import KafkaConnection

log = logging.getLogger(__name__)

Resend = Callable[[str, bytes | None, bytes | None, headers.Headers], Any]  # async (topic, key, value, headers)
_YIELD_EVERY = 500  # table entries between two yields to the event loop: a scan never starves the handlers
_ENDED = (RequestStatus.SUCCEEDED, RequestStatus.FAILED)  # nothing can strand these


class RecordFetcher:
    """Reads single records by offset with a group-less consumer (it never touches the group's offsets)."""

    def __init__(self, kafka: KafkaConnection) -> None:
        self._kafka = kafka
        self._consumer: AIOKafkaConsumer | None = None  # made on first use: aiokafka needs the running loop

    async def read(self, topic: str, partition: int, offset: int, timeout_s: float = 10.0) -> ConsumerRecord | None:
        """The record at ``offset``, or None when it is gone (deleted by retention) or cannot be read."""
        if self._consumer is None:
            consumer = kafka_consumer(self._kafka, group_id=None, enable_auto_commit=False,
                                        auto_offset_reset="earliest")
            await consumer.start()
            self._consumer = consumer
        tp = TopicPartition(topic, partition)
        self._consumer.assign([tp])
        self._consumer.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = await self._consumer.getmany(tp, timeout_ms=1000, max_records=1)
            for record in batch.get(tp, []):
                return record if record.offset == offset else None  # a later offset: this one was deleted
        return None

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()


@dataclass
class Sweep:
    """What one pass over the table found."""

    read: int = 0
    redriven: int = 0
    open_keys: set[bytes] = field(default_factory=set)
    spent: SpentTally = field(default_factory=SpentTally)  # summed on a full sweep only
    cut_short: bool = False  # a rebalance began: what was found is partial


@dataclass(frozen=True)
class ConsumerGroup:
    """The consumer group whose requests a reconciler looks after: its topics, its cluster and its id."""

    topology: Topology
    kafka: KafkaConnection
    group_id: str


@dataclass(frozen=True)
class ReconcilerLinks:
    """A reconciler's ties to the rest of the worker, each optional: the scope the table's writes are told to (without
    one, every pass reads all), and where it reports each re-drive (by why) and, after a full sweep, the retries
    each batch spent (the retry budget)."""

    scope: SweepScope | None = None
    on_redriven: Callable[[str], None] | None = None
    on_spent: Callable[[dict[str, tuple[int, int]]], None] | None = None


class Reconciler:
    """Finds the stranded requests of this worker's partitions and sends their record again."""

    def __init__(self, app: Any, table: Any, resend: Resend, group: ConsumerGroup, grace_s: float,
                 links: ReconcilerLinks | None = None) -> None:
        links = links or ReconcilerLinks()
        self._app = app
        self._table = table
        self._scope = links.scope or SweepScope()
        self._resend = resend
        self._topology = group.topology
        self._kafka = group.kafka
        self._group = group.group_id
        self._grace_ms = round(grace_s * 1000)
        self._on_redriven = links.on_redriven
        self._on_spent = links.on_spent
        self._tier_topics = {self._topology.retry(tier) for tier in self._topology.tiers}
        self._fetcher = RecordFetcher(group.kafka)
        self._partitioner = DefaultPartitioner()
        self._sent: dict[str, int] = {}  # request id -> the state's updated_ms when it was re-driven
        self.redriven = 0

    def run_every(self, interval_s: float) -> None:
        """A pass every ``interval_s`` on the faust app; the record reader is closed when the app stops."""
        self._app.timer(interval_s, name="streamproc.app.reconciler")(self.run_once)
        self._app.on_before_shutdown.connect(self.close)

    async def run_once(self) -> int:
        """One pass; returns how many requests were re-driven. Skipped while the group rebalances."""
        if not self._app.flow_control.is_active() or self._app.rebalancing:
            return 0
        try:
            committed = await self._committed()
        except KafkaError as exc:
            log.warning("reconciler: cannot read the committed offsets of %s (%s); next pass", self._group, exc)
            return 0
        # a new generation, even with the same partitions, may follow another worker's writes to them
        assignment = (self._app.consumer_generation_id, frozenset(self._app.consumer.assignment()))
        keys = self._scope.plan(assignment)
        started = time.monotonic()
        try:
            sweep = await self._sweep(self._entries(keys), committed, full=keys is None)
        except BaseException:
            self._scope.reset()
            raise
        if sweep.cut_short:  # a rebalance began during the sweep
            self._scope.reset()
            return 0
        self._scope.done(assignment, sweep.open_keys)
        self.redriven += sweep.redriven
        if keys is None:
            log.info("reconciler: read all %d states in %.1f s (%d open); later passes read the open ones and those "
                     "written since", sweep.read, time.monotonic() - started, len(sweep.open_keys))
            if self._on_spent is not None:
                self._on_spent(sweep.spent.totals())
        return sweep.redriven

    def _entries(self, keys: set[bytes] | None) -> Iterable[tuple[bytes, bytes | None]]:
        """Every entry of the owned partitions (read as the sweep goes), or those of ``keys``."""
        if keys is None:
            return self._table.items()  # type: ignore[no-any-return]
        return ((key, self._table.get(key)) for key in keys)

    async def _sweep(self, entries: Iterable[tuple[bytes, bytes | None]], committed: dict[tuple[str, int], int],
                     full: bool) -> Sweep:
        """Re-drive the stranded among ``entries`` (on a ``full`` sweep, also sum the retries spent)."""
        all_partitions = list(range(self._topology.partitions))
        sweep = Sweep()
        now = time.time_ns() // 1_000_000
        iterator = iter(entries)
        for index in itertools.count(1):
            if index % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
                if self._app.rebalancing:
                    sweep.cut_short = True
                    break
            try:
                key, raw = next(iterator)
            except StopIteration:
                break
            except RuntimeError:  # the store's partitions changed under the iteration: a rebalance
                sweep.cut_short = True
                break
            if raw is None:
                continue
            sweep.read += 1
            try:
                state = codec.decode(raw, RequestState)
            except codec.CodecError as exc:
                log.error("reconciler: request_state entry %r does not decode (%s)", key, exc)
                continue
            if full:
                sweep.spent.add(state)
            if state.status in _ENDED:
                continue
            sweep.open_keys.add(key)
            partition = self._partitioner(key, all_partitions, all_partitions)
            redrive = stranded(state, functools.partial(_offset_on, committed, partition), now, self._grace_ms)
            if redrive is None or self._sent.get(state.request_id) == state.updated_ms:
                continue
            if await self._redrive(redrive, state, partition):
                self._sent[state.request_id] = state.updated_ms
                sweep.redriven += 1
        return sweep

    async def _committed(self) -> dict[tuple[str, int], int]:
        admin = kafka_admin(self._kafka, request_timeout_ms=10_000)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(self._group)
        finally:
            await admin.close()
        return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items() if meta.offset >= 0}

    async def _redrive(self, redrive: Redrive, state: RequestState, partition: int) -> bool:
        source = redrive.record
        record = await self._fetcher.read(source.topic, partition, source.offset)
        if record is None or record.key != state.request_id.encode():
            log.error("reconciler: request %s is stranded (%s, %s since %d) but its record %s[%d]@%d is gone; "
                      "replay it with backfill", state.request_id, redrive.why, state.status, state.updated_ms,
                      source.topic, partition, source.offset)
            return False
        topic = self._redrive_topic(redrive)
        copy = redrive_headers(headers.as_mapping(record.headers), redrive, partition)
        await self._resend(topic, record.key, record.value, copy)
        log.warning("reconciler: re-drove request %s (%s; state %s, attempt %d, unchanged for %.0f s): record "
                    "%s[%d]@%d sent again to %s%s", state.request_id, redrive.why, state.status, state.attempts,
                    (time.time_ns() // 1_000_000 - state.updated_ms) / 1000, source.topic, partition,
                    source.offset, topic, "" if redrive.attempt is None else f" as attempt {redrive.attempt}")
        if self._on_redriven is not None:
            self._on_redriven(redrive.why.value)
        return True

    def _redrive_topic(self, redrive: Redrive) -> str:
        """A tier record goes back to its tier; a parked copy (the same attempt, not made) to the backlog, where it
        keeps its tenant's share; any other record (a submission in flight) to the first tier."""
        topic = redrive.record.topic
        if topic in self._tier_topics or (topic == self._topology.backlog and redrive.attempt is None):
            return topic
        return self._topology.retry(self._topology.tiers[0])

    async def close(self, *args: Any, **kwargs: Any) -> None:
        """Close the record reader (also a faust ``on_before_shutdown`` receiver, hence the arguments)."""
        await self._fetcher.close()


def _offset_on(committed: dict[tuple[str, int], int], partition: int, topic: str) -> int | None:
    return committed.get((topic, partition))

