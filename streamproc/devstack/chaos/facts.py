"""Facts read back from Kafka: every outcome, every request state, and where a stuck request sits.

The run judges the pipeline by what is on the broker, never by what a worker says about itself: results,
failure events and dead letters are read with a group-less consumer (the workers' offsets are untouched),
and the state changelog gives progress and, at a timeout, each unfinished request's state.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2
from aiokafka.structs import ConsumerRecord, TopicPartition

from streamproc import codec
from streamproc.core.batch_status import BatchStatus, StatusFold
from streamproc.core.events import FailureEvent, InferenceResult, RequestState
from streamproc.core.topology import Topology
from streamproc.core.vocabulary import FailureLayer
from streamproc.kafka.clients import kafka_admin, kafka_consumer
from streamproc.kafka.connection import KafkaConnection

log = logging.getLogger(__name__)

CONFLICTING_DUPLICATE = "conflicting_duplicate"


def sha(data: bytes | str) -> str:
    """Short content hash: dead letters and duplicate bodies are matched by it, not held in memory."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:20]


def partition_of(request_id: str, partitions: int) -> int:
    """The partition the default (murmur2) partitioner gives a key: where a request waits, even unread."""
    hashed: int = murmur2(request_id.encode())
    return (hashed & 0x7FFFFFFF) % partitions


def body_digest(body_json: str) -> str:
    """Hash of a request body as JSON, whatever its key order and spacing (submit re-serialises bodies)."""
    try:
        canonical = json.dumps(json.loads(body_json), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        canonical = body_json
    return sha(canonical)


class TopicTail:
    """A group-less consumer over every partition of some topics, from the beginning, read incrementally.

    Topics that do not exist yet are picked up on a later read. Reads that fail while the broker is away
    (a planned restart) return what they have; the next read goes on from the same positions.
    """

    def __init__(self, kafka: KafkaConnection, topics: Iterable[str]) -> None:
        self._kafka = kafka
        self._topics = list(topics)
        self._consumer = kafka_consumer(kafka, group_id=None, enable_auto_commit=False,
                                          auto_offset_reset="earliest", max_partition_fetch_bytes=16 * 1024 * 1024,
                                          fetch_max_bytes=64 * 1024 * 1024)
        self._partitions: list[TopicPartition] = []
        self._started = False

    async def start(self) -> None:
        await self._consumer.start()
        self._started = True

    async def stop(self) -> None:
        if self._started:
            await self._consumer.stop()
            self._started = False

    async def _discover(self) -> None:
        known = {tp.topic for tp in self._partitions}
        missing = [topic for topic in self._topics if topic not in known]
        if not missing:
            return
        admin = kafka_admin(self._kafka, request_timeout_ms=10_000)
        await admin.start()
        try:
            described = await admin.describe_topics(missing)
        finally:
            await admin.close()
        new = [TopicPartition(str(d["topic"]), int(p["partition"])) for d in described
               if d.get("error_code", 0) == 0 for p in d.get("partitions", [])]
        if not new:
            return
        positions = {tp: await self._consumer.position(tp) for tp in self._partitions}
        self._partitions += new
        self._consumer.assign(self._partitions)
        for tp, offset in positions.items():
            self._consumer.seek(tp, offset)
        await self._consumer.seek_to_beginning(*new)

    async def read(self) -> list[ConsumerRecord[Any, Any]]:
        """Everything from the current positions up to the end offsets as of this call."""
        records: list[ConsumerRecord[Any, Any]] = []
        try:
            await self._discover()
            if not self._partitions:
                return records
            ends = await self._consumer.end_offsets(self._partitions)
            while behind := [tp for tp in self._partitions if await self._consumer.position(tp) < ends[tp]]:
                batches = await self._consumer.getmany(*behind, timeout_ms=1000, max_records=20_000)
                for tp, messages in batches.items():
                    records.extend(m for m in messages if m.offset < ends[tp])
                    if messages and messages[-1].offset >= ends[tp]:
                        self._consumer.seek(tp, ends[tp])  # what lies beyond belongs to the next read
        except KafkaError as exc:  # the broker is restarting: what was read so far stands
            log.info("reading %s paused: %r", ",".join(self._topics), exc)
        return records


@dataclass
class IdOutcome:
    """What the outcome topics hold for one (batch, request id)."""

    results: int = 0
    terminal_codes: list[str] = field(default_factory=list)
    attempts: int = 0  # the highest attempt any of its events names
    conflict_bodies: set[str] = field(default_factory=set)  # body hashes of its conflicting_duplicate failures

    @property
    def ended(self) -> bool:
        return self.results > 0 or bool(self.terminal_codes)

    @property
    def ended_as_submitted(self) -> bool:
        """Whether a submitted request ended: a result, or a terminal failure other than ``conflicting_duplicate``,
        which refuses a record because another record holds its id, and so ends no request of the batch's own."""
        return self.results > 0 or any(code != CONFLICTING_DUPLICATE for code in self.terminal_codes)


@dataclass
class Outcomes:
    """Every result, failure event and dead letter so far, folded per (batch id, request id)."""

    by_id: dict[tuple[str | None, str], IdOutcome] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)  # value hash -> count

    def get(self, batch_id: str | None, request_id: str) -> IdOutcome:
        return self.by_id.get((batch_id, request_id)) or IdOutcome()

    def any_batch(self, request_id: str) -> IdOutcome:
        """All batches together: poison records may carry no batch (an undecodable record's placeholder)."""
        merged = IdOutcome()
        for (_, rid), outcome in self.by_id.items():
            if rid == request_id:
                merged.results += outcome.results
                merged.terminal_codes += outcome.terminal_codes
                merged.attempts = max(merged.attempts, outcome.attempts)
                merged.conflict_bodies |= outcome.conflict_bodies
        return merged

    def _entry(self, batch_id: str | None, request_id: str) -> IdOutcome:
        return self.by_id.setdefault((batch_id, request_id), IdOutcome())

    def add_result(self, result: InferenceResult) -> None:
        entry = self._entry(result.batch_id, result.request_id)
        entry.results += 1
        entry.attempts = max(entry.attempts, result.attempts)

    def add_failure(self, event: FailureEvent) -> None:
        entry = self._entry(event.request.batch_id, event.request.request_id)
        entry.attempts = max(entry.attempts, event.attempt)
        if event.terminal:
            entry.terminal_codes.append(event.error_code)
            if event.error_code == CONFLICTING_DUPLICATE:
                entry.conflict_bodies.add(body_digest(event.request.body_json))

    def add_dead_letter(self, value: bytes | None) -> None:
        key = sha(value or b"")
        self.dead_letters[key] = self.dead_letters.get(key, 0) + 1


class OutcomeReader:
    """Tails results, failure topics and dead letters into :class:`Outcomes`."""

    def __init__(self, kafka: KafkaConnection, topology: Topology) -> None:
        self._topology = topology
        self._failure_topics = {topology.failed(layer) for layer in FailureLayer}
        self._tail = TopicTail(kafka, [topology.results, topology.dead_letters, *sorted(self._failure_topics)])
        self.outcomes = Outcomes()
        self.undecodable = 0

    async def start(self) -> None:
        await self._tail.start()

    async def stop(self) -> None:
        await self._tail.stop()

    async def poll(self) -> None:
        for record in await self._tail.read():
            try:
                if record.topic == self._topology.results:
                    self.outcomes.add_result(codec.decode(record.value, InferenceResult))
                elif record.topic == self._topology.dead_letters:
                    self.outcomes.add_dead_letter(record.value)
                else:
                    self.outcomes.add_failure(codec.decode(record.value, FailureEvent))
            except codec.CodecError:
                self.undecodable += 1


@dataclass(frozen=True)
class StateEntry:
    state: RequestState
    partition: int


class StateFollower:
    """Tails the request-state changelog: the latest state of every id, and each measured batch's status
    (the same fold ``streamproc status`` uses)."""

    def __init__(self, kafka: KafkaConnection, topology: Topology, batch_ids: Iterable[str]) -> None:
        self._tail = TopicTail(kafka, [topology.state_changelog])
        self._folds = {batch_id: StatusFold(batch_id) for batch_id in batch_ids}
        self.latest: dict[str, StateEntry] = {}

    async def start(self) -> None:
        await self._tail.start()

    async def stop(self) -> None:
        await self._tail.stop()

    async def poll(self) -> None:
        states: list[RequestState] = []
        for record in await self._tail.read():
            if not record.value:
                continue
            try:
                state = codec.decode(record.value, RequestState)
            except codec.CodecError:
                continue
            states.append(state)
            self.latest[state.request_id] = StateEntry(state, record.partition)
        for fold in self._folds.values():
            fold.apply(states)

    def status(self, batch_id: str, submitted: int) -> BatchStatus:
        return self._folds[batch_id].status(submitted)


async def trace_ids(kafka: KafkaConnection, topology: Topology, request_ids: Iterable[str]) -> list[str]:
    """Where the given ids appear on the pipeline's topics (partition@offset, attempt, error code), one line per
    id, and the group's committed offsets of those partitions: the report of requests that never ended."""
    wanted = {request_id.encode() for request_id in request_ids}
    tail = TopicTail(kafka, list(topology.all_topics()))
    await tail.start()
    places: dict[str, list[str]] = {}
    partitions: set[tuple[str, int]] = set()
    try:
        for record in await tail.read():
            if record.key in wanted:
                hop = {k: bytes(v).decode("utf-8", "replace") for k, v in record.headers}
                extra = " ".join(v for v in (f"a{hop['x-attempt']}" if "x-attempt" in hop else "",
                                             hop.get("x-error-code", ""), "deferred" if "x-deferred" in hop else "")
                                 if v)
                topic = record.topic.removeprefix(f"{topology.prefix}.")
                places.setdefault(record.key.decode(errors="replace"), []).append(
                    f"{topic}[{record.partition}]@{record.offset}" + (f" ({extra})" if extra else ""))
                partitions.add((record.topic, record.partition))
    finally:
        await tail.stop()
    lines = [f"{request_id}: " + "; ".join(where) for request_id, where in sorted(places.items())]
    admin = kafka_admin(kafka)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(topology.app_id)
    except KafkaError as exc:
        lines.append(f"(committed offsets unreadable: {exc!r})")
        committed = {}
    finally:
        await admin.close()
    shown = [f"{tp.topic.removeprefix(topology.prefix + '.')}[{tp.partition}]={meta.offset}"
             for tp, meta in sorted(committed.items()) if (tp.topic, tp.partition) in partitions]
    if shown:
        lines.append("group's committed offsets there: " + ", ".join(shown))
    return lines
