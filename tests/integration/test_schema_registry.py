"""The schema registry against a real registry (Apicurio Registry's Confluent API, built from Maven Central by
the devstack) and the real broker: our schemas registered under ``<topic>-value``, records in the Confluent wire
format read back by id with one lookup per id, a worker that writes its results in that format and reads a request
framed so, the export reading them by id, a worker that refuses to start when the registry says incompatible,
``submit`` and the retry tiers writing requests by id, and basic auth against a registry that asks for it."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamproc import codec
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.vocabulary import FailureLayer
from streamproc.devstack.apicurio import ThrowawaySchemaRegistry
from streamproc.errors import ExitCode
from streamproc.kafka.schema_registry import (
    SchemaRegistry,
    SchemaRegistryRefused,
    register_schemas,
    subject,
    topic_schemas,
)
from streamproc.settings import RegistryAccess, Settings
from tests.integration import pipeline
from tests.integration.test_json_records import raw_records
from tests.integration.test_operations import batch_file, cli, wait_converged

pytestmark = pytest.mark.integration

RESULT = InferenceResult("req-1", "batch-1", "m", "{}", "ok", 1, 250, 1_735_689_601_000, "hash")
# another record under a subject of ours: BACKWARD compatibility cannot read it with our schema
FOREIGN = {"type": "record", "name": "Foreign", "namespace": "elsewhere", "fields": [{"name": "x", "type": "int"}]}


def _make_incompatible(registry: ThrowawaySchemaRegistry, subject_name: str) -> None:
    api = registry.confluent_url
    headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
    httpx.post(f"{api}/subjects/{subject_name}/versions", headers=headers,
               content=json.dumps({"schema": json.dumps(FOREIGN)})).raise_for_status()
    httpx.put(f"{api}/config/{subject_name}", headers=headers,
              content=json.dumps({"compatibility": "BACKWARD"})).raise_for_status()


def test_schemas_registered_by_topic_and_records_read_by_id_with_one_lookup(
        schema_registry: ThrowawaySchemaRegistry, settings: Settings) -> None:
    topology = settings.topology()
    registry = SchemaRegistry(RegistryAccess(url=schema_registry.confluent_url, username=None, password=None))
    ids = registry.register_topics(topic_schemas(topology))
    subjects = set(httpx.get(f"{schema_registry.confluent_url}/subjects").json())
    assert {subject(topic) for topic in ids} <= subjects
    assert {subject(topology.results), subject(topology.requests),
            *(subject(topology.failed(layer)) for layer in FailureLayer)} <= subjects
    assert registry.register_topics(topic_schemas(topology)) == ids, "registering again changes no id"

    reader = SchemaRegistry(RegistryAccess(url=schema_registry.confluent_url, username=None, password=None))
    framed = codec.encode_confluent(RESULT, ids[topology.results])
    assert framed[0] == 0 and int.from_bytes(framed[1:5], "big") == ids[topology.results]
    assert codec.decode(framed, InferenceResult, schema_lookup=reader.schema) == RESULT
    failure_id = ids[topology.failed(FailureLayer.BUSINESS)]
    assert json.loads(reader.schema(failure_id))["name"] == "FailureEvent"
    reader.close()  # from here on a request would fail: the cache must answer
    assert codec.decode(framed, InferenceResult, schema_lookup=reader.schema) == RESULT
    assert json.loads(reader.schema(failure_id))["name"] == "FailureEvent"

def test_incompatible_schema_refuses_before_registering_anything(schema_registry: ThrowawaySchemaRegistry,
                                                                  settings: Settings) -> None:
    topology = settings.topology()
    _make_incompatible(schema_registry, subject(topology.results))
    registry = SchemaRegistry(RegistryAccess(url=schema_registry.confluent_url, username=None, password=None))
    with pytest.raises(SchemaRegistryRefused, match=f"incompatible .*{subject(topology.results)}"):
        registry.register_topics(topic_schemas(topology))
    assert subject(topology.requests) not in httpx.get(f"{schema_registry.confluent_url}/subjects").json()


def test_worker_refuses_to_start_on_an_incompatible_schema(schema_registry: ThrowawaySchemaRegistry,
                                                          settings: Settings) -> None:
    _make_incompatible(schema_registry, subject(settings.topology().results))
    env = pipeline.worker_env(settings, "http://127.0.0.1:9/v1", settings.data_dir,
                     schema_registry_url=schema_registry.confluent_url)
    worker = subprocess.run([sys.executable, "-m", "streamproc", "worker"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert worker.returncode == ExitCode.CONFIGURATION, worker.stderr[-2000:]
    refusal = [line for line in worker.stderr.splitlines() if "incompatible" in line]
    assert len(refusal) == 1 and subject(settings.topology().results) in refusal[0], worker.stderr[-2000:]
    assert "Traceback" not in worker.stderr


def test_worker_writes_the_confluent_wire_format_and_every_reader_reads_it_by_id(
        schema_registry: ThrowawaySchemaRegistry, settings: Settings, tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    bootstrap, topology = settings.kafka_bootstrap, settings.topology()
    access = RegistryAccess(url=schema_registry.confluent_url, username=None, password=None)
    registered = register_schemas(access, topology)  # as another producer's serializer would: the same ids
    batch = f"sr-{uuid.uuid4().hex[:8]}"
    avro_ids = [f"{batch}/avro-{i}" for i in range(4)]
    confluent_id = f"{batch}/confluent"
    asyncio.run(pipeline.produce_requests(bootstrap, settings, [pipeline.chat_request(i, n, batch_id=batch)
                                                       for n, i in enumerate(avro_ids)]))
    asyncio.run(pipeline.produce(bootstrap, topology.requests, [
        (confluent_id.encode(), registered.encode(pipeline.chat_request(confluent_id, 9, batch_id=batch)))]))

    mock = pipeline.start_mock("clean")
    worker = pipeline.WorkerProcess(pipeline.worker_env(settings, mock.url, tmp_path / "worker",
                                      schema_registry_url=schema_registry.confluent_url), tmp_path / "worker.log")
    worker.start()
    try:
        async def ended() -> Any:
            async with pipeline.OutcomeReader(bootstrap, settings, schema_lookup=registered.reader.lookup) as reader:
                return await reader.wait_until_ended([*avro_ids, confluent_id], 120, worker)
        outcomes = asyncio.run(ended())
    finally:
        worker.stop()
        mock.stop()

    assert all(len(outcomes.results[i]) == 1 for i in [*avro_ids, confluent_id]), worker.log_tail()
    written = [record.value for record in asyncio.run(raw_records(settings, [topology.results]))
               if record.value is not None and batch.encode() in record.value]
    result_id = registered.ids[InferenceResult].to_bytes(4, "big")
    assert len(written) == 5 and all(value[:5] == b"\x00" + result_id for value in written)
    subjects = set(httpx.get(f"{schema_registry.confluent_url}/subjects").json())
    assert {subject(topology.requests), subject(topology.results),
            *(subject(topology.failed(layer)) for layer in FailureLayer)} <= subjects

    exported = cli(settings, "results", "--batch-id", batch, "--output", str(tmp_path / "out.jsonl"),
                   schema_registry_url=schema_registry.confluent_url)
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(i.split("/")[1] for i in [*avro_ids, confluent_id])
    unread = cli(settings, "results", "--batch-id", batch, "--output", str(tmp_path / "without.jsonl"))
    assert unread.returncode == 0 and (tmp_path / "without.jsonl").read_text() == "", "without the registry: no id"

    # a terminal failure in the Confluent wire format, as a worker with the registry writes one
    now = int(time.time() * 1000)
    failure = FailureEvent(pipeline.chat_request(f"{batch}/failed", 10, batch_id=batch), FailureLayer.TRANSPORT,
                           "read_timeout", "timed out", 4, True, now, now)
    asyncio.run(pipeline.produce(bootstrap, topology.failed(FailureLayer.TRANSPORT),
                        [(failure.request.request_id.encode(), registered.encode(failure))]))
    planned = cli(settings, "backfill", "--batch-id", batch, "--layer", "transport", "--dry-run",
                  schema_registry_url=schema_registry.confluent_url)
    assert planned.returncode == 0, planned.stderr
    assert "backfill plan: 1 to replay, 0 to skip" in planned.stdout, planned.stdout

    database = tmp_path / "outcomes.db"
    sunk = cli(settings, "sink", "--to", f"sqlite:///{database}", "--until-idle",
               schema_registry_url=schema_registry.confluent_url)
    assert sunk.returncode == 0, sunk.stderr
    with sqlite3.connect(database) as db:
        results = {row[0] for row in db.execute("SELECT custom_id FROM results WHERE batch = ?", (batch,))}
        failures = {row[0] for row in db.execute("SELECT custom_id FROM failures WHERE batch = ?", (batch,))}
    assert results == {i.split("/")[1] for i in [*avro_ids, confluent_id]} and failures == {"failed"}


def _submit_and_run(settings: Settings, tmp_path: Path, batch: str, count: int, mock_profile: str,
                    **registry: str) -> tuple[list[dict[str, Any]], pipeline.WorkerProcess]:
    """``submit`` a batch of ``count`` requests and run a worker until it converged, both with the registry
    settings given; the status polls and the (stopped) worker."""
    submitted = cli(settings, "submit", str(batch_file(tmp_path / "batch.jsonl", count)), "--batch-id", batch,
                    **registry)
    assert submitted.returncode == 0, submitted.stderr
    mock = pipeline.start_mock(mock_profile)
    worker = pipeline.WorkerProcess(pipeline.worker_env(settings, mock.url, tmp_path / "worker", **registry),
                                    tmp_path / "worker.log")
    worker.start()
    try:
        return wait_converged(settings, batch, 180, worker), worker
    finally:
        worker.stop()
        mock.stop()


def test_submit_and_the_retry_tiers_write_the_confluent_wire_format_and_the_batch_completes(
        schema_registry: ThrowawaySchemaRegistry, settings: Settings, tmp_path: Path) -> None:
    """A submitted batch's requests and every copy a retry tier holds are ``00`` + the id registered under the
    topic's subject; the flaky mock makes some requests go through a tier, and every request still ends."""
    topology, url = settings.topology(), schema_registry.confluent_url
    batch = f"srsub-{uuid.uuid4().hex[:8]}"
    statuses, worker = _submit_and_run(settings, tmp_path, batch, 30, "flaky", schema_registry_url=url)
    assert statuses[-1]["converged"] and statuses[-1]["submitted"] == 30, worker.log_tail()

    registry = SchemaRegistry(RegistryAccess(url=url, username=None, password=None))
    request_id = registry.register(subject(topology.requests), codec.avro_schema(InferenceRequest))  # already there
    tiers = [topology.retry(tier) for tier in topology.tiers]
    records = [record for record in asyncio.run(raw_records(settings, [topology.requests, *tiers]))
               if record.key is not None and record.key.startswith(batch.encode())]
    on_tiers = [record for record in records if record.topic in tiers]
    assert len(records) - len(on_tiers) == 30 and on_tiers, "the flaky mock sends some requests to a tier"
    frame = b"\x00" + request_id.to_bytes(4, "big")
    assert all(record.value is not None and record.value[:5] == frame for record in records)
    assert {subject(topic) for topic in [topology.requests, *tiers]} <= set(httpx.get(f"{url}/subjects").json())


def test_basic_auth_against_the_registry_right_credentials_run_and_wrong_ones_refuse_in_one_line(
        schema_registry_with_auth: ThrowawaySchemaRegistry, settings: Settings, tmp_path: Path) -> None:
    """The registry asks for basic auth on every path: without credentials it answers 401; with the right ones
    ``submit`` and the worker register and a batch completes; with a wrong password the worker exits 3 in one
    line that names the settings and never the password."""
    url = schema_registry_with_auth.confluent_url
    user, password = schema_registry_with_auth.credentials or ("", "")
    assert httpx.get(f"{url}/subjects").status_code == 401
    assert httpx.get(f"{url}/subjects", auth=(user, password)).status_code == 200

    wrong = "not-the-registry-pw"
    env = pipeline.worker_env(settings, "http://127.0.0.1:9/v1", settings.data_dir, schema_registry_url=url,
                              schema_registry_username=user, schema_registry_password=wrong)
    refused = subprocess.run([sys.executable, "-m", "streamproc", "worker"], env=env, capture_output=True,
                             text=True, timeout=120, check=False)
    assert refused.returncode == ExitCode.CONFIGURATION, refused.stderr[-2000:]
    lines = [line for line in refused.stderr.splitlines() if "STREAMPROC_SCHEMA_REGISTRY" in line]
    assert len(lines) == 1 and "refused the credentials (401)" in lines[0], refused.stderr[-2000:]
    assert wrong not in refused.stderr + refused.stdout and "Traceback" not in refused.stderr

    batch = f"srauth-{uuid.uuid4().hex[:8]}"
    access = {"schema_registry_url": url, "schema_registry_username": user, "schema_registry_password": password}
    statuses, worker = _submit_and_run(settings, tmp_path, batch, 6, "clean", **access)
    assert statuses[-1]["succeeded"] == 6, worker.log_tail()
    subjects = httpx.get(f"{url}/subjects", auth=(user, password)).json()
    assert subject(settings.topology().results) in subjects and password not in worker.log_tail(100_000)
