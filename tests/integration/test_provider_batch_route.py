"""The provider-batch route on the real broker and the real mock (issue 31): a routed model's requests go through
OpenAI's Files and Batch API (no synchronous call), each ends in exactly one place, and a worker SIGKILLed while its
provider batches are open is replaced by one that takes them over without creating any of them again."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from streamproc.settings import Settings
from tests.integration.pipeline import (
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce_requests,
    start_mock,
    worker_env,
)
from tests.integration.provider_batch_rig import (
    ROUTED,
    batch_records,
    ended_once,
    synchronous_calls,
    wait_all_open,
)

pytestmark = pytest.mark.integration

async def test_routed_requests_end_once_through_provider_batches(settings: Settings, tmp_path: Path) -> None:
    mock = start_mock("realistic", 11)
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", **ROUTED), tmp_path / "worker.log")
    requests = [chat_request(f"pb-{i}", i) for i in range(300)]
    ids = [r.request_id for r in requests]
    worker.start()
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 180, worker)
        stats = mock.stats(detail=True)
        await asyncio.sleep(1)
        left = await batch_records(settings)
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()
        mock.stop()

    assert outcomes.unfinished(ids) == [], worker.log_tail()
    assert ended_once(outcomes, ids) == []
    assert sum(1 for i in ids if outcomes.results.get(i)) >= 250  # realistic faults: most answer, the rest retried
    batches = stats["batches"]["openai"]
    assert batches["created"] >= 2 and batches["lines_answered"] >= len(ids)  # gathered, and failed lines again
    assert synchronous_calls(stats) == 0  # no request went by a call of its own
    retried = [i for i in ids if outcomes.failures.get(i) and outcomes.results.get(i)]
    assert retried, "the realistic profile fails some lines; they come back through the retry tiers"
    assert left == {}  # every record ended and tombstoned


async def test_a_killed_workers_open_batches_are_taken_over_not_created_again(settings: Settings,
                                                                              tmp_path: Path) -> None:
    mock = start_mock("clean", 5, "--batch-seconds", "15")
    env = worker_env(settings, mock.url, tmp_path / "w1", **ROUTED)
    first = WorkerProcess(env, tmp_path / "first.log")
    second = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w2", **ROUTED), tmp_path / "second.log")
    requests = [chat_request(f"kill-{i}", i) for i in range(120)]
    ids = [r.request_id for r in requests]
    first.start()
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        records = await wait_all_open(settings, len(ids), first)  # every request a member of an open batch
        created_before_kill = mock.stats()["batches"]["openai"]["created"]
        first.signal(signal.SIGKILL)
        first.process.wait(10)  # type: ignore[union-attr]
        second.start()
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 180, second)
        stats = mock.stats(detail=True)
        await asyncio.sleep(1)
        left = await batch_records(settings)
    finally:
        second.stop()
        first.stop()
        mock.stop()

    assert outcomes.unfinished(ids) == [], second.log_tail()
    assert ended_once(outcomes, ids) == []
    assert all(outcomes.results.get(i) for i in ids)  # the clean profile answers every line
    assert stats["batches"]["openai"]["created"] == created_before_kill == len(records)  # none created twice
    assert synchronous_calls(stats) == 0
    assert "taking over provider batch" in second.log_path.read_text()
    assert left == {}
