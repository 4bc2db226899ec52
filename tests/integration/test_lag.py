"""``streamproc lag`` and the worker's ``/metrics`` against the real broker.

The expected numbers are read independently in each test, straight through aiokafka's admin client
(committed offsets) and a group-less consumer (end offsets), never through ``streamproc.app.lag_reader``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from prometheus_client import CollectorRegistry

from streamproc import codec
from streamproc.app.lag_reader import BrokerUnavailable, GroupNotFound, LagReader, read_lag
from streamproc.app.metrics import LagSource, LagWatcher, WorkerMetrics
from streamproc.core.lag import DrainEstimator
from streamproc.devstack.broker import free_port
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from tests.integration.pipeline import (
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce,
    produce_requests,
    start_mock,
    worker_env,
)

pytestmark = [pytest.mark.integration, pytest.mark.serial]

PARTITIONS = 3
PER_PARTITION = 20


@dataclass
class Scene:
    bootstrap: str
    topic: str
    group: str
    consumer: AIOKafkaConsumer  # a live member of ``group``

    async def commit(self, offsets: dict[int, int]) -> None:
        await self.consumer.commit({TopicPartition(self.topic, p): OffsetAndMetadata(o, "")
                                    for p, o in offsets.items()})


async def independent_offsets(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int | None, int, int]]:
    """partition -> (committed or None, log start, log end), read with aiokafka only."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        await consumer.topics()
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
    finally:
        await consumer.stop()
        await admin.close()
    return {tp.partition: (committed[tp].offset if tp in committed and committed[tp].offset >= 0 else None,
                           starts[tp], ends[tp]) for tp in tps}


def expected_lag(offsets: dict[int, tuple[int | None, int, int]]) -> dict[int, int]:
    return {p: end - (committed if committed is not None else start)
            for p, (committed, start, end) in offsets.items()}


@pytest.fixture
async def scene(settings: Settings) -> AsyncIterator[Scene]:
    """A topic with 20 records in each of 3 partitions, and a group that read them all but committed
    15 on partition 0, 5 on partition 1 and nothing on partition 2."""
    assert settings.kafka_bootstrap is not None
    bootstrap = settings.kafka_bootstrap
    topic, group = f"{settings.topic_prefix}.lagtest", f"{settings.topic_prefix}-lag-group"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    await produce_to_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        seen = 0
        deadline = time.monotonic() + 60
        while seen < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            seen += sum(len(records) for records in batches.values())
        assert seen == PARTITIONS * PER_PARTITION
        current = Scene(bootstrap, topic, group, consumer)
        await current.commit({0: 15, 1: 5})
        yield current
    finally:
        await consumer.stop()


async def produce_to_partitions(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for partition in range(PARTITIONS):
            for i in range(PER_PARTITION):
                await producer.send(topic, value=f"{partition}-{i}".encode(), partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


# --- read_lag ----------------------------------------------------------------------------------------------


async def test_read_lag_agrees_with_the_offsets_read_independently(scene: Scene) -> None:
    offsets = await independent_offsets(scene.bootstrap, scene.group, scene.topic)
    assert {p: o[0] for p, o in offsets.items()} == {0: 15, 1: 5, 2: None}  # the scene is what we think

    report = await read_lag(KafkaConnection(bootstrap=scene.bootstrap), [scene.group])

    group = report.group(scene.group)
    rows = {p.partition: p for p in group.partitions if p.topic == scene.topic}
    assert {p: (r.committed, r.start, r.end) for p, r in rows.items()} == offsets
    assert {p: r.lag for p, r in rows.items()} == expected_lag(offsets) == {0: 5, 1: 15, 2: 20}
    assert group.lag == 40
    assert (group.state, group.members) == ("Stable", 1)
    assert not any(p.internal for p in group.partitions)


async def test_every_group_is_listed_without_a_filter(scene: Scene) -> None:
    report = await read_lag(KafkaConnection(bootstrap=scene.bootstrap), None)
    assert scene.group in [g.group for g in report.groups]


async def test_rates_come_from_two_readings(scene: Scene) -> None:
    estimator = DrainEstimator()
    async with LagReader(KafkaConnection(bootstrap=scene.bootstrap)) as reader:
        first = await reader.read([scene.group])
        estimator.add(first.taken_at, first.committed(), first.ends())
        await scene.commit({0: 20, 1: 15})  # 15 more records consumed
        await asyncio.sleep(1.0)
        second = await reader.read([scene.group])
        estimator.add(second.taken_at, second.committed(), second.ends())
    report = second.estimated(estimator)
    group = report.group(scene.group)
    span = estimator.span_s()
    assert span is not None and span >= 1.0
    assert group.lag == 25
    assert group.rate == pytest.approx(15 / span)
    assert group.eta_seconds == pytest.approx(25 / (15 / span))
    rows = {p.partition: p for p in group.partitions}
    assert rows[1].rate == pytest.approx(10 / span)
    assert rows[1].eta_seconds == pytest.approx(5 / (10 / span))
    assert rows[2].rate is None and rows[2].eta_seconds is None  # never committed: its own pace is unknown


async def test_unknown_group_and_unreachable_broker(scene: Scene) -> None:
    with pytest.raises(GroupNotFound, match="no-such-group"):
        await read_lag(KafkaConnection(bootstrap=scene.bootstrap), ["no-such-group"])
    with pytest.raises(BrokerUnavailable, match="not reachable"):
        await read_lag(KafkaConnection(bootstrap="127.0.0.1:1"), None)


# --- the command -------------------------------------------------------------------------------------------


def run_cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("STREAMPROC_")}
    env["STREAMPROC_KAFKA_BOOTSTRAP"] = bootstrap
    return subprocess.run([sys.executable, "-m", "streamproc", "lag", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


async def test_cli_json_and_max_lag_exit_code(scene: Scene) -> None:
    offsets = await independent_offsets(scene.bootstrap, scene.group, scene.topic)

    done = await asyncio.to_thread(run_cli, scene.bootstrap, "--group", scene.group, "--json", "--interval", "0.5")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert 0.5 <= document["interval_s"] < 30  # the span between the two readings: the interval and their time
    [group] = document["groups"]
    assert group["group"] == scene.group and group["lag"] == 40 and group["members"] == 1
    assert {p["partition"]: (p["committed"], p["start"], p["end"]) for p in group["partitions"]} == offsets
    assert group["eta_seconds"] is None  # nobody consumed during the interval: no estimate

    over = await asyncio.to_thread(run_cli, scene.bootstrap, "--group", scene.group, "--no-rate", "--max-lag", "39")
    assert over.returncode == 4
    assert over.stderr.strip().count("\n") == 0
    assert re.search(rf"group '{re.escape(scene.group)}' has a lag of 40 records, over --max-lag 39", over.stderr)
    assert over.stdout.splitlines()[0].split()[:6] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET",
                                                      "LOG-END-OFFSET", "LAG"]
    at_limit = await asyncio.to_thread(run_cli, scene.bootstrap, "--group", scene.group, "--no-rate",
                                       "--max-lag", "40")
    assert at_limit.returncode == 0, at_limit.stderr


async def test_cli_errors_are_one_line(scene: Scene) -> None:
    unknown = await asyncio.to_thread(run_cli, scene.bootstrap, "--group", "no-such-group", "--no-rate")
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [unknown.stderr.strip()]
    assert "consumer group 'no-such-group' does not exist" in unknown.stderr
    assert unknown.stdout == ""

    unreachable = await asyncio.to_thread(run_cli, "127.0.0.1:1", "--no-rate", "--json")
    assert unreachable.returncode == 3  # configuration refused: nothing answers at that address
    assert unreachable.stderr.strip().splitlines() == [unreachable.stderr.strip()]
    assert "not reachable" in unreachable.stderr


# --- the worker's /metrics ---------------------------------------------------------------------------------



def scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value, from the exposition text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, number = line.rpartition(" ")
            samples[name] = float(number)
    return samples


async def test_worker_serves_metrics_that_match_the_batch_and_the_lag(settings: Settings, tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    port = free_port()
    mock = start_mock("clean")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", worker_metrics_port=str(port)),
                           tmp_path / "worker.log")
    worker.start()
    requests = [chat_request(f"m-{i}", i) for i in range(12)]
    topology = settings.topology()
    try:
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended([r.request_id for r in requests], 120, worker)
        assert not outcomes.unfinished(r.request_id for r in requests), worker.log_tail()
        await produce(settings.kafka_bootstrap, topology.requests, [(b"m-0", codec.encode(requests[0]))])  # again

        lag_series = re.compile(rf'streamproc_consumer_lag{{partition="(\d+)",topic="{re.escape(topology.requests)}"}}')
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:  # counters move at once, commits every few s, the lag gauge every 10 s
            samples = await asyncio.to_thread(scrape, port)
            lags = {int(m.group(1)): v for k, v in samples.items() if (m := lag_series.fullmatch(k))}
            offsets = await independent_offsets(settings.kafka_bootstrap, settings.app_id, topology.requests)
            skipped = samples.get('streamproc_skipped_total{reason="already_succeeded"}')
            state = f"skipped {skipped}, gauge {lags}, offsets {offsets}"
            if skipped == 1 and lags == expected_lag(offsets) == dict.fromkeys(range(settings.partitions), 0):
                break
            await asyncio.sleep(1)
        else:
            raise AssertionError(f"metrics did not settle: {state}\n{worker.log_tail()}")

        assert samples['streamproc_llm_calls_total{model="mock-small",outcome="success"}'] == 12
        assert samples["streamproc_results_total"] == 12
        assert samples['streamproc_llm_latency_seconds_count{model="mock-small",outcome="success"}'] == 12
        assert samples["streamproc_in_flight"] == 0
        assert not any(k.startswith("streamproc_failures_total{") for k in samples)
        assert samples["streamproc_consumer_lag_updated_timestamp_seconds"] > time.time() - 60

        # the command reads what the gauge and the independent reading say (nothing moves any more)
        report = await read_lag(KafkaConnection(bootstrap=settings.kafka_bootstrap), [settings.app_id])
        group = report.group(settings.app_id)
        requests_rows = {p.partition: p for p in group.partitions if p.topic == topology.requests}
        assert {p: (r.committed, r.start, r.end) for p, r in requests_rows.items()} == offsets
        assert sum(r.end for r in requests_rows.values()) == 13
        assert group.lag == 0
        assert (group.state, group.members) == ("Stable", 1), worker.log_tail()
    finally:
        worker.stop()
        mock.stop()


# --- the stall watchdog ------------------------------------------------------------------------------------


async def test_the_watchdog_reports_a_wedged_partition_and_clears_when_it_moves(
        scene: Scene, caplog: pytest.LogCaptureFixture) -> None:
    """The scene's group is wedged on purpose: it holds partitions 0 and 1 with records behind its committed
    offsets and commits nothing more, as a worker stuck on one record would look to the broker."""
    metrics = WorkerMetrics(CollectorRegistry())
    clock = [1000.0]
    watcher = LagWatcher(metrics, LagSource(KafkaConnection(bootstrap=scene.bootstrap), scene.group, [scene.topic]),
                         lambda: [(scene.topic, 0), (scene.topic, 1)], clock=lambda: clock[0], stall_after_s=30)

    def stalled(partition: int) -> float | None:
        return metrics.registry.get_sample_value("streamproc_partition_stalled",
                                                 {"topic": scene.topic, "partition": str(partition)})

    try:
        await watcher.refresh()
        clock[0] += 20
        await watcher.refresh()
        assert (stalled(0), stalled(1)) == (0.0, 0.0)  # not moving, but not for longer than the slowest tier yet
        clock[0] += 15
        with caplog.at_level(logging.WARNING, logger="streamproc.app.metrics"):
            await watcher.refresh()
        assert (stalled(0), stalled(1)) == (1.0, 1.0)
        assert f"partition {scene.topic}[1] is stalled: its committed offset 5 has not moved for 35 s while 15 " \
               "records wait behind it" in caplog.text
        await scene.commit({1: 20})  # partition 1 drains: it clears at once; partition 0 is still wedged
        clock[0] += 5
        await watcher.refresh()
        assert (stalled(0), stalled(1)) == (1.0, 0.0)
    finally:
        await watcher.close()
