"""A worker's table restore (issue 29): from a changelog with overwrites and tombstones, a worker on an empty disk
ends with exactly the latest value of every key and none of the deleted ones, and faust's stored offsets at the
changelog's end; a restart on that disk then reads only what was written since, with the same result."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from rocksdict import AccessType, Rdict

from streamproc import codec
from streamproc.app.bootstrap import resolve_connection
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.core.events import RequestState
from streamproc.core.identity import request_id_for
from streamproc.core.vocabulary import RequestStatus
from streamproc.kafka.clients import kafka_consumer
from streamproc.settings import Settings
from tests.integration.pipeline import WorkerProcess, worker_env

pytestmark = pytest.mark.integration

KEYS = 400
OFFSET_KEY = b"__faust\0offset__"  # where faust's RocksDB store keeps the last changelog offset it applied
_BULK = re.compile(r"bulk restore: (\d+) changelog records")
Changes = list[tuple[bytes, bytes | None]]  # (key, value) in the order written; None: a tombstone


def state(i: int, attempts: int) -> tuple[bytes, bytes]:
    request_id = request_id_for("restored", f"request-{i}")
    now = int(time.time() * 1000)
    value = RequestState(request_id=request_id, status=RequestStatus.SUCCEEDED, input_hash=f"{i:032x}",
                         attempts=attempts, batch_id="restored", created_ms=now, updated_ms=now, model="mock")
    return request_id.encode(), codec.encode(value)


def first_history() -> Changes:
    """Every key written, a third overwritten, a fifth deleted, a tenth of them written again after that."""
    changes: Changes = [state(i, 1) for i in range(KEYS)]
    changes += [state(i, 2) for i in range(0, KEYS, 3)]
    changes += [(state(i, 0)[0], None) for i in range(0, KEYS, 5)]
    changes += [state(i, 3) for i in range(0, KEYS, 10)]
    return changes


def later_history() -> Changes:
    """Written while the worker is stopped: overwrites, deletes of live keys, and a deleted key back."""
    changes: Changes = [state(i, 4) for i in range(1, KEYS, 7)]
    changes += [(state(i, 0)[0], None) for i in range(2, KEYS, 9)]
    changes += [state(5, 5)]
    return changes


def latest(changes: Changes) -> dict[bytes, bytes]:
    table: dict[bytes, bytes] = {}
    for key, value in changes:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table


async def write(settings: Settings, changes: Changes) -> None:
    """The changes on the state changelog, each on the partition its key hashes to (as the worker writes)."""
    topic = settings.topology().state_changelog
    partitions = list(range(settings.partitions))
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        sent = [await producer.send(topic, key=key, value=value,
                                    partition=DefaultPartitioner()(key, partitions, partitions))
                for key, value in changes]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def last_offsets(settings: Settings) -> dict[int, int]:
    """The last offset of every changelog partition."""
    topic = settings.topology().state_changelog
    consumer = kafka_consumer(resolve_connection(settings))
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(settings.partitions)])
    finally:
        await consumer.stop()
    return {tp.partition: end - 1 for tp, end in ends.items()}


def stored(data_dir: Path) -> tuple[dict[bytes, bytes], dict[int, int]]:
    """A stopped worker's state table, and faust's stored changelog offset per partition."""
    table: dict[bytes, bytes] = {}
    offsets: dict[int, int] = {}
    for path in sorted(data_dir.glob("faust/*/v1/tables/request_state-*.db")):
        db = Rdict(str(path), access_type=AccessType.read_only())
        try:
            for key, value in db.items():
                assert isinstance(key, bytes) and isinstance(value, bytes)  # the table is raw bytes
                if key == OFFSET_KEY:
                    offsets[int(path.name.removesuffix(".db").rsplit("-", 1)[1])] = int(value)
                elif not key.startswith(b"__faust"):
                    table[key] = value
        finally:
            db.close()
    return table, offsets


def restore(settings: Settings, data_dir: Path, log_path: Path) -> int:
    """Start a worker on ``data_dir``, wait for its restore to complete, stop it; the records it read in bulk."""
    worker = WorkerProcess(worker_env(settings, "http://127.0.0.1:9", data_dir), log_path)
    worker.start()
    deadline = time.monotonic() + 120
    try:
        while "Recovery complete" not in worker.log_tail(10**6):
            assert worker.alive() and time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.2)
    finally:
        worker.stop()
    found = _BULK.findall(worker.log_tail(10**6))
    return sum(int(records) for records in found)


def test_a_restore_ends_with_the_latest_value_of_every_key(settings: Settings, tmp_path: Path) -> None:
    asyncio.run(ensure_pipeline_topics(resolve_connection(settings), settings.topology()))
    history = first_history()
    asyncio.run(write(settings, history))
    disk = tmp_path / "worker"

    read = restore(settings, disk, tmp_path / "first.log")
    table, offsets = stored(disk)
    assert read == len(history)  # the whole changelog, in bulk
    assert table == latest(history)
    assert len(table) < KEYS  # the tombstones deleted (and the test has deletes to see)
    assert offsets == asyncio.run(last_offsets(settings))  # faust resumes after the last record

    later = later_history()
    asyncio.run(write(settings, later))
    read_again = restore(settings, disk, tmp_path / "restart.log")  # the same disk: only what came since
    table, offsets = stored(disk)
    assert read_again == len(later)
    assert table == latest(history + later)
    assert offsets == asyncio.run(last_offsets(settings))
