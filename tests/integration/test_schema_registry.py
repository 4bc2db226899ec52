"""The schema registry client against a real registry (Apicurio Registry's Confluent API, built from Maven
Central by the devstack): our schemas registered under ``<topic>-value``, records in the Confluent wire format
read back by id with one lookup per id, and a worker that refuses to start when the registry says incompatible."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from streamproc import codec
from streamproc.core.events import InferenceResult
from streamproc.core.vocabulary import FailureLayer
from streamproc.devstack.apicurio import ThrowawaySchemaRegistry
from streamproc.errors import ExitCode
from streamproc.kafka.schema_registry import SchemaRegistry, SchemaRegistryRefused, subject, topic_schemas
from streamproc.settings import RegistryAccess, Settings
from tests.integration.pipeline import worker_env

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
    env = worker_env(settings, "http://127.0.0.1:9/v1", settings.data_dir,
                     schema_registry_url=schema_registry.confluent_url)
    worker = subprocess.run([sys.executable, "-m", "streamproc", "worker"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert worker.returncode == ExitCode.CONFIGURATION, worker.stderr[-2000:]
    refusal = [line for line in worker.stderr.splitlines() if "incompatible" in line]
    assert len(refusal) == 1 and subject(settings.topology().results) in refusal[0], worker.stderr[-2000:]
    assert "Traceback" not in worker.stderr
