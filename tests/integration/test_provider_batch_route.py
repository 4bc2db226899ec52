"""The provider-batch route on the real broker and the real mock (issue 31): a routed model's requests go through
OpenAI's Files and Batch API (no synchronous call), each ends in exactly one place, and a worker SIGKILLed while its
provider batches are open is replaced by one that takes them over without creating any of them again, nor answering
again a member whose outcome the killed worker wrote."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from streamproc import codec
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.provider_batch_takeover import ProviderBatchRecord
from streamproc.core.vocabulary import FailureLayer
from streamproc.settings import Settings
from tests.integration.pipeline import (
    MockServer,
    OutcomeReader,
    Outcomes,
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


@dataclass
class _AllOpen:
    """A mock, a first worker holding every request in open provider batches, and a second one not started."""

    mock: MockServer
    first: WorkerProcess
    second: WorkerProcess
    requests: list[InferenceRequest]
    records: dict[str, ProviderBatchRecord]

    @property
    def ids(self) -> list[str]:
        return [r.request_id for r in self.requests]

    def kill_first(self) -> None:
        self.first.signal(signal.SIGKILL)
        self.first.process.wait(10)  # type: ignore[union-attr]


@asynccontextmanager
async def _all_open(settings: Settings, tmp_path: Path, prefix: str, count: int,
                    batch_seconds: int) -> AsyncIterator[_AllOpen]:
    mock = start_mock("clean", 5, "--batch-seconds", str(batch_seconds))
    first = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", **ROUTED), tmp_path / "first.log")
    second = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w2", **ROUTED), tmp_path / "second.log")
    requests = [chat_request(f"{prefix}-{i}", i) for i in range(count)]
    first.start()
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        records = await wait_all_open(settings, count, first)  # every request a member of an open batch
        yield _AllOpen(mock, first, second, requests, records)
    finally:
        second.stop()
        first.stop()
        mock.stop()


async def _settled_outcomes(settings: Settings, ids: list[str], worker: WorkerProcess) -> Outcomes:
    """Every request's outcome, read again a few seconds after the last: a line answered twice would come then."""
    assert settings.kafka_bootstrap is not None
    async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
        await reader.wait_until_ended(ids, 180, worker)
        await asyncio.sleep(3)
        return await reader.wait_until_ended(ids, 10, worker)


def _assert_each_ended_once_none_created_again(run: _AllOpen, outcomes: Outcomes, stats: dict[str, Any],
                                               left: dict[str, ProviderBatchRecord]) -> None:
    assert outcomes.unfinished(run.ids) == [], run.second.log_tail()
    assert ended_once(outcomes, run.ids) == []
    assert stats["batches"]["openai"]["created"] == len(run.records)  # none created again
    assert synchronous_calls(stats) == 0
    assert left == {}  # every record ended and tombstoned


async def test_a_killed_workers_open_batches_are_taken_over_not_created_again(settings: Settings,
                                                                              tmp_path: Path) -> None:
    async with _all_open(settings, tmp_path, "kill", 120, batch_seconds=15) as run:
        created_before_kill = run.mock.stats()["batches"]["openai"]["created"]
        run.kill_first()
        run.second.start()
        outcomes = await _settled_outcomes(settings, run.ids, run.second)
        stats = run.mock.stats(detail=True)
        left = await batch_records(settings)

    _assert_each_ended_once_none_created_again(run, outcomes, stats, left)
    assert all(outcomes.results.get(i) for i in run.ids)  # the clean profile answers every line
    assert created_before_kill == len(run.records)
    assert "taking over provider batch" in run.second.log_path.read_text()


async def test_a_rebalance_hands_open_batches_to_the_new_owner_without_creating_them_again(
        settings: Settings, tmp_path: Path) -> None:
    """A second worker joins while every request waits in an open provider batch: the first's waiting calls give
    way (parked, ``rebalancing``) and it stops following; the owners after the rebalance take the batches over.
    The batches stay open 45 s: on a loaded machine the second worker's start and join took longer than 15 s, the
    first ended every batch itself and nothing was left to take over."""
    async with _all_open(settings, tmp_path, "moved", 120, batch_seconds=45) as run:
        run.second.start()
        outcomes = await _settled_outcomes(settings, run.ids, run.second)
        stats = run.mock.stats(detail=True)
        left = await batch_records(settings)
        assert run.first.alive() and run.second.alive(), run.first.log_tail() + run.second.log_tail()

    _assert_each_ended_once_none_created_again(run, outcomes, stats, left)
    assert all(outcomes.results.get(i) for i in run.ids)
    moved = {r.partition for r in run.records.values()}
    assert "taking over provider batch" in run.second.log_path.read_text() or len(moved) == 1, moved


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
    async with _all_open(settings, tmp_path, "window", 60, batch_seconds=10) as run:
        answered, refused = run.requests[:10], run.requests[10:15]
        run.kill_first()
        assert settings.kafka_bootstrap is not None
        topology = settings.topology()
        await produce(settings.kafka_bootstrap, topology.results,
                      ((r.request_id.encode(), codec.encode(_written_result(r))) for r in answered))
        await produce(settings.kafka_bootstrap, topology.failed(FailureLayer.BUSINESS),
                      ((r.request_id.encode(), codec.encode(_written_refusal(r))) for r in refused))
        run.second.start()
        outcomes = await _settled_outcomes(settings, run.ids, run.second)
        stats = run.mock.stats(detail=True)
        left = await batch_records(settings)

    _assert_each_ended_once_none_created_again(run, outcomes, stats, left)  # no member ended twice
    assert all(outcomes.results[r.request_id][0].content == "written before the kill" for r in answered)
    assert all(not outcomes.results.get(r.request_id) for r in refused)
    assert all(outcomes.results.get(i) for i in run.ids[15:])  # the others got their lines
