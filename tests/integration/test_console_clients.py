"""Clients we did not write (issue 32): Kafka's own console producer (what ``bin/kafka-console-producer.sh`` runs,
from the jars the built-in broker already fetched) writes JSON requests, keyed and with a header, and Kafka's own
console consumer reads the JSON results a worker with STREAMPROC_RECORD_FORMAT=json writes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from streamproc.app.topics import ensure_pipeline_topics
from streamproc.codec.json_schema import json_schema
from streamproc.core.events import InferenceResult
from streamproc.devstack.secure_broker import ensure_tools_jars, tool_command
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from tests.integration.pipeline import OutcomeReader, Outcomes, WorkerProcess, start_mock, worker_env

pytestmark = pytest.mark.integration

CONSOLE_PRODUCER = "kafka.tools.ConsoleProducer"  # what bin/kafka-console-producer.sh runs in Kafka 3.9
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"  # bin/kafka-console-consumer.sh


def console_lines(batch: str, count: int) -> str:
    """``headers<TAB>key<TAB>value`` lines: OpenAI Batch lines under a batch given as a field, simple-form ones
    under a batch given as the x-batch-id header, every one with a tenant header."""
    lines = []
    for i in range(count):
        if i % 2:
            value: dict[str, Any] = {"id": f"c-{i}", "prompt": f"Label console item {i}.", "max_tokens": 256}
            headers = f"x-tenant:team-a,x-batch-id:{batch}"
        else:
            value = {"custom_id": f"c-{i}", "method": "POST", "url": "/v1/chat/completions", "batch_id": batch,
                     "body": {"model": "mock-small", "max_tokens": 256,
                              "messages": [{"role": "user", "content": f"Label console item {i}."}]}}
            headers = "x-tenant:team-a"
        lines.append(f"{headers}\t{batch}/c-{i}\t{json.dumps(value)}\n")
    return "".join(lines)


def test_kafkas_console_producer_writes_json_requests_and_its_console_consumer_reads_json_results(
        settings: Settings, tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    bootstrap, topology = settings.kafka_bootstrap, settings.topology()
    asyncio.run(ensure_pipeline_topics(KafkaConnection(bootstrap=bootstrap), topology))
    batch, count = f"console-{uuid.uuid4().hex[:8]}", 6
    produced = subprocess.run(
        tool_command(settings, tmp_path / "tools", CONSOLE_PRODUCER,
                     ["--bootstrap-server", bootstrap, "--topic", topology.requests,
                      "--producer-property", "acks=all", "--property", "parse.key=true",
                      "--property", "parse.headers=true"]),
        input=console_lines(batch, count), capture_output=True, text=True, timeout=120, check=False)
    assert produced.returncode == 0, produced.stderr

    mock = start_mock("clean")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "worker", record_format="json"),
                           tmp_path / "worker.log")
    worker.start()
    ids = [f"{batch}/c-{i}" for i in range(count)]
    try:
        async def ended() -> Outcomes:
            async with OutcomeReader(bootstrap, settings) as reader:
                return await reader.wait_until_ended(ids, 120, worker)
        outcomes = asyncio.run(ended())
    finally:
        worker.stop()
        mock.stop()
    assert all(len(outcomes.results[i]) == 1 for i in ids), (outcomes.failures, worker.log_tail())

    consumed = subprocess.run(
        tool_command(settings, tmp_path / "tools", CONSOLE_CONSUMER,
                     ["--bootstrap-server", bootstrap, "--topic", topology.results, "--from-beginning",
                      "--group", f"console-{uuid.uuid4().hex[:8]}", "--timeout-ms", "15000",
                      "--property", "print.key=true", "--property", "key.separator=\t"],
                     extra_jars=ensure_tools_jars(settings)),
        capture_output=True, text=True, timeout=120, check=False)
    read = dict(line.split("\t", 1) for line in consumed.stdout.splitlines() if line.startswith(f"{batch}/"))
    assert sorted(read) == sorted(ids), consumed.stdout + consumed.stderr
    schema = Draft202012Validator(json_schema(InferenceResult))
    for key, value in read.items():
        result = json.loads(value)
        schema.validate(result)
        assert (result["request_id"], result["batch_id"]) == (key, batch)
        assert json.loads(result["response_json"])["choices"][0]["message"]["content"] == result["content"]
