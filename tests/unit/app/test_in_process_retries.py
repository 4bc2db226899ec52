"""In-process retries against fake admin clients and readers: what is retried, how often, what is logged,
what is raised at the end. The sleeps are recorded instead of slept."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import SimpleNamespace, TracebackType
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from streamproc.app import manifest_follower, topics, worker
from streamproc.app.manifest_follower import BatchSizes
from streamproc.app.topics import ReplicationError, TopicMismatchError, ensure_topics
from streamproc.codec.manifest import BatchManifest, encode_manifest
from streamproc.core.replication import Replication, ReplicationRequest
from streamproc.kafka.connection import KafkaConnection

_real_sleep = asyncio.sleep


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The seconds every ``asyncio.sleep`` asked for (tenacity's included); each only yields to the loop."""
    asked: list[float] = []

    async def record(seconds: float) -> None:
        asked.append(seconds)
        await _real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", record)
    monkeypatch.setattr(worker, "diagnose", no_diagnosis)
    return asked


async def no_diagnosis(_kafka: KafkaConnection) -> None:
    """The broker is simply not there yet: nothing a probe would call a lasting refusal."""


class FakeAdmin:
    """Stands in for ``kafka_admin``'s client: ``start`` fails ``failures`` times; topics get partitions on the
    ``ready_after``-th describe (never when None); the cluster has ``brokers`` brokers."""

    def __init__(self, failures: int = 0, ready_after: int | None = 1, partitions: int = 4, brokers: int = 1) -> None:
        self.failures, self.ready_after, self.partitions, self.brokers = failures, ready_after, partitions, brokers
        self.starts = self.closes = self.describes = 0
        self.created: list[str] = []
        self.new_topics: list[Any] = []

    def __call__(self, _kafka: KafkaConnection, **_config: Any) -> FakeAdmin:
        return self

    async def start(self) -> None:
        self.starts += 1
        if self.starts <= self.failures:
            raise KafkaConnectionError(f"no broker (attempt {self.starts})")

    async def close(self) -> None:
        self.closes += 1

    async def list_topics(self) -> list[str]:
        return []

    async def create_topics(self, new_topics: list[Any]) -> None:
        self.created += [topic.name for topic in new_topics]
        self.new_topics += new_topics

    async def describe_cluster(self) -> dict[str, Any]:
        return {"brokers": [{"node_id": n} for n in range(1, self.brokers + 1)], "controller_id": 1}

    async def describe_topics(self, names: list[str]) -> list[dict[str, object]]:
        self.describes += 1
        ready = self.ready_after is not None and self.describes >= self.ready_after
        return [{"topic": name, "error_code": 0, "partitions": list(range(self.partitions)) if ready else []}
                for name in names]


async def test_wait_for_broker_retries_a_kafka_error_with_a_doubling_wait(
        monkeypatch: pytest.MonkeyPatch, slept: list[float], caplog: pytest.LogCaptureFixture) -> None:
    admin = FakeAdmin(failures=2)
    monkeypatch.setattr(worker, "kafka_admin", admin)
    with caplog.at_level(logging.WARNING, logger=worker.log.name):
        await worker.wait_for_broker(KafkaConnection(bootstrap="k:9092"))
    assert (admin.starts, admin.closes) == (3, 3)  # every client closed, the failed ones too
    assert slept == [0.5, 1.0]
    assert [r.getMessage() for r in caplog.records] == [
        "Kafka at k:9092 (PLAINTEXT) is not reachable (KafkaConnectionError: no broker (attempt 1)); retrying in 0.5s",
        "Kafka at k:9092 (PLAINTEXT) is not reachable (KafkaConnectionError: no broker (attempt 2)); retrying in 1.0s",
    ]


async def test_wait_for_broker_gives_up_with_the_last_kafka_error(monkeypatch: pytest.MonkeyPatch,
                                                                  slept: list[float]) -> None:
    admin = FakeAdmin(failures=1000)
    monkeypatch.setattr(worker, "kafka_admin", admin)
    with pytest.raises(KafkaConnectionError, match=r"no broker \(attempt 1\)"):
        await worker.wait_for_broker(KafkaConnection(bootstrap="k:9092"), give_up_after_s=0)
    assert (admin.starts, slept) == (1, [])


async def test_wait_for_broker_backs_off_to_ten_seconds(monkeypatch: pytest.MonkeyPatch, slept: list[float]) -> None:
    monkeypatch.setattr(worker, "kafka_admin", FakeAdmin(failures=7))
    await worker.wait_for_broker(KafkaConnection(bootstrap="k:9092"))
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


async def test_new_topics_are_described_again_until_they_have_partitions(monkeypatch: pytest.MonkeyPatch,
                                                                          slept: list[float]) -> None:
    admin = FakeAdmin(ready_after=3)
    monkeypatch.setattr(topics, "kafka_admin", admin)
    await ensure_topics(KafkaConnection(bootstrap="k:9092"), {"a": 4, "b": 4})
    assert (admin.created, admin.describes, slept, admin.closes) == (["a", "b"], 3, [0.1, 0.1], 1)


async def test_topics_that_never_get_partitions_are_a_mismatch_after_fifty_tries(monkeypatch: pytest.MonkeyPatch,
                                                                                slept: list[float]) -> None:
    admin = FakeAdmin(ready_after=None)
    monkeypatch.setattr(topics, "kafka_admin", admin)
    with pytest.raises(TopicMismatchError, match=r"a has 0 \(needs 4\), b has 0 \(needs 4\)"):
        await ensure_topics(KafkaConnection(bootstrap="k:9092"), {"a": 4, "b": 4})
    assert (admin.describes, len(slept), admin.closes) == (50, 49, 1)


async def test_topics_get_three_replicas_and_a_minimum_of_two_on_a_three_broker_cluster(
        monkeypatch: pytest.MonkeyPatch, slept: list[float]) -> None:
    admin = FakeAdmin(brokers=3)
    monkeypatch.setattr(topics, "kafka_admin", admin)
    plan = await ensure_topics(KafkaConnection(bootstrap="k:9092"), {"a": 4, "c": 4},
                               configs={"c": {"cleanup.policy": "compact"}})
    assert plan == Replication(3, 2)
    assert [(t.name, t.replication_factor, t.topic_configs) for t in admin.new_topics] == [
        ("a", 3, {"min.insync.replicas": "2"}),
        ("c", 3, {"min.insync.replicas": "2", "cleanup.policy": "compact"})]


async def test_more_replicas_than_brokers_is_refused_before_any_topic_is_created(
        monkeypatch: pytest.MonkeyPatch) -> None:
    admin = FakeAdmin(brokers=1)
    monkeypatch.setattr(topics, "kafka_admin", admin)
    with pytest.raises(ReplicationError, match="replication factor 3 needs 3 brokers but the cluster has 1"):
        await ensure_topics(KafkaConnection(bootstrap="k:9092"), {"a": 4}, replication=ReplicationRequest(factor=3))
    assert (admin.created, admin.closes) == ([], 1)


async def test_a_wrong_partition_count_is_not_retried(monkeypatch: pytest.MonkeyPatch, slept: list[float]) -> None:
    admin = FakeAdmin(partitions=2)
    monkeypatch.setattr(topics, "kafka_admin", admin)
    with pytest.raises(TopicMismatchError, match=r"a has 2 \(needs 4\)"):
        await ensure_topics(KafkaConnection(bootstrap="k:9092"), {"a": 4})
    assert (admin.describes, slept) == (1, [])


class FakeReader:
    """Stands in for ``TopicReader``: the first ``failures`` opens fail, later ones read one manifest."""

    opens = 0
    failures = 1

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        pass

    async def __aenter__(self) -> FakeReader:
        FakeReader.opens += 1
        if FakeReader.opens <= FakeReader.failures:
            raise KafkaConnectionError("broker gone")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        return None

    async def read_to_end(self) -> list[Any]:
        return [SimpleNamespace(value=encode_manifest(BatchManifest("b1", 20, 1, "in.jsonl")))]


async def eventually(condition: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await _real_sleep(0.001)
    raise AssertionError(what)


async def test_the_follower_logs_a_broker_problem_and_reads_again_until_cancelled(
        monkeypatch: pytest.MonkeyPatch, slept: list[float], caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(manifest_follower, "TopicReader", FakeReader)
    monkeypatch.setattr(FakeReader, "opens", 0)
    sizes = BatchSizes()
    with caplog.at_level(logging.WARNING, logger=manifest_follower.log.name):
        kafka = KafkaConnection(bootstrap="k:9092")
        following: asyncio.Task[None] = asyncio.create_task(sizes.follow(kafka, "llm.batches", interval_s=2.0))
        await eventually(lambda: sizes.submitted("b1") == 20, "the manifest was not read after the failure")
        await eventually(lambda: len(slept) >= 3, "the follower did not poll again")
        following.cancel()
        done: Awaitable[Any] = asyncio.gather(following, return_exceptions=True)
        assert isinstance(await done, list)
    assert following.cancelled()
    assert slept[0] == 10.0 and set(slept[1:]) == {2.0}  # the retry waits interval * 5, the poll interval
    assert FakeReader.opens == 2
    assert [r.getMessage() for r in caplog.records] == [
        "could not read the batch manifests from llm.batches (KafkaConnectionError: broker gone); retrying"]
