"""A model the endpoint does not serve pauses that model, not the worker: the other models' requests go on."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from streamproc.app.worker import records_in_hand
from streamproc.core.events import InferenceRequest
from streamproc.core.vocabulary import FailureLayer
from streamproc.devstack.broker import free_port
from streamproc.settings import Settings
from tests.integration.pipeline import (
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce_requests,
    scrape_gauge,
    start_mock,
    worker_env,
)

pytestmark = pytest.mark.integration


def unknown_model_request(request_id: str) -> InferenceRequest:
    body = {"model": "no-such-model", "max_tokens": 16, "messages": [{"role": "user", "content": request_id}]}
    return InferenceRequest(request_id, json.dumps(body), batch_id="b1", submitted_ms=int(time.time() * 1000))


async def test_an_unknown_model_is_paused_while_the_known_one_finishes(settings: Settings, tmp_path: Path) -> None:
    mock = start_mock("clean", 3)
    port = free_port()
    in_flight = 4
    env = worker_env(settings, mock.url, tmp_path / "w1", worker_metrics_port=str(port), in_flight=str(in_flight),
                     adaptive_initial_in_flight="1")
    worker = WorkerProcess(env, tmp_path / "worker.log")
    good = [chat_request(f"good-{i}", i) for i in range(40)]
    bad = [unknown_model_request(f"bad-{i}") for i in range(40)]
    worker.start()
    try:
        assert settings.kafka_bootstrap is not None
        interleaved = [r for pair in zip(bad, good, strict=True) for r in pair]
        await produce_requests(settings.kafka_bootstrap, settings, interleaved)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended([r.request_id for r in good], 120, worker)
            await asyncio.sleep(3)
            await reader.poll()
        paused = scrape_gauge(port, "streamproc_model_paused", {"model": "no-such-model"})
        stats = mock.stats(detail=True)
        assert worker.alive(), worker.log_tail()  # a 404 for one model no longer stops the worker
    finally:
        worker.stop()
        mock.stop()

    assert all(len(outcomes.results[r.request_id]) == 1 for r in good), worker.log_tail()
    failed = [r.request_id for r in bad if outcomes.terminal(r.request_id)]
    # the first 3 calls, then the pause; records already past the routing when it began still end on their own:
    # at most one fewer than the records the worker handles at once (the gate behind the routing holds the calls)
    assert 3 <= len(failed) <= 3 + records_in_hand(in_flight) - 1
    for request_id in failed:
        (failure,) = outcomes.terminal(request_id)
        assert (failure.layer, failure.error_code) == (FailureLayer.BUSINESS, "model_not_found")
    bad_calls = sum(entry["calls"] for key, entry in stats["per_request_id"].items() if key.startswith("bad-"))
    assert bad_calls == len(failed)  # parked requests cost no call
    assert paused == 1.0
    assert "model no-such-model paused" in worker.log_path.read_text()
