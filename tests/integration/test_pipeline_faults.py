"""Fault tests: a worker killed with SIGKILL, a broker restarted, a second worker joining and leaving."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import GroupCoordinatorNotAvailableError

from streamproc.localkafka import LocalBroker
from streamproc.settings import Settings
from tests.integration.pipeline import (
    MockServer,
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce_requests,
    start_mock,
    trace_requests,
    worker_env,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def slow_mock() -> Iterator[MockServer]:
    """Every call takes 2 s, so hundreds are in flight at any moment."""
    server = start_mock("clean", 1, "--latency", "2")
    yield server
    server.stop()


async def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def test_sigkill_mid_batch_loses_nothing(settings: Settings, slow_mock: MockServer, tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    env = worker_env(settings, slow_mock.url, tmp_path / "w1")
    worker = WorkerProcess(env, tmp_path / "worker.log")
    requests = [chat_request(f"k-{i}", i) for i in range(1500)]
    ids = [r.request_id for r in requests]
    await produce_requests(settings.kafka_bootstrap, settings, requests)
    worker.start()
    try:
        await wait_for(lambda: slow_mock.stats()["calls"] >= 300 and slow_mock.stats()["in_flight"] >= 100,
                       120, "300 calls made and 100 in flight")
        before = slow_mock.stats()
        worker.signal(signal.SIGKILL)
        assert worker.process is not None and worker.process.wait(10) == -signal.SIGKILL
        calls_before_restart = slow_mock.stats()["calls"]
        # calls open at the kill: those open just before, plus any started in between (an upper bound)
        in_flight_at_kill = before["in_flight"] + calls_before_restart - before["calls"]
        worker.start()
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 240, worker)
        stats = slow_mock.stats()
    finally:
        worker.stop()

    lost = outcomes.unfinished(ids)
    duplicated_calls = stats["calls"] - len(ids)
    duplicated_results = sum(len(results) - 1 for results in outcomes.results.values())
    print(f"in flight at kill: {in_flight_at_kill}, calls before restart: {calls_before_restart}, "
          f"duplicated LLM calls: {duplicated_calls}, duplicated result records: {duplicated_results}")
    if lost:
        trace = await trace_requests(settings.kafka_bootstrap, settings, lost[:5])
        raise AssertionError(f"{len(lost)} requests lost: {lost[:10]}\n" + "\n".join(trace))
    assert not outcomes.failures, [(f.request.request_id, f.error_code, f.message)
                                   for events in outcomes.failures.values() for f in events]
    assert in_flight_at_kill >= 100
    assert duplicated_calls >= 0
    if duplicated_calls > in_flight_at_kill or duplicated_results > in_flight_at_kill:
        # Known gap, kept visible (issue 4 stays open): after a SIGKILL the state table can come back without
        # the last "succeeded" writes of records that were acked but not yet committed, so some of them are
        # called again; nothing is lost, but the duplicates can exceed the calls that were in flight.
        pytest.xfail(f"duplicates above the in-flight count at the kill ({in_flight_at_kill}): "
                     f"{duplicated_calls} LLM calls, {duplicated_results} result records")


async def test_broker_restart_mid_batch(tmp_path: Path) -> None:
    """A private broker is stopped and started again mid-batch: the worker reconnects by itself."""
    broker = LocalBroker(Settings(data_dir=tmp_path / "broker", local_kafka_port=0, local_kafka_controller_port=0))
    status = broker.start()
    assert status.bootstrap is not None
    settings = Settings(kafka_bootstrap=status.bootstrap, data_dir=tmp_path / "data", topic_prefix="restart",
                        retry_tiers="1s,2s,4s")
    mock = start_mock("clean", 2, "--latency", "0.5")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    requests = [chat_request(f"b-{i}", i) for i in range(1000)]
    ids = [r.request_id for r in requests]
    try:
        await produce_requests(status.bootstrap, settings, requests)
        worker.start()
        await wait_for(lambda: mock.stats()["calls"] >= 250, 120, "250 calls")
        assert broker.stop()
        calls_while_down = mock.stats()["calls"]
        await asyncio.sleep(5)
        restarted = broker.start()
        assert restarted.bootstrap == status.bootstrap  # same address: clients reconnect by themselves
        async with OutcomeReader(status.bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 300, worker)
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()
        mock.stop()
        broker.stop()
    lost = outcomes.unfinished(ids)
    assert lost == [], f"{len(lost)} lost after a broker restart: {lost[:10]}\n{worker.log_tail()}"
    assert calls_while_down < len(ids)  # the restart really happened mid-batch
    assert all(outcomes.results[i] for i in ids)


async def test_two_workers_share_partitions_and_hand_over(settings: Settings, tmp_path: Path) -> None:
    """Two workers in one group split the partitions; stopping one mid-batch hands its partitions over."""
    assert settings.kafka_bootstrap is not None
    mock = start_mock("clean", 4, "--latency", "1")
    first = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1"), tmp_path / "w1.log")
    second = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w2"), tmp_path / "w2.log")
    requests = [chat_request(f"g-{i}", i) for i in range(1500)]
    ids = [r.request_id for r in requests]
    group = settings.app_id
    try:
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        first.start()
        second.start()
        await wait_for_assignment(settings.kafka_bootstrap, group, members=2, timeout_s=90)
        split = await requests_partitions_by_member(settings.kafka_bootstrap, group, settings.topic_prefix)
        await wait_for(lambda: mock.stats()["calls"] >= 400, 120, "400 calls")
        assert first.stop() == 0  # a graceful stop mid-batch
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 300, second)
        after = await requests_partitions_by_member(settings.kafka_bootstrap, group, settings.topic_prefix)
    finally:
        first.stop()
        second.stop()
        mock.stop()
    assert sorted(len(p) for p in split) == [4, 4], split  # 8 partitions, split evenly
    assert [len(p) for p in after] == [8], after  # all handed to the survivor
    lost = outcomes.unfinished(ids)
    assert lost == [], f"{len(lost)} lost in the hand-over: {lost[:10]}"
    assert not outcomes.failures


async def requests_partitions_by_member(bootstrap: str, group: str, prefix: str) -> list[list[int]]:
    """The requests-topic partitions each member of the group holds, read from the group coordinator."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        description = await describe_group(admin, group)
    finally:
        await admin.close()
    members = []
    for member in description["members"]:
        assignment = ConsumerProtocolMemberAssignment.decode(member["member_assignment"])
        partitions = [p for topic, parts in assignment.assignment if topic == f"{prefix}.requests" for p in parts]
        members.append(sorted(partitions))
    return members


async def describe_group(admin: AIOKafkaAdminClient, group: str) -> dict[str, Any]:
    (response,) = await admin.describe_consumer_groups([group])
    (description,) = response.to_object()["groups"]
    return cast(dict[str, Any], description)


async def wait_for_assignment(bootstrap: str, group: str, members: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        while time.monotonic() < deadline:
            try:
                description = await describe_group(admin, group)
            except GroupCoordinatorNotAvailableError:  # the group does not exist yet
                description = {"state": "", "members": []}
            if description["state"] == "Stable" and len(description["members"]) == members:
                return
            await asyncio.sleep(0.5)
    finally:
        await admin.close()
    raise AssertionError(f"group {group} did not settle with {members} members in {timeout_s}s")
