"""Issue 12 on a real broker: batches that reuse custom_ids, deployments side by side, batches that stop moving.

* A request's identity is (batch, custom_id): batches with the same custom_ids, one after the other and at the
  same time, each converge with one export line per custom_id.
* A deployment's namespace is its topic prefix: two deployments with the same batch file run at the same time
  on one broker, and neither's group nor state holds the other's records.
* Never silent: a batch nobody consumes says so (``status``, and ``run`` before its timeout); requests
  produced without batch scope that a worker skips as duplicates are named as such.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from streamproc import codec
from streamproc.app.topic_reader import TopicReader
from streamproc.codec.manifest import BatchManifest, encode_manifest
from streamproc.core.events import RequestState
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from tests.integration.pipeline import WorkerProcess, chat_request, produce, produce_requests, start_mock, worker_env
from tests.integration.test_operations import batch_file, read_jsonl

pytestmark = pytest.mark.integration

COUNT = 30
CUSTOM_IDS = sorted(f"c-{i}" for i in range(COUNT))


def namespace_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a deployment named only by its topic prefix: STREAMPROC_APP_ID unset, derived."""
    env = worker_env(settings, "", settings.data_dir, **extra)
    del env["STREAMPROC_APP_ID"]
    return env


def command(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "streamproc", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamproc", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def status(env: dict[str, str], batch_id: str) -> dict[str, Any]:
    done = run(env, "status", "--batch-id", batch_id, "--json")
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def wait_converged(env: dict[str, str], batch_ids: list[str], timeout_s: float,
                   workers: list[WorkerProcess]) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    latest: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline and all(worker.alive() for worker in workers):
        latest = {batch_id: status(env, batch_id) for batch_id in batch_ids}
        if all(document["converged"] for document in latest.values()):
            return latest
        time.sleep(1)
    logs = "\n".join(worker.log_tail() for worker in workers)
    raise AssertionError(f"not converged: {latest}\n{logs}")


def exported_ids(env: dict[str, str], batch_id: str, tmp_path: Path) -> tuple[list[str], list[str]]:
    """custom_ids of the output lines, and the line ids, of one batch's export."""
    output, errors = tmp_path / f"{batch_id}.out.jsonl", tmp_path / f"{batch_id}.err.jsonl"
    done = run(env, "results", "--batch-id", batch_id, "--output", str(output), "--errors", str(errors))
    assert done.returncode == 0, done.stderr
    lines = read_jsonl(output) + read_jsonl(errors)
    return sorted(line["custom_id"] for line in lines), [line["id"] for line in lines]


def submit_all(env: dict[str, str], path: Path, batch_ids: list[str]) -> None:
    """Submit one file under several batch ids at the same time."""
    running = [command(env, "submit", str(path), "--batch-id", batch_id) for batch_id in batch_ids]
    for process in running:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr


def test_batches_reusing_custom_ids_converge_one_after_the_other_and_at_the_same_time(
    settings: Settings, tmp_path: Path
) -> None:
    mock = start_mock("clean", 3, "--latency", "0.05")
    env = worker_env(settings, mock.url, tmp_path / "cli", stall_after_s="3")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    worker.start()
    path = batch_file(tmp_path / "in.jsonl", COUNT)
    try:
        submit_all(env, path, ["first"])
        wait_converged(env, ["first"], 120, [worker])
        submit_all(env, path, ["second", "third"])
        final = wait_converged(env, ["first", "second", "third"], 120, [worker])
        calls = mock.stats(detail=True)["per_request_id"]
    finally:
        worker.stop()
        mock.stop()
    line_ids: set[str] = set()
    for batch_id in ("first", "second", "third"):
        assert final[batch_id]["succeeded"] == COUNT and final[batch_id]["stalled"] is None, final
        custom_ids, ids = exported_ids(env, batch_id, tmp_path)
        assert custom_ids == CUSTOM_IDS  # one line per custom_id, the user's own
        line_ids.update(ids)
        # each batch's request was called itself (not skipped as a duplicate of an earlier batch's)
        uncalled = [c for c in CUSTOM_IDS if calls.get(f"{batch_id}/{c}", {}).get("calls", 0) < 1]
        assert not uncalled, (batch_id, uncalled)
    assert len(line_ids) == 3 * COUNT  # a line id names (batch, custom_id)
    listed = run(env, "batches", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)["data"]}
    assert sorted(rows) == ["first", "second", "third"]
    assert all(row["status"] == "completed" and row["request_counts"] == {"total": COUNT, "completed": COUNT,
                                                                          "failed": 0} for row in rows.values())
    assert rows["first"]["created_at"] <= rows["second"]["created_at"]
    table = run(env, "batches").stdout.splitlines()
    assert table[0].split() == ["BATCH", "CREATED", "STATUS", "TENANT", "PRIORITY", "TOTAL", "SUCCEEDED", "FAILED",
                                "WAITING", "SPEND"]
    assert len(table) == 4


def test_ids_without_batch_scope_still_read_and_their_skipped_duplicates_are_named(
    settings: Settings, tmp_path: Path
) -> None:
    """Requests keyed by the bare custom_id (as written before ids were scoped, or by another producer) still
    converge and export; a second batch reusing those ids is skipped as duplicates, and status says so."""
    assert settings.kafka_bootstrap is not None
    mock = start_mock("clean", 4, "--latency", "0.05")
    env = worker_env(settings, mock.url, tmp_path / "cli", stall_after_s="3")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    worker.start()

    def legacy_batch(batch_id: str) -> None:
        requests = [chat_request(f"dup-{i}", i, batch_id=batch_id) for i in range(5)]
        asyncio.run(produce_requests(str(settings.kafka_bootstrap), settings, requests))
        manifest = BatchManifest(batch_id, len(requests), int(time.time() * 1000), "test")
        asyncio.run(produce(str(settings.kafka_bootstrap), settings.topology().batches,
                            [(batch_id.encode(), encode_manifest(manifest))]))

    try:
        legacy_batch("old-style")
        wait_converged(env, ["old-style"], 120, [worker])
        legacy_batch("reused")
        deadline = time.monotonic() + 60  # "queued" until the worker committed past the skipped records
        while ((current := status(env, "reused"))["stalled"] or {}).get("reasons") != {"duplicate": 5}:
            assert time.monotonic() < deadline, current
            time.sleep(1)
        human = run(env, "status", "--batch-id", "reused")
    finally:
        worker.stop()
        mock.stop()
    assert exported_ids(env, "old-style", tmp_path)[0] == sorted(f"dup-{i}" for i in range(5))
    assert current["pending"] == 5 and not current["converged"]
    assert "5 skipped as duplicates" in human.stdout, human.stdout


def test_two_deployments_with_other_prefixes_share_nothing(settings: Settings, tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    deployments = {name: Settings(kafka_bootstrap=settings.kafka_bootstrap, data_dir=tmp_path / name,
                                  retry_tiers=settings.retry_tiers, topic_prefix=f"{settings.topic_prefix}-{name}")
                   for name in ("alpha", "beta")}
    assert {d.app_id for d in deployments.values()} == {f"{d.topic_prefix}.streamproc" for d in deployments.values()}
    mock = start_mock("clean", 5, "--latency", "0.05")
    envs = {name: namespace_env(d, llm_base_url=mock.url) for name, d in deployments.items()}
    workers = {name: WorkerProcess(envs[name], tmp_path / f"{name}.log") for name in deployments}
    path = batch_file(tmp_path / "in.jsonl", COUNT)
    for worker in workers.values():
        worker.start()
    try:
        running = [command(envs[name], "submit", str(path), "--batch-id", f"batch-{name}") for name in deployments]
        for process in running:
            _, stderr = process.communicate(timeout=120)
            assert process.returncode == 0, stderr
        for name in deployments:
            wait_converged(envs[name], [f"batch-{name}"], 120, [workers[name]])
    finally:
        for worker in workers.values():
            worker.stop()
        mock.stop()
    for name, deployment in deployments.items():
        other = next(n for n in deployments if n != name)
        assert exported_ids(envs[name], f"batch-{name}", tmp_path)[0] == CUSTOM_IDS
        unknown = run(envs[name], "status", "--batch-id", f"batch-{other}")
        assert unknown.returncode != 0 and "no batch" in unknown.stderr  # nor its manifest nor its state
        states = asyncio.run(changelog_batches(deployment))
        assert states == {f"batch-{name}": COUNT}, states
        topics = asyncio.run(committed_topics(deployment))
        assert topics and all(topic.startswith(f"{deployment.topic_prefix}.") for topic in topics), topics
        assert (deployment.data_dir / "faust" / deployment.app_id).is_dir()


async def changelog_batches(settings: Settings) -> dict[str | None, int]:
    """Request ids per batch in a deployment's state changelog."""
    assert settings.kafka_bootstrap is not None
    ids: dict[str | None, set[str]] = {}
    kafka = KafkaConnection(bootstrap=settings.kafka_bootstrap)
    async with TopicReader(kafka, [settings.topology().state_changelog]) as reader:
        for record in await reader.read_to_end():
            if record.value:
                state = codec.decode(record.value, RequestState)
                ids.setdefault(state.batch_id, set()).add(state.request_id)
    return {batch_id: len(request_ids) for batch_id, request_ids in ids.items()}


async def committed_topics(settings: Settings) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        return {tp.topic for tp in await admin.list_consumer_group_offsets(settings.app_id)}
    finally:
        await admin.close()


def test_a_batch_nobody_consumes_says_so_in_status_and_run(settings: Settings, tmp_path: Path) -> None:
    deployment = Settings(kafka_bootstrap=settings.kafka_bootstrap, data_dir=tmp_path / "d",
                          retry_tiers=settings.retry_tiers, topic_prefix=settings.topic_prefix)
    env = namespace_env(deployment, stall_after_s="2", llm_base_url="http://127.0.0.1:9/v1")
    path = batch_file(tmp_path / "in.jsonl", 10)
    assert run(env, "submit", str(path), "--batch-id", "alone").returncode == 0
    time.sleep(2.5)
    current = status(env, "alone")
    assert {"batch_id", "submitted", "succeeded", "failed", "retrying", "in_flight", "pending",
            "converged"} < set(current)  # the keys status always had stay
    assert current["pending"] == 10 and current["stalled"]["reasons"] == {"no_worker": 10}, current
    assert current["stalled"]["group"] == deployment.app_id

    started = time.monotonic()
    waited = run(env, "run", str(path), "--output", str(tmp_path / "out.jsonl"), "--batch-id", "run-alone",
                 "--workers", "0", "--timeout", "20")
    assert waited.returncode != 0
    lines = waited.stderr.splitlines()
    told = [line for line in lines if line.startswith("batch run-alone: no request ended for")]
    assert told and "10 with no worker consuming" in told[0], waited.stderr
    assert "did not converge within 20s" in waited.stderr and "no worker consuming" in lines[-1], waited.stderr
    assert time.monotonic() - started < 60


def test_a_derived_namespace_refuses_the_work_of_the_legacy_shared_group(settings: Settings, tmp_path: Path) -> None:
    """A deployment that ran with a prefix and no app id consumed in the shared group ``streamproc``; started
    under its derived namespace it would call everything again, so submit (and the worker) refuse."""
    deployment = Settings(kafka_bootstrap=settings.kafka_bootstrap, data_dir=tmp_path / "d",
                          retry_tiers=settings.retry_tiers, topic_prefix=settings.topic_prefix)
    asyncio.run(produce_requests(str(settings.kafka_bootstrap), settings, [chat_request("x", 1)]))
    asyncio.run(commit_as_legacy_group(str(settings.kafka_bootstrap), deployment.topology().requests))
    env = namespace_env(deployment)
    path = batch_file(tmp_path / "in.jsonl", 2)
    refused = run(env, "submit", str(path), "--batch-id", "b")
    assert refused.returncode != 0
    assert "consumed by the shared consumer group 'streamproc'" in refused.stderr, refused.stderr
    assert "Set STREAMPROC_APP_ID=streamproc" in refused.stderr
    kept = run({**env, "STREAMPROC_APP_ID": "streamproc"}, "submit", str(path), "--batch-id", "b")
    assert kept.returncode == 0, kept.stderr


async def commit_as_legacy_group(bootstrap: str, topic: str) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id="streamproc", enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.commit({partition: 0})
    finally:
        await consumer.stop()


@pytest.fixture(autouse=True)
def _no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The helpers build each process's environment; nothing from the shell may leak into Settings() here."""
    for key in list(os.environ):
        if key.startswith("STREAMPROC_") and key != "STREAMPROC_KAFKA_BOOTSTRAP":
            monkeypatch.delenv(key)
