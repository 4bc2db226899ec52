"""The pipeline end to end: real broker, mock LLM server over HTTP, worker processes."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest

from streamproc import codec
from streamproc.core.events import InferenceResult
from streamproc.core.vocabulary import FailureLayer
from streamproc.devstack.broker import free_port
from streamproc.mockllm.content_key import request_fingerprint
from streamproc.settings import Settings
from tests.integration.pipeline import (
    MockServer,
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce,
    produce_requests,
    scrape_gauge,
    start_mock,
    wait_caught_up,
    worker_env,
)

pytestmark = pytest.mark.integration


async def test_clean_batch_all_succeed(settings: Settings, clean_mock: MockServer, tmp_path: Path) -> None:
    worker = WorkerProcess(worker_env(settings, clean_mock.url, tmp_path / "w1", llm_hedge_ratio="0"),  # counts calls
                           tmp_path / "worker.log")
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
    port = free_port()
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", worker_metrics_port=str(port)),
                           tmp_path / "worker.log")
    worker.start()
    requests = [chat_request(f"r-{i}", i, json_schema=i % 3 == 0) for i in range(2000)]
    ids = [r.request_id for r in requests]
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 300, worker)
        stats = mock.stats(detail=True)
        hedged = scrape_gauge(port, "streamproc_hedged_calls_total")
        resent = scrape_gauge(port, "streamproc_rate_limited_resends_total")
    finally:
        worker.stop()
        mock.stop()

    assert not outcomes.unfinished(ids), worker.log_tail()
    calls = {request_id: entry["calls"] for request_id, entry in stats["per_request_id"].items()}
    by_id = {r.request_id: r for r in requests}
    terminal_layers: Counter[str] = Counter()
    extra_calls = 0
    for request_id in ids:
        results, terminal = outcomes.results.get(request_id, []), outcomes.terminal(request_id)
        events = outcomes.failures.get(request_id, [])
        extra = calls.get(request_id, 0) - len(results) - len(events)  # hedges: a second copy of a slow call
        assert extra >= 0, (request_id, calls.get(request_id), events)  # every outcome came from a call
        extra_calls += extra
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
                assert calls.get(request_id, 0) - extra <= terminal[0].attempt, (request_id, calls.get(request_id))
        # three semantic attempts, or three cut answers given more room and then a fourth failure (design §5.4)
        assert sum(1 for f in events if f.layer is FailureLayer.SEMANTIC) <= 4, request_id
        # every attempt before the last was recorded as a non-terminal failure on its layer
        assert all(not f.terminal for f in outcomes.failures.get(request_id, []) if f not in terminal)
    # every call the server saw is accounted for by exactly one result or failure event, or is a hedge (a hedge
    # cancelled because the first copy answered meanwhile may never reach the server), or was sent again in place
    # after a 429 (design §5.5)
    assert hedged is not None and resent is not None and extra_calls <= hedged + resent, (extra_calls, hedged, resent)
    assert hedged <= 0.03 * len(ids) + 5  # hedges are rationed (STREAMPROC_LLM_HEDGE_RATIO)
    succeeded = sum(1 for i in ids if outcomes.results.get(i))
    assert succeeded >= 0.95 * len(ids), (succeeded, terminal_layers)
    assert terminal_layers["business"] > 0  # the profile's business faults really reached the pipeline
    assert stats["request_ids"]["repeated_after_business_failure"] == 0


async def test_duplicate_submissions_call_the_llm_once(settings: Settings, tmp_path: Path) -> None:
    """The same ids and bodies submitted again while in flight, and again after success: one call each."""
    mock = start_mock("clean", 3, "--latency", "1.5")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    worker.start()
    requests = [chat_request(f"d-{i}", i) for i in range(100)]
    ids = [r.request_id for r in requests]
    assert settings.kafka_bootstrap is not None
    try:
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        await wait_for_calls(mock, 50)
        await produce_requests(settings.kafka_bootstrap, settings, requests)  # while in flight
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            await reader.wait_until_ended(ids, 120, worker)
            await produce_requests(settings.kafka_bootstrap, settings, requests)  # after success
            await wait_caught_up(settings.kafka_bootstrap, settings, f"{settings.topic_prefix}.requests", 60)
            outcomes = await reader.wait_until_ended(ids, 5, worker)
        stats = mock.stats()
    finally:
        worker.stop()
        mock.stop()
    assert stats["calls"] == 100
    assert stats["request_ids"]["max_calls"] == 1
    assert all(len(outcomes.results[i]) == 1 for i in ids)
    assert not outcomes.failures


async def wait_for_calls(mock: MockServer, calls: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while mock.stats()["calls"] < calls:
        assert time.monotonic() < deadline, f"fewer than {calls} calls within {timeout_s}s"
        await asyncio.sleep(0.1)


async def test_poison_records_become_precise_failures(settings: Settings, clean_mock: MockServer,
                                                      tmp_path: Path) -> None:
    """Random bytes, a wrong schema, a JSON request submit would refuse: each becomes a business failure naming
    the record (or a dead letter when no request id can be read), and the valid requests around them succeed."""
    assert settings.kafka_bootstrap is not None
    valid = [chat_request(f"v-{i}", i) for i in range(20)]
    wrong_schema = codec.encode(InferenceResult("p-2", None, "m", "{}", "x", 1, 1, 1, "h"))
    poison: list[tuple[bytes | None, bytes | None]] = [
        (b"p-1", b"\x7f" + os.urandom(63)),  # 0x7f: no framing (random bytes could start like one)
        (b"p-2", wrong_schema),
        (b"p-3", json.dumps({"custom_id": "p-3", "body": {}}).encode()),
        (None, b"\x7f" + os.urandom(31)),
    ]
    await produce_requests(settings.kafka_bootstrap, settings, valid[:10])
    await produce(settings.kafka_bootstrap, f"{settings.topic_prefix}.requests", poison)
    await produce_requests(settings.kafka_bootstrap, settings, valid[10:])
    worker = WorkerProcess(worker_env(settings, clean_mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    worker.start()
    try:
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended([*(r.request_id for r in valid), "p-1", "p-2", "p-3"],
                                                     120, worker)
            while outcomes.dead_letters < 1 and worker.alive():
                await reader.poll()
    finally:
        worker.stop()
    assert all(len(outcomes.results[r.request_id]) == 1 for r in valid), worker.log_tail()
    for request_id, code, reason in (("p-1", "undecodable_record", "unknown framing"),
                                     ("p-2", "undecodable_record", "InferenceResult"),
                                     ("p-3", "invalid_json_request", "missing method (only POST is supported)")):
        (failure,) = outcomes.terminal(request_id)
        assert failure.layer is FailureLayer.BUSINESS and failure.error_code == code
        assert f"{settings.topic_prefix}.requests[" in failure.message and "]@" in failure.message
        assert reason.lower() in failure.message.lower(), failure.message
        assert failure.request.metadata["raw_value_base64"]  # the bad record is kept
    assert outcomes.dead_letters == 1
    assert clean_mock.stats()["calls"] == len(valid)


async def test_a_wrong_api_key_stops_the_worker_without_burning_requests(settings: Settings,
                                                                        tmp_path: Path) -> None:
    """401 is a configuration problem: the worker exits with code 3 and says what to fix; no failure records;
    after the fix, the held requests are processed."""
    mock = start_mock("clean", 5, "--api-key", "right-key")
    requests = [chat_request(f"a-{i}", i) for i in range(30)]
    ids = [r.request_id for r in requests]
    assert settings.kafka_bootstrap is not None
    try:
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        wrong = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", llm_api_key="wrong-key"),
                              tmp_path / "wrong.log")
        wrong.start()
        assert wrong.process is not None
        assert wrong.process.wait(120) == 3, wrong.log_tail()
        log = wrong.log_path.read_text()
        assert "STOPPING" in log and "STREAMPROC_LLM_API_KEY" in log
        right = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", llm_api_key="right-key"),
                              tmp_path / "right.log")
        right.start()
        try:
            async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
                outcomes = await reader.wait_until_ended(ids, 120, right)
        finally:
            right.stop()
    finally:
        mock.stop()
    assert not outcomes.failures
    assert all(len(outcomes.results[i]) == 1 for i in ids), right.log_tail()
