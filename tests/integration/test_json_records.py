"""JSON in and out on the real broker (design §3): requests written as JSON by a producer of its own are called,
refused with submit's reasons or ended as stream requests; a worker with STREAMPROC_RECORD_FORMAT=json writes its
results and failures as JSON that follows schemas/*.schema.json; and every reader of those topics (the export,
the sink, backfill) reads them beside Avro records on the same topics."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord
from jsonschema import Draft202012Validator

from streamproc import codec
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.codec.json_schema import json_schema
from streamproc.core import headers
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.vocabulary import FailureLayer
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from tests.integration.pipeline import OutcomeReader, WorkerProcess, produce, start_mock, worker_env
from tests.integration.test_console_clients import answered
from tests.integration.test_operations import cli

pytestmark = pytest.mark.integration

BODY = {"model": "mock-small", "max_tokens": 32, "messages": [{"role": "user", "content": "Label this item."}]}


def batch_line(custom_id: str, batch_id: str, **more: Any) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": BODY,
                       "batch_id": batch_id, **more}).encode()


async def raw_records(settings: Settings, topics: list[str]) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record on the topics so far, with its partition, key and headers."""
    assert settings.kafka_bootstrap is not None
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=settings.kafka_bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        while batch := await consumer.getmany(timeout_ms=1500):
            records += [message for messages in batch.values() for message in messages]
    finally:
        await consumer.stop()
    return records


def test_json_requests_in_and_json_outcomes_out_read_by_every_reader_beside_avro(settings: Settings,
                                                                                   tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    bootstrap, topology = settings.kafka_bootstrap, settings.topology()
    asyncio.run(ensure_pipeline_topics(KafkaConnection(bootstrap=bootstrap), topology))
    batch = f"js-{uuid.uuid4().hex[:8]}"
    stream_id = f"stream-{uuid.uuid4().hex[:8]}"
    called = [f"{batch}/ok-{i}" for i in range(5)]
    requests: list[tuple[bytes | None, bytes | None]] = [
        (f"{batch}/ok-{i}".encode(), batch_line(f"ok-{i}", batch, tenant="team-a")) for i in range(5)]
    requests.append((f"{batch}/bad-url".encode(),
                     batch_line("bad-url", batch).replace(b"/v1/chat/completions", b"/v1/completions")))
    requests.append((stream_id.encode(), json.dumps({"id": stream_id, "prompt": "Label this stream item."}).encode()))
    asyncio.run(produce(bootstrap, topology.requests, requests))

    mock = start_mock("clean")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "worker", record_format="json"),
                           tmp_path / "worker.log")
    worker.start()
    try:
        async def ended() -> Any:
            async with OutcomeReader(bootstrap, settings) as reader:
                return await reader.wait_until_ended([*called, f"{batch}/bad-url", stream_id], 120, worker)
        outcomes = asyncio.run(ended())
    finally:
        worker.stop()
        mock.stop()

    assert all(len(outcomes.results[i]) == 1 for i in called), worker.log_tail()
    assert {outcomes.results[i][0].tenant for i in called} == {"team-a"}  # the record's field, on its result
    assert outcomes.results[stream_id][0].batch_id is None
    [refused] = outcomes.terminal(f"{batch}/bad-url")
    assert refused.error_code == "invalid_json_request" and "unsupported url '/v1/completions'" in refused.message
    outcome_topics = [topology.results, topology.failed(FailureLayer.BUSINESS)]
    written = [record.value for record in asyncio.run(raw_records(settings, outcome_topics))]
    ours = [json.loads(value) for value in written if batch.encode() in value or stream_id.encode() in value]
    assert len(ours) == 7 and all(value.startswith(b"{") for value in written if batch.encode() in value)
    for value in ours:
        kind = FailureEvent if "layer" in value else InferenceResult
        Draft202012Validator(json_schema(kind)).validate(value)

    # Avro records on the same topics, as a worker with the default format writes them, and a JSON transport failure
    avro_result = dataclasses.replace(outcomes.results[called[0]][0], request_id=f"{batch}/avro-ok")
    failed_request = InferenceRequest(f"{batch}/avro-failed", json.dumps(BODY), batch_id=batch)
    now = int(time.time() * 1000)
    transport = FailureEvent(failed_request, FailureLayer.TRANSPORT, "read_timeout", "timed out", 4, True, now, now)
    json_transport = dataclasses.replace(transport, request=dataclasses.replace(failed_request,
                                                                                request_id=f"{batch}/json-failed"))
    asyncio.run(produce(bootstrap, topology.results, [(avro_result.request_id.encode(), codec.encode(avro_result))]))
    asyncio.run(produce(bootstrap, topology.failed(FailureLayer.TRANSPORT), [
        (b"a", codec.encode(transport)), (b"j", codec.encode_json(json_transport))]))

    exported = cli(settings, "results", "--batch-id", batch, "--output", str(tmp_path / "out.jsonl"),
                   "--errors", str(tmp_path / "errors.jsonl"))
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    errors = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted([*(f"ok-{i}" for i in range(5)), "avro-ok"])
    assert sorted(line["custom_id"] for line in errors) == ["avro-failed", "bad-url", "json-failed"]

    database = tmp_path / "outcomes.db"
    sunk = cli(settings, "sink", "--to", f"sqlite:///{database}", "--until-idle")
    assert sunk.returncode == 0, sunk.stderr
    with sqlite3.connect(database) as db:
        results = {row[0] for row in db.execute("SELECT custom_id FROM results WHERE batch = ?", (batch,))}
        failures = {row[0] for row in db.execute("SELECT custom_id FROM failures WHERE batch = ? AND terminal",
                                                 (batch,))}
        rejected = db.execute("SELECT count(*) FROM rejected_rows").fetchone()[0]
    assert results == {*(f"ok-{i}" for i in range(5)), "avro-ok"}
    assert failures == {"avro-failed", "bad-url", "json-failed"} and rejected == 0

    planned = cli(settings, "backfill", "--batch-id", batch, "--layer", "transport", "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert "backfill plan: 2 to replay, 0 to skip" in planned.stdout, planned.stdout


def test_requests_without_a_batch_are_counted_by_the_stream_view(settings: Settings, tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    bootstrap, topology = settings.kafka_bootstrap, settings.topology()
    asyncio.run(ensure_pipeline_topics(KafkaConnection(bootstrap=bootstrap), topology))
    tag = uuid.uuid4().hex[:8]
    called = [f"flow-{tag}-{i}" for i in range(3)]
    refused = f"flow-{tag}-bad"
    requests: list[tuple[bytes | None, bytes | None]] = [
        (called[0].encode(), json.dumps({"id": called[0], "prompt": "Label this stream item."}).encode()),
        *((request_id.encode(), json.dumps({"custom_id": request_id, "method": "POST", "url": "/v1/chat/completions",
                                            "body": BODY}).encode()) for request_id in called[1:]),
        (refused.encode(), json.dumps({"custom_id": refused, "method": "POST", "url": "/v1/completions",
                                       "body": BODY}).encode()),
        (f"in-a-batch/{tag}".encode(), batch_line(tag, "in-a-batch")),  # not the stream's
    ]
    asyncio.run(produce(bootstrap, topology.requests, requests))

    mock = start_mock("clean")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "worker"), tmp_path / "worker.log")
    worker.start()
    try:
        async def ended() -> Any:
            async with OutcomeReader(bootstrap, settings) as reader:
                return await reader.wait_until_ended([*called, refused, f"in-a-batch/{tag}"], 120, worker)
        outcomes = asyncio.run(ended())
        assert all(len(outcomes.results[request_id]) == 1 for request_id in called), worker.log_tail()
        deadline, view, asked_ms = time.monotonic() + 30, {}, 0.0
        while time.monotonic() < deadline:  # a state is written after its outcome: wait for the last ones
            asked_ms = time.time() * 1000  # the view's hours end with the hour it was asked in
            shown = cli(settings, "status", "--stream", "--hours", "2", "--json")
            assert shown.returncode == 0, shown.stderr
            view = json.loads(shown.stdout)
            if view["succeeded"] + view["failed"]["business"] == 4:
                break
            time.sleep(1)
        verified = cli(settings, "status", "--stream", "--hours", "2", "--json", "--verify")
    finally:
        worker.stop()
        mock.stop()

    assert [view[key] for key in ("requests", "succeeded", "retrying", "in_flight", "pending")] == [4, 3, 0, 0, 0]
    assert view["failed"] == {"transport": 0, "service": 0, "semantic": 0, "business": 1}
    assert view["failed_codes"] == {"invalid_json_request": 1}
    hours = view["hours"]
    assert len(hours) == 2 and hours[-1]["start_ms"] <= asked_ms < hours[-1]["start_ms"] + 3_600_000
    assert [sum(hour[key] for hour in hours) for key in ("arrived", "succeeded", "failed")] == [4, 3, 1]
    # the workers' summary of the stream (what status --stream reads) counts what the fold of every state counts
    assert verified.returncode == 0, verified.stderr
    assert {**json.loads(verified.stdout), "hours": None} == {**view, "hours": None}
    text = cli(settings, "status", "--stream")
    assert text.returncode == 0 and "requests   4\nsucceeded  3\nfailed     1 (" in text.stdout, text.stdout
    assert "invalid_json_request 1" in text.stdout and "last 24h   4 ended" in text.stdout


def test_keyless_requests_are_written_again_under_their_id_so_each_state_lives_on_one_partition(
        settings: Settings, tmp_path: Path) -> None:
    """A console producer's default (design §3): the worker re-keys each keyless request, the keyed copy carries
    the original's place, and the request's states are all on the id's partition."""
    assert settings.kafka_bootstrap is not None
    bootstrap, topology = settings.kafka_bootstrap, settings.topology()
    asyncio.run(ensure_pipeline_topics(KafkaConnection(bootstrap=bootstrap), topology))
    tag = uuid.uuid4().hex[:8]
    ids = [f"nokey-{tag}-{i}" for i in range(8)]
    asyncio.run(produce(bootstrap, topology.requests, [
        (None, json.dumps({"id": request_id, "prompt": "Label this keyless item."}).encode()) for request_id in ids]))

    answered(settings, tmp_path, ids)  # each once

    records = asyncio.run(raw_records(settings, [topology.requests, topology.state_changelog]))
    requests = [record for record in records if record.topic == topology.requests]
    originals = {json.loads(record.value)["id"]: record for record in requests if record.key is None}
    copies = {record.key.decode(): record for record in requests if record.key is not None}
    assert sorted(originals) == sorted(copies) == sorted(ids)
    moved = 0
    for request_id, copy in copies.items():
        original = originals[request_id]
        assert copy.value == original.value
        assert dict(copy.headers) == {headers.ORIG_TOPIC: topology.requests.encode(),
                                      headers.ORIG_PARTITION: str(original.partition).encode(),
                                      headers.ORIG_OFFSET: str(original.offset).encode()}
        states = {record.partition for record in records
                  if record.topic == topology.state_changelog and record.key == request_id.encode()}
        assert states == {copy.partition}, (request_id, states, copy.partition)
        moved += original.partition != copy.partition
    assert moved > 0  # else the producer happened to choose every id's own partition, and nothing was shown
