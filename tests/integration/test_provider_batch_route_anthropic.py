"""The provider-batch route in Anthropic's shape on the real broker and the real mock (issue 31): with
``STREAMPROC_PROVIDER_BATCH_API=anthropic`` a routed model's requests go through the mock's Message Batches (no
synchronous call, no OpenAI batch), each ends in exactly one place, and a request the Messages API cannot carry
fails as a business failure naming what does not fit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streamproc.app.provider_batch_route import NOT_CONVERTIBLE
from streamproc.core.vocabulary import FailureLayer
from streamproc.settings import Settings
from tests.integration.pipeline import (
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce_requests,
    start_mock,
    worker_env,
)
from tests.integration.provider_batch_rig import batch_records, ended_once

pytestmark = pytest.mark.integration

ANTHROPIC_ROUTED = {"model_routes": '{"mock-small": "provider-batch"}', "provider_batch_api": "anthropic",
                    "provider_batch_max_age_s": "2", "provider_batch_poll_s": "0.5", "in_flight": "200"}


async def test_routed_requests_end_once_through_anthropic_message_batches(settings: Settings,
                                                                          tmp_path: Path) -> None:
    mock = start_mock("realistic", 13)
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", **ANTHROPIC_ROUTED),
                           tmp_path / "worker.log")
    convertible = [chat_request(f"ant-{i}", i) for i in range(200)]
    with_schema = [chat_request(f"schema-{i}", i, json_schema=True) for i in range(5)]  # response_format: no fit
    ids = [r.request_id for r in convertible + with_schema]
    worker.start()
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, convertible + with_schema)
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
    anthropic, openai = stats["batches"]["anthropic"], stats["batches"]["openai"]
    assert openai["created"] == 0 and anthropic["created"] >= 2  # gathered into Message Batches only
    assert anthropic["lines_answered"] >= len(convertible)
    assert stats["calls"] - anthropic["lines_answered"] == 0  # no request went by a call of its own
    assert sum(1 for r in convertible if outcomes.results.get(r.request_id)) >= 170, worker.log_tail()
    answered = outcomes.results[convertible[0].request_id][0]
    assert '"chat.completion"' in answered.response_json and answered.content  # the Message as a chat completion
    for request in with_schema:
        assert not outcomes.results.get(request.request_id)
        [failed] = outcomes.terminal(request.request_id)
        assert (failed.layer, failed.error_code) == (FailureLayer.BUSINESS, NOT_CONVERTIBLE)
        assert "response_format" in failed.message
    assert left == {}  # every record ended and tombstoned
