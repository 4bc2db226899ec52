"""Test harness for the pipeline: real processes (mock LLM server, workers) around the session's broker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from streamproc import codec
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.scheduling_headers import scheduling_headers
from streamproc.core.vocabulary import FailureLayer
from streamproc.kafka.connection import KafkaConnection
from streamproc.mockllm.runner import MockLLMProcess
from streamproc.processes import stop_process
from streamproc.settings import Settings


def chat_request(request_id: str, i: int, *, batch_id: str = "b1", json_schema: bool = False) -> InferenceRequest:
    body: dict[str, Any] = {"model": "mock-small", "max_tokens": 256,
                            "messages": [{"role": "user", "content": f"Summarise item {i} of the test batch."}]}
    if json_schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "label", "schema": {
            "type": "object", "required": ["label", "score"],
            "properties": {"label": {"type": "string"}, "score": {"type": "number"}}}}}
    return InferenceRequest(request_id=request_id, body_json=json.dumps(body), batch_id=batch_id,
                            submitted_ms=int(time.time() * 1000))


MockServer = MockLLMProcess


def start_mock(profile: str, seed: int = 7, *args: str) -> MockLLMProcess:
    """The mock server as a child process on a free port (``mock.stats(detail=True)`` has per-id calls)."""
    return MockLLMProcess.start("--profile", profile, "--seed", str(seed), *args)


@dataclass
class WorkerProcess:
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None)
    python: str = sys.executable  # another interpreter runs another release (test_rolling_upgrade)
    cwd: Path | None = None  # ``-m`` imports from the working directory first: another release runs elsewhere

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([self.python, "-m", "streamproc", "worker"], env=self.env, cwd=self.cwd,
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self, timeout: float = 90.0) -> int | None:
        return None if self.process is None else stop_process(self.process, timeout)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def worker_env(settings: Settings, llm_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("STREAMPROC_")}
    assert settings.kafka_bootstrap is not None
    env.update({
        "STREAMPROC_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "STREAMPROC_LLM_BASE_URL": llm_url,
        "STREAMPROC_TOPIC_PREFIX": settings.topic_prefix,
        "STREAMPROC_APP_ID": settings.app_id,
        "STREAMPROC_DATA_DIR": str(data_dir),
        "STREAMPROC_PARTITIONS": str(settings.partitions),
        "STREAMPROC_RETRY_TIERS": settings.retry_tiers,
        "STREAMPROC_LLM_TIMEOUT_S": "5",
        "STREAMPROC_KAFKA_SESSION_TIMEOUT_S": "10",
    })
    env.update({f"STREAMPROC_{key.upper()}": value for key, value in extra.items()})
    return env


async def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes | None]],
                  headers: Callable[[int], Sequence[tuple[str, bytes]]] = lambda _: ()) -> int:
    """Write the records; ``headers(i)``: the i-th record's headers."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    count = 0
    try:
        for key, value in records:
            await producer.send(topic, key=key, value=value, headers=list(headers(count)) or None)
            count += 1
        await producer.flush()
    finally:
        await producer.stop()
    return count


async def produce_requests(bootstrap: str, settings: Settings, requests: Iterable[InferenceRequest],
                           scheduled: bool = False) -> int:
    """Write the requests on the requests topic; ``scheduled``: with the headers ``submit`` sets (tenancy, size)."""
    topology = settings.topology()
    await ensure_pipeline_topics(KafkaConnection(bootstrap=bootstrap), topology)
    listed = list(requests)
    return await produce(bootstrap, topology.requests, ((r.request_id.encode(), codec.encode(r)) for r in listed),
                         lambda i: scheduling_headers(listed[i]) if scheduled else ())


@dataclass
class Outcomes:
    """Everything on results and failed.* so far, by request id."""

    results: dict[str, list[InferenceResult]] = field(default_factory=lambda: defaultdict(list))
    failures: dict[str, list[FailureEvent]] = field(default_factory=lambda: defaultdict(list))
    dead_letters: int = 0
    dead_letter_headers: list[dict[str, bytes]] = field(default_factory=list)

    def terminal(self, request_id: str) -> list[FailureEvent]:
        return [event for event in self.failures.get(request_id, []) if event.terminal]

    def ended(self, request_id: str) -> bool:
        return bool(self.results.get(request_id)) or bool(self.terminal(request_id))

    def unfinished(self, ids: Iterable[str]) -> list[str]:
        return [i for i in ids if not self.ended(i)]


class OutcomeReader:
    """Reads results, failures and dead letters from the beginning, incrementally."""

    def __init__(self, bootstrap: str, settings: Settings, schema_lookup: codec.SchemaLookup | None = None) -> None:
        topology = settings.topology()
        self._schema_lookup = schema_lookup  # a registry's, for records in the Confluent wire format
        self._result_topic = topology.results
        self._dead_letter_topic = topology.dead_letters
        self._topics = [topology.results, topology.dead_letters, *(topology.failed(layer) for layer in FailureLayer)]
        self._consumer = AIOKafkaConsumer(*self._topics, bootstrap_servers=bootstrap, group_id=None,
                                          auto_offset_reset="earliest", enable_auto_commit=False)
        self.outcomes = Outcomes()

    async def __aenter__(self) -> OutcomeReader:
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def poll(self) -> None:
        batches = await self._consumer.getmany(timeout_ms=300, max_records=5000)
        for tp, messages in batches.items():
            for message in messages:
                if tp.topic == self._result_topic:
                    result = codec.decode(message.value, InferenceResult, schema_lookup=self._schema_lookup)
                    self.outcomes.results[result.request_id].append(result)
                elif tp.topic == self._dead_letter_topic:
                    self.outcomes.dead_letters += 1
                    self.outcomes.dead_letter_headers.append(dict(message.headers))
                else:
                    event = codec.decode(message.value, FailureEvent, schema_lookup=self._schema_lookup)
                    self.outcomes.failures[event.request.request_id].append(event)

    async def wait_until_ended(self, ids: Iterable[str], timeout_s: float, *workers: WorkerProcess) -> Outcomes:
        wanted = list(ids)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await self.poll()
            if not self.outcomes.unfinished(wanted):
                break
            if workers and not any(w.alive() for w in workers):
                break
        await self.read_to_end()  # the failures written before the last results, and late duplicates
        return self.outcomes

    async def read_to_end(self, timeout_s: float = 30) -> None:
        """Poll until every partition read is at the end offset it had on entry: an outcome is only seen once its
        partition is caught up (a busy results partition can keep a failure partition's backlog unread)."""
        await self.poll()
        ends = await self._consumer.end_offsets(list(self._consumer.assignment()))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and await self._behind(ends):
            await self.poll()

    async def _behind(self, ends: dict[TopicPartition, int]) -> bool:
        return any([await self._consumer.position(tp) < end for tp, end in ends.items()])


async def parked_records(settings: Settings) -> list[tuple[bytes | None, dict[str, bytes]]]:
    """The key and headers of every record on the backlog topic: the requests the workers parked (design §5.11)."""
    assert settings.kafka_bootstrap is not None
    consumer = AIOKafkaConsumer(settings.topology().backlog, bootstrap_servers=settings.kafka_bootstrap,
                                group_id=None, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    parked: list[tuple[bytes | None, dict[str, bytes]]] = []
    try:
        for _ in range(5):
            for messages in (await consumer.getmany(timeout_ms=500, max_records=10_000)).values():
                parked += [(message.key, dict(message.headers)) for message in messages]
    finally:
        await consumer.stop()
    return parked


async def trace_requests(bootstrap: str, settings: Settings, request_ids: Iterable[str]) -> list[str]:
    """Where the given ids appear on every topic, and the group's committed offsets there: for failure reports."""
    wanted = {request_id.encode() for request_id in request_ids}
    topics = list(settings.topology().all_topics())
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    lines: list[str] = []
    try:
        for _ in range(20):
            batches = await consumer.getmany(timeout_ms=300, max_records=10000)
            for tp, messages in batches.items():
                for message in messages:
                    if message.key in wanted:
                        headers = {k: v.decode() for k, v in message.headers if k in ("x-attempt", "x-error-code")}
                        lines.append(f"{message.key.decode()}: {tp.topic}[{tp.partition}]@{message.offset} {headers}")
    finally:
        await consumer.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(settings.app_id)
        lines += [f"committed {tp.topic}[{tp.partition}] = {meta.offset}" for tp, meta in sorted(committed.items())
                  if not tp.topic.endswith("-changelog")]
    finally:
        await admin.close()
    return lines


async def group_lag(bootstrap: str, group: str, topic: str) -> int:
    """Records of ``topic`` the consumer group has not committed yet (all partitions)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        partitions = [tp for tp in (TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or [])]
        ends = await consumer.end_offsets(partitions)
        return sum(end - (committed[tp].offset if tp in committed and committed[tp].offset >= 0 else 0)
                   for tp, end in ends.items())
    finally:
        await consumer.stop()
        await admin.close()


async def wait_caught_up(bootstrap: str, settings: Settings, topic: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await group_lag(bootstrap, settings.app_id, topic) == 0:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"the workers did not consume {topic} within {timeout_s}s")



def scrape_gauge(port: int, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The value of a gauge on ``http://127.0.0.1:port/metrics`` with exactly these labels (none by default);
    None while nothing answers or no such series exists."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == (labels or {}):
                return float(sample.value)
    return None


async def record_positions(bootstrap: str, topic: str) -> dict[str, tuple[int, int]]:
    """Where each key of ``topic`` was written: key (as text) -> (partition, offset) of its last record."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    positions: dict[str, tuple[int, int]] = {}
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        ends = await consumer.end_offsets(partitions)
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            batches = await consumer.getmany(timeout_ms=300, max_records=10000)
            for tp, messages in batches.items():
                for message in messages:
                    if message.key is not None:
                        positions[message.key.decode()] = (tp.partition, message.offset)
    finally:
        await consumer.stop()
    return positions


async def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset per partition of ``topic`` (partitions never committed are absent)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic and meta.offset >= 0}
