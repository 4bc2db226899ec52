"""TableStore: state writes reach the changelog in the order they reached RocksDB, and the delivered offsets
are stored once per loop pass.

faust's producer and store are in-memory fakes here (the real ones run in every integration test): what is
checked is the ordering under a send that waits, which a live broker produces only when a batch is full."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.structs import RecordMetadata, TopicPartition
from faust.streams import _current_event

from streamproc import codec
from streamproc.app.batch_summaries import BatchSummaries
from streamproc.app.handler import StateWriteFailed
from streamproc.app.worker import TableStore
from streamproc.core.events import RequestState
from streamproc.core.sweep_scope import SweepScope
from streamproc.core.vocabulary import RequestStatus

CHANGELOG = "app-request_state-changelog"


@dataclass
class FakeStore:
    """faust's RocksDB store as TableStore uses it."""

    values: dict[bytes, bytes] = field(default_factory=dict)
    persisted: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) in the order stored

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: bytes) -> bytes | None:
        return self.values.get(key)

    failing_stores: int = 0  # how many offset stores raise first (a RocksDB error)

    def set_persisted_offset(self, tp: TopicPartition, offset: int) -> None:
        if self.failing_stores:
            self.failing_stores -= 1
            raise OSError("rocksdb: IO error")
        self.persisted.append((tp.partition, offset))


class FakeProducer:
    """faust's producer: ``send`` returns a delivery future once the record is in the batch; sends listed in
    ``held`` wait for ``release`` first (aiokafka waiting for room in a full batch)."""

    def __init__(self, held: int = 0, refuse: Exception | None = None) -> None:
        self.log: list[tuple[str, int | None, bytes | None, bytes | None]] = []
        self.deliveries: list[asyncio.Future[RecordMetadata]] = []
        self.release = asyncio.Event()
        self._held = held
        self._refuse = refuse

    async def send(self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
                   timestamp: float | None, headers: Any) -> asyncio.Future[RecordMetadata]:
        if self._refuse is not None:
            raise self._refuse
        if self._held:
            self._held -= 1
            await self.release.wait()
        self.log.append((topic, partition, key, value))
        delivery: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery

    def deliver(self, index: int, offset: int) -> None:
        _, partition, _, _ = self.log[index]
        assert partition is not None
        self.deliveries[index].set_result(RecordMetadata(CHANGELOG, partition, TopicPartition(CHANGELOG, partition),
                                                         offset, -1, -1, 0))


def table_store(producer: FakeProducer) -> tuple[TableStore, FakeStore]:
    store = FakeStore()
    table = SimpleNamespace(data=store, changelog_topic_name=CHANGELOG)
    summaries = BatchSummaries(table, producer, "llm.summaries", owned=lambda: {3}, forgotten=set, ready=lambda: True)
    return TableStore(table, producer, SweepScope(), summaries), store


def state(status: RequestStatus, attempts: int = 1) -> RequestState:
    return RequestState("r-1", status, "h" * 32, attempts=attempts, created_ms=1, updated_ms=2)


class HandledEvent:
    """faust's event, as far as a table write looks at it (faust keeps a weak reference)."""

    def __init__(self, partition: int) -> None:
        self.message = SimpleNamespace(partition=partition)


@contextlib.contextmanager
def handling(partition: int) -> Iterator[HandledEvent]:
    """What the handler runs under: faust's current event, a record of ``partition``. Tasks created inside keep
    it as long as the caller keeps the event (faust's reference is weak)."""
    event = HandledEvent(partition)
    token = _current_event.set(weakref.ref(event))  # type: ignore[arg-type]
    try:
        yield event
    finally:
        _current_event.reset(token)


@pytest.fixture
def handling_partition_3() -> Iterator[None]:
    with handling(3):
        yield


@pytest.mark.usefixtures("handling_partition_3")
async def test_a_write_is_in_rocksdb_at_once_and_its_changelog_record_goes_to_the_events_partition() -> None:
    producer = FakeProducer()
    store, rocksdb = table_store(producer)
    await store.put(state(RequestStatus.IN_FLIGHT))
    assert store.get("r-1") == state(RequestStatus.IN_FLIGHT)
    assert producer.log == [(CHANGELOG, 3, b"r-1", codec.encode(state(RequestStatus.IN_FLIGHT)))]
    assert rocksdb.values[b"r-1"] == codec.encode(state(RequestStatus.IN_FLIGHT))


@pytest.mark.usefixtures("handling_partition_3")
async def test_a_later_write_of_a_key_never_reaches_the_changelog_before_an_earlier_one_held_by_aiokafka() -> None:
    producer = FakeProducer(held=1)
    store, _ = table_store(producer)
    first = asyncio.create_task(store.put(state(RequestStatus.IN_FLIGHT)))
    await asyncio.sleep(0)  # the first send now waits for room
    second = asyncio.create_task(store.put(state(RequestStatus.SUCCEEDED)))
    await asyncio.sleep(0)
    assert store.get("r-1") == state(RequestStatus.SUCCEEDED)  # RocksDB has the latest at once
    assert producer.log == []  # and the second send waits behind the first
    producer.release.set()
    await asyncio.gather(first, second)
    assert [codec.decode(value, RequestState).status for _, _, _, value in producer.log if value] == [
        RequestStatus.IN_FLIGHT, RequestStatus.SUCCEEDED]


@pytest.mark.usefixtures("handling_partition_3")
async def test_the_offsets_delivered_in_one_loop_pass_are_stored_once_the_highest() -> None:
    producer = FakeProducer()
    store, rocksdb = table_store(producer)
    for attempts in (1, 2, 3):
        await store.put(state(RequestStatus.IN_FLIGHT, attempts))
    producer.deliver(1, 41)
    producer.deliver(0, 40)
    producer.deliver(2, 42)
    await asyncio.sleep(0)  # done callbacks run
    await asyncio.sleep(0)  # then the one store of the pass
    assert rocksdb.persisted == [(3, 42)]
    await store.put(state(RequestStatus.SUCCEEDED, 3))
    producer.deliver(3, 43)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert rocksdb.persisted == [(3, 42), (3, 43)]


@pytest.mark.usefixtures("handling_partition_3")
async def test_an_undelivered_changelog_record_stores_no_offset() -> None:
    producer = FakeProducer()
    store, rocksdb = table_store(producer)
    await store.put(state(RequestStatus.IN_FLIGHT))
    producer.deliveries[0].set_exception(TimeoutError("no broker"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert rocksdb.persisted == []


async def test_a_write_outside_the_handling_of_a_record_is_refused() -> None:
    store, rocksdb = table_store(FakeProducer())
    with pytest.raises(RuntimeError, match="only while handling a record"):
        await store.put(state(RequestStatus.IN_FLIGHT))
    assert rocksdb.values == {}


@pytest.mark.usefixtures("handling_partition_3")
async def test_a_changelog_send_aiokafka_refuses_is_a_state_write_failure_naming_the_request() -> None:
    producer = FakeProducer(refuse=TimeoutError("no leader for app-request_state-changelog-3"))
    store, rocksdb = table_store(producer)
    with pytest.raises(StateWriteFailed, match="request r-1: its succeeded state was written locally but not sent"):
        await store.put(state(RequestStatus.SUCCEEDED))
    assert rocksdb.values[b"r-1"] == codec.encode(state(RequestStatus.SUCCEEDED))


async def test_a_send_waiting_in_one_partition_does_not_hold_up_writes_in_another() -> None:
    producer = FakeProducer(held=1)
    store, _ = table_store(producer)
    with handling(3) as partition_3:
        held = asyncio.create_task(store.put(state(RequestStatus.IN_FLIGHT)))
    await asyncio.sleep(0)
    with handling(4):
        other = replace(state(RequestStatus.IN_FLIGHT), request_id="r-2")
        await asyncio.wait_for(store.put(other), 1)
    assert [(partition, key) for _, partition, key, _ in producer.log] == [(4, b"r-2")]
    producer.release.set()
    await held
    assert partition_3.message.partition == 3  # kept alive until the held write is done

@pytest.mark.usefixtures("handling_partition_3")
async def test_an_offset_store_that_fails_does_not_stop_the_later_ones() -> None:
    producer = FakeProducer()
    store, rocksdb = table_store(producer)
    rocksdb.failing_stores = 1
    await store.put(state(RequestStatus.IN_FLIGHT))
    producer.deliver(0, 40)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert rocksdb.persisted == []
    await store.put(state(RequestStatus.SUCCEEDED))
    producer.deliver(1, 41)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert rocksdb.persisted == [(3, 41)]
