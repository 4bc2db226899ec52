"""Records of about 600 KB (near the broker's 1 MB limit) and the records behind them all end, none stuck."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamproc.core.events import InferenceRequest
from streamproc.settings import Settings
from tests.integration.pipeline import (
    MockServer,
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce_requests,
    worker_env,
)

pytestmark = pytest.mark.integration


def large_request(request_id: str) -> InferenceRequest:
    """A chat request of about 600 KB: large, yet under the broker's 1 MB record limit."""
    body = {"model": "mock-small", "max_tokens": 16,
            "messages": [{"role": "user", "content": "Summarise: " + "lorem ipsum " * 50_000}]}
    return InferenceRequest(request_id=request_id, body_json=json.dumps(body), batch_id="b1")


async def test_records_larger_than_the_fetch_size_end_like_any_other(settings: Settings, clean_mock: MockServer,
                                                                     tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    requests = [*(large_request(f"large-{i}") for i in range(3)), *(chat_request(f"small-{i}", i) for i in range(30))]
    await produce_requests(settings.kafka_bootstrap, settings, requests)
    worker = WorkerProcess(worker_env(settings, clean_mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    worker.start()
    try:
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended([r.request_id for r in requests], 120, worker)
    finally:
        worker.stop()
    assert not outcomes.unfinished(r.request_id for r in requests), worker.log_tail()
    assert len(requests[0].body_json) > 2 * 256 * 1024
