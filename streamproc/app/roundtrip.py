"""A smoke check of the whole local stack: keyed records through a faust agent that keeps a RocksDB table.

The agent adds each record's value to a per-key total in a rocksdict-backed table and emits the new total.
Running it twice across a worker restart proves the table survives (RocksDB files plus the changelog).
Run a worker with ``python -m streamproc.app.roundtrip APP_ID IN_TOPIC OUT_TOPIC PARTITIONS REPLICATION_FACTOR``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust

from streamproc.app.bootstrap import resolve_connection
from streamproc.app.faust_app import make_faust_app
from streamproc.app.topics import ensure_topics
from streamproc.kafka.clients import kafka_consumer, kafka_producer
from streamproc.kafka.connection import KafkaConnection
from streamproc.processes import stop_process
from streamproc.settings import Durability, Settings


def add_totals_agent(app: faust.App, in_topic: str, out_topic: str, partitions: int) -> None:
    """The round trip: ``totals[key] += value`` in a RocksDB table, then emit ``(key, total)``."""
    source = app.topic(in_topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                       value_serializer="raw", partitions=partitions)
    sink = app.topic(out_topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                     value_serializer="raw", partitions=partitions)
    totals = app.Table("totals", default=int, partitions=partitions, options={"driver": "rocksdict"})

    @app.agent(source)
    async def add(stream: Any) -> None:
        async for key, value in stream.items():
            name = key.decode()
            totals[name] += int(value)
            await sink.send(key=key, value=str(totals[name]).encode())


@dataclass
class Worker:
    """A round-trip worker in its own process, stopped the way an operator would (SIGTERM)."""

    kafka: KafkaConnection
    data_dir: Path
    app_id: str
    in_topic: str
    out_topic: str
    partitions: int
    replication_factor: int
    log_path: str
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        env = {**os.environ, "STREAMPROC_KAFKA_BOOTSTRAP": self.kafka.bootstrap,
               "STREAMPROC_DATA_DIR": str(self.data_dir)}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "streamproc.app.roundtrip", self.app_id, self.in_topic, self.out_topic,
                 str(self.partitions), str(self.replication_factor)],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 60.0) -> int:
        assert self.process is not None, "worker not started"
        return stop_process(self.process, timeout)


async def produce(kafka: KafkaConnection, durability: Durability, topic: str,
                  records: Iterable[tuple[str, int]]) -> int:
    producer = kafka_producer(kafka, **durability.producer_options())
    await producer.start()
    sent = 0
    try:
        for key, value in records:
            await producer.send(topic, key=key.encode(), value=str(value).encode())
            sent += 1
        await producer.flush()
    finally:
        await producer.stop()
    return sent


async def read_all(kafka: KafkaConnection, topic: str, expected: int, wait_s: float,
                   alive: Callable[[], bool] = lambda: True) -> list[tuple[str, int]]:
    """Read ``topic`` from the beginning until ``expected`` records arrived, ``wait_s`` passed or the
    producing side died (``alive`` turned false)."""
    consumer = kafka_consumer(kafka, topic, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    records: list[tuple[str, int]] = []
    deadline = time.monotonic() + wait_s
    try:
        while len(records) < expected and time.monotonic() < deadline and alive():
            batches = await consumer.getmany(timeout_ms=500)
            for batch in batches.values():
                records.extend((m.key.decode(), int(m.value)) for m in batch)
    finally:
        await consumer.stop()
    return records


@dataclass(frozen=True)
class RoundTripReport:
    records_per_pass: int
    first_pass_ok: bool
    second_pass_ok: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.first_pass_ok and self.second_pass_ok


async def run_round_trip(settings: Settings, records: int, log_path: str, partitions: int = 4) -> RoundTripReport:
    """Two passes of ``records`` keys through the app, with a worker restart between them."""
    started = time.monotonic()
    run_id = uuid.uuid4().hex[:8]
    kafka = resolve_connection(settings)
    durability = settings.durability
    in_topic = f"{settings.topic_prefix}.roundtrip.{run_id}.in"
    out_topic = f"{settings.topic_prefix}.roundtrip.{run_id}.out"
    replication = await ensure_topics(kafka, {in_topic: partitions, out_topic: partitions},
                                      replication=durability.replication)
    worker = Worker(kafka, settings.data_dir, f"streamproc-roundtrip-{run_id}", in_topic, out_topic, partitions,
                    replication.factor, log_path)
    keys = [f"key-{i}" for i in range(records)]

    worker.start()
    try:
        await produce(kafka, durability, in_topic, ((k, 1) for k in keys))
        first = await read_all(kafka, out_topic, records, wait_s=120, alive=worker.alive)
    finally:
        worker.stop()
    first_ok = sorted(first) == sorted((k, 1) for k in keys)

    worker.start()
    try:
        await produce(kafka, durability, in_topic, ((k, 1) for k in keys))
        both = await read_all(kafka, out_topic, 2 * records, wait_s=120, alive=worker.alive)
    finally:
        worker.stop()
    totals_by_key: dict[str, list[int]] = defaultdict(list)
    for key, total in both:
        totals_by_key[key].append(total)
    second_ok = len(both) == 2 * records and all(sorted(totals_by_key[k]) == [1, 2] for k in keys)
    return RoundTripReport(records, first_ok, second_ok, time.monotonic() - started)


def main(argv: list[str]) -> None:
    app_id, in_topic, out_topic, partitions, replication_factor = argv
    settings = Settings()
    app = make_faust_app(settings.faust, resolve_connection(settings), app_id, int(partitions),
                         int(replication_factor))
    add_totals_agent(app, in_topic, out_topic, int(partitions))
    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1:])
