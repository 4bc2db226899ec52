"""A broker dies mid-batch on a replicated cluster: a local 3-node KRaft cluster, every topic with 3 replicas
and min.insync.replicas 2, producers acks=all and idempotent. The group coordinator's node is SIGKILLed while
the worker is busy and restarted later; no request may be lost, the batch converges, one export line per request.

Select it with ``-m cluster``; it starts its own cluster (three JVMs), so it needs no session broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streamproc.devstack.cluster import LocalCluster
from streamproc.settings import Settings
from tests.integration.pipeline import OutcomeReader, WorkerProcess, start_mock, worker_env

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.serial]

REQUESTS = 300
BATCH = "ha"


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(Settings(data_dir=tmp_path_factory.mktemp("cluster"), local_kafka_port=0,
                                    local_kafka_controller_port=0))
    cluster.start(3)
    try:
        yield cluster
    finally:
        cluster.stop()


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamproc", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def batch_file(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": f"q-{i}", "prompt": f"Question {i}?", "max_tokens": 64}) + "\n"
                            for i in range(REQUESTS)))
    return path


async def replication_of(bootstrap: str, topics: list[str]) -> dict[str, tuple[list[int], str]]:
    """Per topic: the distinct replica counts of its partitions, and its min.insync.replicas."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
        configs = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
    finally:
        await admin.close()
    min_isr = {resource[3]: value for response in configs for resource in response.resources
               for name, value, *_ in resource[4] if name == "min.insync.replicas"}
    return {str(t["topic"]): (sorted({len(p["replicas"]) for p in t["partitions"]}), min_isr[t["topic"]])
            for t in described}


async def coordinator_of(bootstrap: str, group: str) -> int:
    """The node that coordinates ``group``: killing it moves the coordinator and some partition leaders."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return int(await admin.find_coordinator(group))
    finally:
        await admin.close()


async def test_a_broker_killed_mid_batch_loses_no_request(cluster: LocalCluster, tmp_path: Path) -> None:
    bootstrap = cluster.status().bootstrap
    assert bootstrap is not None and len(bootstrap.split(",")) == 3
    prefix = f"ha{os.getpid()}"
    settings = Settings(kafka_bootstrap=bootstrap, data_dir=tmp_path / "data", retry_tiers="1s,2s,4s",
                        topic_prefix=prefix, app_id=f"{prefix}-app")
    mock = start_mock("clean", 16, "--latency", "0.5")
    # 8 calls in flight at 0.5 s each: ~16 requests/s, so the batch runs long enough to lose a broker in it
    env = worker_env(settings, mock.url, tmp_path / "w1", in_flight="8", llm_hedge_ratio="0")
    worker = WorkerProcess(env, tmp_path / "worker.log")
    killed_at: int | None = None
    try:
        submitted = cli(env, "submit", str(batch_file(tmp_path / "in.jsonl")), "--batch-id", BATCH)
        assert submitted.returncode == 0, submitted.stderr
        topology = settings.topology()
        checked = [topology.requests, topology.results, topology.state_changelog]
        assert await replication_of(bootstrap, checked) == dict.fromkeys(checked, ([3], "2"))
        worker.start()
        ids = [f"{BATCH}/q-{i}" for i in range(REQUESTS)]
        async with OutcomeReader(bootstrap, settings) as reader:
            deadline = time.monotonic() + 60
            while len(reader.outcomes.results) < REQUESTS // 5 and time.monotonic() < deadline:
                await reader.poll()
            victim = await coordinator_of(bootstrap, settings.app_id)
            pid = cluster.node(victim).status().pid
            assert pid is not None
            os.killpg(pid, signal.SIGKILL)  # our own cluster's node, in its own session
            killed_at = len(reader.outcomes.results)
            deadline = time.monotonic() + 20
            while len(reader.outcomes.results) < REQUESTS * 2 // 3 and time.monotonic() < deadline:
                await reader.poll()
            while_down = len(reader.outcomes.results) - killed_at
            assert not cluster.node(victim).status().running
            await asyncio.to_thread(cluster.start_node, victim)
            outcomes = await reader.wait_until_ended(ids, 120, worker)
        assert worker.alive(), worker.log_tail()
        status = cli(env, "status", "--batch-id", BATCH, "--json")
        assert status.returncode == 0, status.stderr
        exported = cli(env, "results", "--batch-id", BATCH, "--output", str(tmp_path / "out.jsonl"))
        assert exported.returncode == 0, exported.stderr
    finally:
        worker.stop()
        mock.stop()
    assert killed_at is not None and killed_at < REQUESTS // 2, killed_at  # the broker died mid-batch
    assert while_down > 0  # two of three brokers kept taking acks=all writes
    assert not outcomes.unfinished(ids), (len(outcomes.unfinished(ids)), worker.log_tail())
    assert not outcomes.failures, {i: [f.error_code for f in fs] for i, fs in outcomes.failures.items()}
    report: dict[str, Any] = json.loads(status.stdout)
    assert (report["converged"], report["succeeded"], report["submitted"]) == (True, REQUESTS, REQUESTS), report
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"q-{i}" for i in range(REQUESTS))
    assert all(line["response"]["status_code"] == 200 for line in lines)
