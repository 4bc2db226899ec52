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

from streamproc.devstack.broker import LocalBroker, free_port
from streamproc.settings import Settings
from tests.integration.pipeline import (
    MockServer,
    OutcomeReader,
    WorkerProcess,
    chat_request,
    committed_offsets,
    produce_requests,
    record_positions,
    scrape_gauge,
    start_mock,
    trace_requests,
    worker_env,
)

pytestmark = pytest.mark.integration


IN_FLIGHT = 256  # the worker's in-flight limit (STREAMPROC_IN_FLIGHT), passed explicitly


@pytest.fixture
def slow_mock() -> Iterator[MockServer]:
    """Every call takes 4-8 s (uniform), so hundreds are in flight at any moment and they end out of order.

    Long enough that a worker on a loaded machine fills its 256 slots: at 1-3 s it had to take 128 records a
    second, which a CI run's worker did not reach in 120 s (one beside two busy loops took 35-45 a second)."""
    server = start_mock("clean", 1, "--latency", "uniform:4:8")
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
    """SIGKILL with hundreds in flight, then a restart: nothing lost, and only the records in flight are redone.

    The in-flight count is the worker's own (``streamproc_in_flight``: its dispatcher tasks). The kill waits
    for a reading at the limit: a task holds one of the ``IN_FLIGHT`` slots while its handler runs, so no
    more than that many handlers can be running at the kill, whatever happened between the reading and the
    kill, and the reading is an upper bound of them. A record is called again only if its handler was running
    at the kill: a finished handler wrote ``succeeded`` (or a failure) to the local RocksDB table, which a
    SIGKILL does not lose, so its redelivery is skipped; that covers records acked but not committed and
    records done behind a slower one (never acked). A running handler's result may already be on Kafka (the
    kill fell between the result and the state write, design §4): that is a duplicated result, also bounded.
    """
    assert settings.kafka_bootstrap is not None
    topology = settings.topology()
    port = free_port()
    # the kill is taken at full load: the adaptive limit is held there (its ramp and probes are not what this
    # test is about; a probe that held calls on a loaded machine let the batch end before 256 were in flight)
    # no hedged calls: a hedge also calls a request twice, and this test counts what a crash repeats
    env = worker_env(settings, slow_mock.url, tmp_path / "w1", in_flight=str(IN_FLIGHT),
                     adaptive_initial_in_flight=str(IN_FLIGHT),
                     adaptive_min_in_flight=str(IN_FLIGHT), worker_metrics_port=str(port), llm_hedge_ratio="0",
                     llm_timeout_s="30")  # the calls take up to 8 s
    worker = WorkerProcess(env, tmp_path / "worker.log")
    requests = [chat_request(f"k-{i}", i) for i in range(1000)]
    ids = [r.request_id for r in requests]
    await produce_requests(settings.kafka_bootstrap, settings, requests)
    positions = await record_positions(settings.kafka_bootstrap, topology.requests)
    worker.start()
    try:
        readings: list[float] = []
        open_calls: list[int] = []
        last_seen: list[int] = []  # the mock's calls and open calls at the last look, for a timeout's message

        def ready_to_kill() -> bool:
            # the gauge is read last, right before the kill; mock stats only gate the moment
            mock = slow_mock.stats()
            last_seen[:] = [mock["calls"], mock["in_flight"]]
            if mock["calls"] < 300 or mock["in_flight"] < 100:
                return False
            open_calls.append(mock["in_flight"])
            value = scrape_gauge(port, "streamproc_in_flight")
            if value is None:
                return False
            readings.append(value)
            return value >= IN_FLIGHT

        try:
            await wait_for(ready_to_kill, 120, f"300 calls made, 100 open and the worker at its {IN_FLIGHT} in flight")
        except AssertionError as exc:
            raise AssertionError(f"{exc} (last seen: the mock's calls and open calls {last_seen}, "
                                 f"the gauge {readings[-1:]})") from None
        worker.signal(signal.SIGKILL)
        in_flight_at_kill = int(readings[-1])
        assert worker.process is not None and worker.process.wait(10) == -signal.SIGKILL
        at_kill = slow_mock.stats(detail=True)
        called_before_restart = {i for i, entry in at_kill["per_request_id"].items() if entry["calls"]}
        # the dead worker commits nothing more: these are the offsets the restart starts from
        committed = await committed_offsets(settings.kafka_bootstrap, settings.app_id, topology.requests)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            for _ in range(5):
                await reader.poll()
            results_at_kill = {i for i, results in reader.outcomes.results.items() if results}
        worker.env.pop("STREAMPROC_WORKER_METRICS_PORT")  # the restart is not measured; its port may linger
        worker.start()
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 240, worker)
        stats = slow_mock.stats(detail=True)
    finally:
        worker.stop()

    def uncommitted(request_id: str) -> bool:
        partition, offset = positions[request_id]
        return offset >= committed.get(partition, 0)

    taken_uncommitted = {i for i in called_before_restart if uncommitted(i)}
    done_uncommitted = {i for i in results_at_kill if uncommitted(i)}
    calls = {i: entry["calls"] for i, entry in stats["per_request_id"].items()}
    called_again = {i for i, n in calls.items() if n > 1}
    lost = outcomes.unfinished(ids)
    duplicated_calls = stats["calls"] - len(ids)
    duplicated_results = sum(len(results) - 1 for results in outcomes.results.values())
    print(f"in flight at kill (worker gauge): {in_flight_at_kill}, calls open at the mock just before: "
          f"{open_calls[-1]}, records committed: {sum(committed.values())}, "
          f"records taken and not committed: {len(taken_uncommitted)}, "
          f"of which with a result already on Kafka: {len(done_uncommitted)}; "
          f"duplicated LLM calls: {duplicated_calls}, duplicated result records: {duplicated_results}, "
          f"lost: {len(lost)}")
    if lost:
        trace = await trace_requests(settings.kafka_bootstrap, settings, lost[:5])
        raise AssertionError(f"{len(lost)} requests lost: {lost[:10]}\n" + "\n".join(trace))
    assert not outcomes.failures, [(f.request.request_id, f.error_code, f.message)
                                   for events in outcomes.failures.values() for f in events]
    assert in_flight_at_kill >= 100
    assert sum(calls.values()) == stats["calls"]  # every call carried its request id
    # only a record redelivered after the kill (taken, not committed) may be called again ...
    assert called_again <= taken_uncommitted, sorted(called_again - taken_uncommitted)[:10]
    # ... and of those, only the ones whose handler was running at the kill (issue 4's bound)
    assert 0 <= duplicated_calls <= in_flight_at_kill, (duplicated_calls, in_flight_at_kill)
    assert duplicated_results <= in_flight_at_kill, (duplicated_results, in_flight_at_kill)


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
