"""Fault tests: a worker killed with SIGKILL, a broker restarted, a second worker joining and leaving."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    assert 0 <= duplicated_calls <= in_flight_at_kill
    assert duplicated_results <= in_flight_at_kill
