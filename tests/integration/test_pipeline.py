"""The pipeline end to end: real broker, mock LLM server over HTTP, worker processes."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamproc.layers import FailureLayer
from streamproc.mockllm.identity import request_fingerprint
from streamproc.settings import Settings
from tests.integration.pipeline import (
    MockServer,
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce_requests,
    start_mock,
    worker_env,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def clean_mock() -> Iterator[MockServer]:
    server = start_mock("clean")
    yield server
    server.stop()


async def test_clean_batch_all_succeed(settings: Settings, clean_mock: MockServer, tmp_path: Path) -> None:
    worker = WorkerProcess(worker_env(settings, clean_mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    worker.start()
    try:
        requests = [chat_request(f"r-{i}", i, json_schema=i % 2 == 0) for i in range(200)]
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended([r.request_id for r in requests], 120, worker)
    finally:
        worker.stop()
    assert not outcomes.unfinished(r.request_id for r in requests), worker.log_tail()
    assert all(len(outcomes.results[r.request_id]) == 1 for r in requests)
    assert not outcomes.failures, [(f.request.request_id, f.error_code, f.message)
                                   for events in outcomes.failures.values() for f in events]
    stats = clean_mock.stats()
    assert stats["calls"] == 200


async def test_realistic_batch_converges_exactly_once(settings: Settings, tmp_path: Path) -> None:
    """2,000 requests against the realistic profile: each id ends in exactly one result or one terminal
    failure on exactly one layer; business failures were called once, semantic ones at most 3 times."""
    mock = start_mock("realistic", 11)
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    worker.start()
    requests = [chat_request(f"r-{i}", i, json_schema=i % 3 == 0) for i in range(2000)]
    ids = [r.request_id for r in requests]
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 300, worker)
        stats = mock.stats()
    finally:
        worker.stop()
        mock.stop()

    assert not outcomes.unfinished(ids), worker.log_tail()
    calls = {request_id: entry["calls"] for request_id, entry in stats["per_request_id"].items()}
    by_id = {r.request_id: r for r in requests}
    terminal_layers: Counter[str] = Counter()
    for request_id in ids:
        results, terminal = outcomes.results.get(request_id, []), outcomes.terminal(request_id)
        assert len(results) + len(terminal) == 1, (request_id, results, terminal)
        if results:
            result = results[0]
            assert result.request_id == request_id and result.batch_id == "b1"
            if not any(f.layer is FailureLayer.SEMANTIC for f in outcomes.failures.get(request_id, [])):
                body = json.loads(by_id[request_id].body_json)
                assert request_fingerprint(body) in result.content, (request_id, result.content)
        else:
            layer = terminal[0].layer
            terminal_layers[layer.value] += 1
            if layer is FailureLayer.BUSINESS:  # never called again after a business failure
                assert calls.get(request_id, 0) <= terminal[0].attempt, (request_id, calls.get(request_id))
        events = outcomes.failures.get(request_id, [])
        assert sum(1 for f in events if f.layer is FailureLayer.SEMANTIC) <= 3, request_id
        # every call the server saw is accounted for by exactly one result or failure event
        assert calls.get(request_id, 0) == len(results) + len(events), (request_id, calls.get(request_id), events)
        # every attempt before the last was recorded as a non-terminal failure on its layer
        assert all(not f.terminal for f in outcomes.failures.get(request_id, []) if f not in terminal)
    succeeded = sum(1 for i in ids if outcomes.results.get(i))
    assert succeeded >= 0.95 * len(ids), (succeeded, terminal_layers)
    assert terminal_layers["business"] > 0  # the profile's business faults really reached the pipeline
    assert stats["request_ids"]["repeated_after_business_failure"] == 0
