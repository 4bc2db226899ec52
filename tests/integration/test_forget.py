"""``streamproc forget`` end to end: a finished batch's states leave the changelog and the workers' disks (a restart
on the same disk and a restore from scratch hold none of them), status says forgotten, its export is untouched, and
a request of it that arrives again is refused with the reason."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from rocksdict import AccessType, Rdict

from streamproc.app.bootstrap import resolve_connection
from streamproc.app.summary_reader import read_summaries
from streamproc.app.topic_reader import TopicReader
from streamproc.app.topics import STATE_CHANGELOG, ensure_topics
from streamproc.codec.manifest import BatchManifest, encode_manifest
from streamproc.core.batch_summary import SummaryView
from streamproc.devstack.chaos.tally import counts_of
from streamproc.settings import Settings
from tests.integration.pipeline import (
    OutcomeReader,
    Outcomes,
    WorkerProcess,
    chat_request,
    produce,
    produce_requests,
    start_mock,
    worker_env,
)
from tests.integration.test_operations import batch_file, cli, status_of, wait_converged

pytestmark = pytest.mark.integration

PURGE_WAIT_S = 8  # a worker purges forgotten batches every 5 s
LIVE_IDS = sorted(f"live/c-{i}" for i in range(10))
# the deployment's changelog settings, hours made seconds: tombstones leave the log while the test waits
SHORTENED_CHANGELOG = {**STATE_CHANGELOG, "segment.ms": "1000", "max.compaction.lag.ms": "1000",
                       "delete.retention.ms": "2000"}


def stored_ids(data_dir: Path) -> list[str]:
    """The request ids in a stopped worker's state table (every partition's RocksDB on its disk)."""
    ids = []
    for path in sorted(data_dir.glob("faust/*/v1/tables/request_state-*.db")):
        db = Rdict(str(path), access_type=AccessType.read_only())
        try:
            ids += [key.decode() for key in db.keys() if isinstance(key, bytes) and not key.startswith(b"__faust")]  # noqa: SIM118
        finally:
            db.close()
    return sorted(ids)


def test_a_forgotten_batch_leaves_the_state_and_its_requests_are_refused(settings: Settings, tmp_path: Path) -> None:
    assert cli(settings, "submit", str(batch_file(tmp_path / "old.jsonl", 30)), "--batch-id", "old").returncode == 0
    assert cli(settings, "submit", str(batch_file(tmp_path / "live.jsonl", 10)), "--batch-id", "live").returncode == 0
    mock = start_mock("clean", 5)
    disk = tmp_path / "w1"
    worker = WorkerProcess(worker_env(settings, mock.url, disk), tmp_path / "worker.log")
    worker.start()
    try:
        wait_converged(settings, "old", 120, worker)
        wait_converged(settings, "live", 120, worker)
        unknown = cli(settings, "forget", "--batch-id", "never-submitted")
        forgotten = cli(settings, "forget", "--batch-id", "old", "--json")
        time.sleep(PURGE_WAIT_S)
    finally:
        worker.stop()
    assert unknown.returncode == 2 and "no batch 'never-submitted' here" in unknown.stderr, unknown.stderr
    assert forgotten.returncode == 0, forgotten.stderr
    [outcome] = json.loads(forgotten.stdout)
    assert (outcome["batch_id"], outcome["forgotten"], outcome["states_removed"]) == ("old", True, 30)
    assert stored_ids(disk) == LIVE_IDS  # the running worker purged its disk

    restarted = WorkerProcess(worker_env(settings, mock.url, disk), tmp_path / "restarted.log")
    fresh_disk = tmp_path / "w2"
    fresh = WorkerProcess(worker_env(settings, mock.url, fresh_disk), tmp_path / "fresh.log")
    restarted.start()
    fresh.start()  # no disk: it restores its partitions from the changelog
    try:
        calls_before = mock.stats()["calls"]
        again = chat_request("old/c-1", 1, batch_id="old")  # a request of the forgotten batch, sent again
        another = chat_request("old/c-2", 2, batch_id="old")
        asyncio.run(produce_requests(str(settings.kafka_bootstrap), settings, [again, another]))
        outcomes = asyncio.run(_refused([again.request_id, another.request_id], settings, restarted, fresh))
        calls_after = mock.stats()["calls"]
        status = status_of(settings, "old")
        live = status_of(settings, "live")
        listed = json.loads(cli(settings, "batches", "--json").stdout)
        listed_verified = json.loads(cli(settings, "batches", "--json", "--verify").stdout)
        live_verified = json.loads(cli(settings, "status", "--batch-id", "live", "--json", "--verify").stdout)
        summarized = asyncio.run(summarized_batches(settings))
        resubmitted = cli(settings, "submit", str(tmp_path / "old.jsonl"), "--batch-id", "old")
        exported = cli(settings, "results", "--batch-id", "old", "--output", str(tmp_path / "out.jsonl"))
        time.sleep(PURGE_WAIT_S)
    finally:
        restarted.stop()
        fresh.stop()
        mock.stop()
    for request_id in (again.request_id, another.request_id):
        [refusal] = outcomes.terminal(request_id)
        assert (refusal.layer.value, refusal.error_code) == ("business", "batch_forgotten")
        assert "batch 'old' was forgotten" in refusal.message
    assert calls_after == calls_before  # refused, never called
    assert (status["status"], status["converged"], status["succeeded"], status["submitted"]) == (
        "forgotten", True, 30, 30), status
    assert status["forgotten_at"] is not None and status["completed_at"] is not None
    assert live["status"] == "completed" and live["succeeded"] == 10
    assert {entry["id"]: entry["status"] for entry in listed["data"]} == {"old": "forgotten", "live": "completed"}
    # the workers' summaries count what the fold of every state counts, and hold nothing of the forgotten batch
    assert listed["data"] == listed_verified["data"]
    assert counts_of(live) == counts_of(live_verified) and live["counted_from"] == "summaries"
    assert live_verified["counted_from"] == "changelog"
    assert set(summarized) == {"live"}, summarized
    assert resubmitted.returncode != 0 and "forgotten since" in resubmitted.stderr, resubmitted.stderr
    assert exported.returncode == 0, exported.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 30  # the results stay on their topic
    restored = stored_ids(disk) + stored_ids(fresh_disk)  # the two workers split the partitions (and standbys)
    assert not [request_id for request_id in restored if request_id.startswith("old/")], restored
    assert set(restored) == set(LIVE_IDS)


async def summarized_batches(settings: Settings) -> set[str]:
    """The batches the summary topic holds counts of (a forgotten batch's keys are tombstoned)."""
    topology = settings.topology()
    view = SummaryView()
    async with TopicReader(resolve_connection(settings), [topology.summaries]) as reader:
        read_summaries(await reader.read_to_end(), topology, view)
    return set(view.batches())


async def _refused(ids: list[str], settings: Settings, *workers: WorkerProcess) -> Outcomes:
    """Everything on the outcome topics once each of ``ids`` has a terminal failure (their results of the first
    run are there already)."""
    deadline = time.monotonic() + 120
    async with OutcomeReader(str(settings.kafka_bootstrap), settings) as reader:
        while time.monotonic() < deadline and all(worker.alive() for worker in workers):
            await reader.poll()
            if all(reader.outcomes.terminal(request_id) for request_id in ids):
                break
        return reader.outcomes


def test_workers_forget_batches_finished_longer_ago_than_the_retention(settings: Settings, tmp_path: Path) -> None:
    """Chosen from the summaries (no fold of the changelog): the finished batch goes, its states leave the disk and,
    through the worker's own tombstones, the changelog; a batch that has not finished stays."""
    assert cli(settings, "submit", str(batch_file(tmp_path / "in.jsonl", 10)), "--batch-id", "brief").returncode == 0
    open_ids = [f"open/c-{i}" for i in range(3)]  # its manifest says 5: two never arrive, so it never finishes
    opened = [chat_request(request_id, i, batch_id="open") for i, request_id in enumerate(open_ids)]
    asyncio.run(produce_requests(str(settings.kafka_bootstrap), settings, opened))
    asyncio.run(produce(str(settings.kafka_bootstrap), settings.topology().batches,
                        [(b"open", encode_manifest(BatchManifest("open", 5, int(time.time() * 1000), "test")))]))
    mock = start_mock("clean", 5)
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", retain_finished="15s"),
                           tmp_path / "worker.log")
    worker.start()
    try:
        finished = wait_converged(settings, "brief", 120, worker)[-1]
        deadline = time.monotonic() + 90  # 15 s after its end, at the next look (every 10 s)
        while (current := status_of(settings, "brief"))["status"] != "forgotten" and time.monotonic() < deadline:
            time.sleep(2)
        time.sleep(PURGE_WAIT_S + 10)  # a purge pass, and another look of retention that must leave "open" alone
        still_open = status_of(settings, "open")
        live = asyncio.run(live_changelog_keys(settings))
    finally:
        worker.stop()
        mock.stop()
    assert current["status"] == "forgotten", worker.log_tail()
    assert current["forgotten_at"] - current["completed_at"] >= 15 and current["succeeded"] == 10
    assert current["completed_at"] == finished["completed_at"]
    assert "automatic retention: forgot batch brief" in worker.log_tail(1_000_000)
    assert "automatic retention: forgot batch open" not in worker.log_tail(1_000_000)
    assert (still_open["status"], still_open["succeeded"], still_open["pending"]) == ("in_progress", 3, 2), still_open
    assert stored_ids(tmp_path / "w1") == open_ids
    assert live == set(open_ids)  # the purge's tombstones took brief's states off the changelog


async def live_changelog_keys(settings: Settings) -> set[str]:
    """The request ids the state changelog still holds a state of (a tombstone takes one out)."""
    live: set[str] = set()
    async with TopicReader(resolve_connection(settings), [settings.topology().state_changelog]) as reader:
        for record in await reader.read_to_end():
            key = bytes(record.key or b"").decode()
            if record.value is None:
                live.discard(key)
            elif not key.startswith("__"):
                live.add(key)
    return live


def test_a_disk_older_than_the_tombstones_does_not_bring_forgotten_states_back(
        settings: Settings, tmp_path: Path) -> None:
    """A worker down while a batch was forgotten, and longer than the broker keeps the tombstones
    (``delete.retention.ms``, here seconds): its restore on its own disk meets no tombstone of the batch, and its
    purge of the partitions it newly owns deletes the states itself (and tombstones them again)."""
    topology = settings.topology()
    asyncio.run(ensure_topics(resolve_connection(settings), {topology.state_changelog: topology.partitions},
                              configs={topology.state_changelog: SHORTENED_CHANGELOG}))
    assert cli(settings, "submit", str(batch_file(tmp_path / "old.jsonl", 30)), "--batch-id", "old").returncode == 0
    assert cli(settings, "submit", str(batch_file(tmp_path / "live.jsonl", 10)), "--batch-id", "live").returncode == 0
    mock = start_mock("clean", 5)
    disk = tmp_path / "w1"
    worker = WorkerProcess(worker_env(settings, mock.url, disk), tmp_path / "worker.log")
    worker.start()
    try:
        wait_converged(settings, "old", 120, worker)
        wait_converged(settings, "live", 120, worker)
    finally:
        worker.stop()  # before the forget: its disk keeps the batch's states, and it never purges them
    forgotten = cli(settings, "forget", "--batch-id", "old")
    assert forgotten.returncode == 0, forgotten.stderr
    left = asyncio.run(compacted_away(settings, "old/", 180))
    assert left == 0, f"{left} records of the batch still on the changelog"
    assert len(stored_ids(disk)) == 40  # the stale disk: the forgotten batch's states, no tombstone left to apply

    restarted = WorkerProcess(worker_env(settings, mock.url, disk), tmp_path / "restarted.log")
    restarted.start()
    try:
        deadline = time.monotonic() + 120
        while "forgotten batches: deleted and tombstoned" not in restarted.log_tail(1_000_000):
            assert time.monotonic() < deadline and restarted.alive(), restarted.log_tail()
            time.sleep(1)
    finally:
        restarted.stop()
        mock.stop()
    assert "forgotten batches: deleted and tombstoned 30 of their states" in restarted.log_tail(1_000_000)
    assert stored_ids(disk) == LIVE_IDS
    assert asyncio.run(live_changelog_keys(settings)) == set(LIVE_IDS)  # nothing of the batch written back


async def compacted_away(settings: Settings, prefix: str, timeout_s: float) -> int:
    """Wait until the state changelog holds no record (value or tombstone) whose key starts with ``prefix``;
    returns how many it still holds at the end. A segment rolls only on an append, so each look appends a
    tombstone of a key no request has to every partition (a running deployment never stops writing)."""
    topology = settings.topology()
    deadline = time.monotonic() + timeout_s
    while True:
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for partition in range(topology.partitions):
                await producer.send_and_wait(topology.state_changelog, None, b"no-such-batch/nudge", partition)
        finally:
            await producer.stop()
        async with TopicReader(resolve_connection(settings), [topology.state_changelog]) as reader:
            left = sum(bytes(record.key or b"").decode().startswith(prefix) for record in await reader.read_to_end())
        if left == 0 or time.monotonic() > deadline:
            return left
        await asyncio.sleep(5)
