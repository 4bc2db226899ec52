"""Records that could wedge a partition: each ends in its outcome and nothing behind it waits."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from streamproc import codec
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.core import headers
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from tests.integration.pipeline import OutcomeReader, WorkerProcess, chat_request, start_mock, worker_env

pytestmark = pytest.mark.integration


async def test_a_far_future_due_time_does_not_hold_up_its_retry_tier(settings: Settings, tmp_path: Path) -> None:
    """x-due-ts a year ahead, then an ordinary retry record on the same tier partition: both run within about
    one tier delay (1 s here), instead of the first sleeping for a year with the second behind it."""
    mock = start_mock("clean", 1)
    assert settings.kafka_bootstrap is not None
    topology = settings.topology()
    await ensure_pipeline_topics(KafkaConnection(bootstrap=settings.kafka_bootstrap), topology)
    tier_topic = topology.retry(topology.tiers[0])
    now_ms = int(time.time() * 1000)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for request_id, due_ms in (("far-future", now_ms + 365 * 86_400_000), ("ordinary", now_ms + 500)):
            request = chat_request(request_id, 1)
            hop = {headers.ATTEMPT: b"2", headers.DUE_TS: str(due_ms).encode()}
            await producer.send_and_wait(tier_topic, key=request_id.encode(), value=codec.encode(request),
                                         headers=list(hop.items()), partition=0)
    finally:
        await producer.stop()
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1"), tmp_path / "worker.log")
    started = time.monotonic()
    worker.start()
    try:
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(["far-future", "ordinary"], 60, worker)
    finally:
        worker.stop()
        mock.stop()
    assert outcomes.results["far-future"] and outcomes.results["ordinary"], worker.log_tail()
    assert time.monotonic() - started < 45  # worker start-up included; a year's sleep would never end
