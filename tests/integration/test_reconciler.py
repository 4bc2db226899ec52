"""The reconciler against a real broker and worker: a stranded request is re-driven, once, and ends.

The stranding is built the way a crash leaves it: the table (its changelog, which the worker restores)
says the request waits, while the group has already committed past the record that would move it. Nothing
else will ever deliver that record again; without the reconciler the request never ends.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from streamproc import codec
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.core import headers
from streamproc.core.events import RequestState
from streamproc.core.request_state import input_hash
from streamproc.core.vocabulary import RequestStatus
from streamproc.devstack.broker import free_port
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from tests.integration.pipeline import (
    MockServer,
    OutcomeReader,
    WorkerProcess,
    chat_request,
    scrape_gauge,
    worker_env,
)

pytestmark = pytest.mark.integration


async def _strand(settings: Settings, request_id: str, status: RequestStatus) -> None:
    """Write the record that moves ``request_id`` (a retry record, the submission for ``in_flight``, the parked
    copy on the backlog for ``pending``: a reservation), commit the group past it, and put the waiting state into
    the table's changelog."""
    bootstrap = settings.kafka_bootstrap
    assert bootstrap is not None
    topology = settings.topology()
    await ensure_pipeline_topics(KafkaConnection(bootstrap=bootstrap), topology)
    request = chat_request(request_id, 1)
    retrying = status is RequestStatus.RETRYING
    waiting = status is not RequestStatus.IN_FLIGHT  # its record is the one that continues it (next_*)
    topic = {RequestStatus.RETRYING: topology.retry(topology.tiers[0]),
             RequestStatus.PENDING: topology.backlog}.get(status, topology.requests)
    hop = {headers.ATTEMPT: b"2", headers.REQUEST_ID: request_id.encode()} if retrying else {}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        written = await (await producer.send(topic, key=request_id.encode(), value=codec.encode(request),
                                             headers=list(hop.items())))
        old = int(time.time() * 1000) - 120_000
        state = RequestState(request_id, status, input_hash(request), attempts=0 if status is RequestStatus.PENDING
                             else 1, created_ms=old, updated_ms=old,
                             **({"next_topic": topic, "next_offset": written.offset} if waiting else
                                {"source_topic": topic, "source_offset": written.offset}))
        changelog = f"{settings.app_id}-request_state-changelog"
        await producer.send_and_wait(changelog, key=request_id.encode(), value=codec.encode(state),
                                     partition=written.partition)
    finally:
        await producer.stop()
    group = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=settings.app_id, enable_auto_commit=False)
    await group.start()
    try:
        moved = TopicPartition(topic, written.partition)
        group.assign([moved])  # an assigned (not subscribed) member may commit any offset
        await group.commit({moved: OffsetAndMetadata(written.offset + 1, "")})
    finally:
        await group.stop()


@pytest.mark.parametrize("status", [RequestStatus.RETRYING, RequestStatus.IN_FLIGHT, RequestStatus.PENDING])
async def test_a_stranded_request_is_redriven_once_and_ends(settings: Settings, clean_mock: MockServer,
                                                            tmp_path: Path, status: RequestStatus) -> None:
    assert settings.kafka_bootstrap is not None
    await _strand(settings, "stranded-1", status)
    port = free_port()
    worker = WorkerProcess(worker_env(settings, clean_mock.url, tmp_path / "w1", reconcile_interval_s="1",
                                      reconcile_grace_s="5", worker_metrics_port=str(port)),
                           tmp_path / "worker.log")
    worker.start()
    try:
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(["stranded-1"], 90, worker)
            why = {"why": "attempt_outcome_lost" if status is RequestStatus.IN_FLIGHT else "waiting_record_consumed"}
            redriven = scrape_gauge(port, "streamproc_requests_redriven_total", why)
            for _ in range(10):  # three more passes see the new state: no second re-drive, no second call
                await reader.poll()
            again = scrape_gauge(port, "streamproc_requests_redriven_total", why)
    finally:
        worker.stop()
    assert len(outcomes.results["stranded-1"]) == 1, worker.log_tail()
    assert redriven == again == 1.0, worker.log_tail()
    assert clean_mock.stats()["calls"] == 1
    result = outcomes.results["stranded-1"][0]
    # the waiting retry, the attempt after the lost one, or the parked request's first
    assert result.attempts == (1 if status is RequestStatus.PENDING else 2)
    assert "reconciler: re-drove request stranded-1" in worker.log_tail(100_000)
    if status is RequestStatus.PENDING:  # a parked copy goes back to the backlog, where it keeps its tenant's share
        assert f"sent again to {settings.topology().backlog}" in worker.log_tail(100_000)
