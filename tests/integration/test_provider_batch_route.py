"""The provider-batch route on the real broker and the real mock (issue 31): a routed model's requests go through
OpenAI's Files and Batch API (no synchronous call), each ends in exactly one place, and a worker SIGKILLed while its
provider batches are open is replaced by one that takes them over without creating any of them again, nor answering
again a member whose outcome the killed worker wrote."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from streamproc import codec
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.vocabulary import FailureLayer
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


async def test_a_rebalance_hands_open_batches_to_the_new_owner_without_creating_them_again(
        settings: Settings, tmp_path: Path) -> None:
    """A second worker joins while every request waits in an open provider batch: the first gives up the batches
    of the partitions it loses (their waiting calls cancelled, records unacked), the second takes them over."""
    mock = start_mock("clean", 5, "--batch-seconds", "15")
    first = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", **ROUTED), tmp_path / "first.log")
    second = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w2", **ROUTED), tmp_path / "second.log")
    requests = [chat_request(f"moved-{i}", i) for i in range(120)]
    ids = [r.request_id for r in requests]
    first.start()
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        records = await wait_all_open(settings, len(ids), first)
        second.start()
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 180, second)
            await asyncio.sleep(3)  # a line answered twice would come now
            outcomes = await reader.wait_until_ended(ids, 10, second)
        stats = mock.stats(detail=True)
        left = await batch_records(settings)
        assert first.alive() and second.alive(), first.log_tail() + second.log_tail()
    finally:
        second.stop()
        first.stop()
        mock.stop()

    assert outcomes.unfinished(ids) == [], second.log_tail()
    assert ended_once(outcomes, ids) == []
    assert all(outcomes.results.get(i) for i in ids)
    assert stats["batches"]["openai"]["created"] == len(records)  # none created again
    assert synchronous_calls(stats) == 0
    moved = {r.partition for r in records.values()}
    assert "taking over provider batch" in second.log_path.read_text() or len(moved) == 1, moved
    assert left == {}

def _written_result(request: InferenceRequest) -> InferenceResult:
    return InferenceResult(request_id=request.request_id, batch_id=request.batch_id, model="mock-small",
                           response_json='{"usage": {"prompt_tokens": 7, "completion_tokens": 2}}',
                           content="written before the kill", attempts=1, latency_ms=1, completed_ms=1,
                           input_hash="h")


def _written_refusal(request: InferenceRequest) -> FailureEvent:
    return FailureEvent(request=request, layer=FailureLayer.BUSINESS, error_code="invalid_request",
                        message="written before the kill", attempt=1, terminal=True, first_failure_ms=1,
                        last_failure_ms=1, http_status=400)


async def test_members_whose_outcome_the_killed_worker_wrote_are_not_answered_again(settings: Settings,
                                                                                    tmp_path: Path) -> None:
    """The batch-wide crash window (design §8): the killed worker wrote some members' outcomes (here written for
    it, after the kill, as its last writes would be) but not their states nor the batch's end. The next owner
    polls the same batch; those members end from what was written, and only the others get their lines."""
    mock = start_mock("clean", 5, "--batch-seconds", "10")
    first = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", **ROUTED), tmp_path / "first.log")
    second = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w2", **ROUTED), tmp_path / "second.log")
    requests = [chat_request(f"window-{i}", i) for i in range(60)]
    ids = [r.request_id for r in requests]
    answered, refused = requests[:10], requests[10:15]
    first.start()
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        records = await wait_all_open(settings, len(ids), first)
        first.signal(signal.SIGKILL)
        first.process.wait(10)  # type: ignore[union-attr]
        topology = settings.topology()
        await produce(settings.kafka_bootstrap, topology.results,
                      ((r.request_id.encode(), codec.encode(_written_result(r))) for r in answered))
        await produce(settings.kafka_bootstrap, topology.failed(FailureLayer.BUSINESS),
                      ((r.request_id.encode(), codec.encode(_written_refusal(r))) for r in refused))
        second.start()
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 180, second)
            await asyncio.sleep(3)  # a line answered again would come now
            outcomes = await reader.wait_until_ended(ids, 10, second)
        stats = mock.stats(detail=True)
        left = await batch_records(settings)
    finally:
        second.stop()
        first.stop()
        mock.stop()

    assert outcomes.unfinished(ids) == [], second.log_tail()
    assert ended_once(outcomes, ids) == []  # no member ended twice
    assert all(outcomes.results[r.request_id][0].content == "written before the kill" for r in answered)
    assert all(not outcomes.results.get(r.request_id) for r in refused)
    assert all(outcomes.results.get(i) for i in ids[15:])  # the others got their lines
    assert stats["batches"]["openai"]["created"] == len(records)  # none created again
    assert synchronous_calls(stats) == 0
    assert left == {}
