"""Clients we did not write (design §3): Kafka's own console producer (what ``bin/kafka-console-producer.sh`` runs,
from the jars the built-in broker already fetched) writes JSON requests, keyed and with headers, and Kafka's own
console consumer reads the JSON results a worker with STREAMPROC_RECORD_FORMAT=json writes; a Java program on
Apache Avro's library (``java/AvroClient.java``, compiled here with javac) writes Avro requests the worker
processes and reads the Avro results, with the schemas of ``schemas/`` and nothing of ours; and the README's Java
snippet (Jackson and Kafka's StringSerializer) writes a JSON request the worker answers."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from streamproc.app.topics import ensure_pipeline_topics
from streamproc.codec.json_schema import json_schema
from streamproc.core.events import InferenceResult
from streamproc.devstack.broker import ensure_jars, fetch_jars, require_tool
from streamproc.devstack.secure_broker import ensure_tools_jars, tool_command
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from tests.integration.pipeline import OutcomeReader, Outcomes, WorkerProcess, start_mock, worker_env

pytestmark = pytest.mark.integration

CONSOLE_PRODUCER = "kafka.tools.ConsoleProducer"  # what bin/kafka-console-producer.sh runs in Kafka 3.9
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"  # bin/kafka-console-consumer.sh
AVRO_VERSION = "1.12.0"
AVRO_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streamproc</groupId><artifactId>avro-client</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.avro</groupId><artifactId>avro</artifactId><version>{AVRO_VERSION}</version></dependency>
  </dependencies>
</project>
"""
ROOT = Path(__file__).resolve().parents[2]
JAVA_BLOCK = re.compile(r"^```java\n(.*?)^```", re.MULTILINE | re.DOTALL)


def answered(settings: Settings, tmp_path: Path, ids: list[str], **worker_settings: str) -> Outcomes:
    """The outcomes once a worker (against the mock) has answered every request of ``ids``, each once."""
    assert settings.kafka_bootstrap is not None
    bootstrap = settings.kafka_bootstrap
    mock = start_mock("clean")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "worker", **worker_settings),
                           tmp_path / "worker.log")
    worker.start()
    try:
        async def ended() -> Outcomes:
            async with OutcomeReader(bootstrap, settings) as reader:
                return await reader.wait_until_ended(ids, 120, worker)
        outcomes = asyncio.run(ended())
    finally:
        worker.stop()
        mock.stop()
    assert all(len(outcomes.results[i]) == 1 for i in ids), (outcomes.failures, worker.log_tail())
    return outcomes


def compile_java(source: Path, classpath: str, classes: Path) -> None:
    javac = require_tool("javac", "a JDK 17 (Debian: apt-get install openjdk-17-jdk-headless)")
    compiled = subprocess.run([javac, "-cp", classpath, "-d", str(classes), str(source)],
                              capture_output=True, text=True, timeout=180, check=False)
    assert compiled.returncode == 0, compiled.stderr


def readme_java(bootstrap: str, topic: str, request_id: str) -> str:
    """The README's Java snippet as a program (its statements in a main), aimed at the test's broker and topic,
    with a fresh id and a model the mock serves."""
    [snippet] = JAVA_BLOCK.findall((ROOT / "README.md").read_text())
    for shown, used, times in (('"localhost:9092"', bootstrap, 1), ('"llm.requests"', topic, 1),
                               ('"r-2"', request_id, 2), ('"gpt-4o-mini"', "mock-small", 1)):
        assert snippet.count(shown) == times, f"the README's Java snippet should name {shown} {times} time(s)"
        snippet = snippet.replace(shown, json.dumps(used))
    lines = snippet.splitlines()
    imports = [line for line in lines if line.startswith("import ")]
    statements = [f"        {line}" for line in lines if line and not line.startswith("import ")]
    return "\n".join([*imports, "public final class ReadmeProducer {",
                      "    public static void main(String[] args) throws Exception {", *statements, "    }", "}"])


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

    ids = [f"{batch}/c-{i}" for i in range(count)]
    answered(settings, tmp_path, ids, record_format="json")

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


def test_a_java_program_on_apache_avro_writes_requests_the_worker_processes_and_reads_the_results(
        settings: Settings, tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    bootstrap, topology = settings.kafka_bootstrap, settings.topology()
    asyncio.run(ensure_pipeline_topics(KafkaConnection(bootstrap=bootstrap), topology))
    avro_jars = fetch_jars(AVRO_POM, settings.cache_dir / f"avro-{AVRO_VERSION}" / "libs", "avro-*.jar",
                           f"Apache Avro {AVRO_VERSION}")
    classpath = os.pathsep.join([str(avro_jars / "*"), str(ensure_jars(settings) / "*"), str(tmp_path / "classes")])
    compile_java(ROOT / "tests" / "integration" / "java" / "AvroClient.java", classpath, tmp_path / "classes")
    batch, count = f"java-{uuid.uuid4().hex[:8]}", 5

    def java(mode: str, topic: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["java", "-Xmx256m", "-cp", classpath, "AvroClient", mode, bootstrap, topic,
                               str(ROOT / "schemas"), batch, str(count)],
                              capture_output=True, text=True, timeout=180, check=False)

    produced = java("produce", topology.requests)
    assert produced.returncode == 0, produced.stderr
    ids = [f"{batch}/j-{i}" for i in range(count)]
    outcomes = answered(settings, tmp_path, ids)

    consumed = java("consume", topology.results)
    assert consumed.returncode == 0, consumed.stderr
    read = {request_id: base64.b64decode(content).decode() for request_id, content in
            (line.split("\t") for line in consumed.stdout.splitlines())}
    assert read == {i: outcomes.results[i][0].content for i in ids}, consumed.stdout + consumed.stderr


def test_the_readmes_java_snippet_writes_a_json_request_with_jackson_that_the_worker_answers(
        settings: Settings, tmp_path: Path) -> None:
    """Kafka's Java client with its StringSerializer and Jackson (both from the broker's jars), as the README shows."""
    assert settings.kafka_bootstrap is not None
    bootstrap, topology = settings.kafka_bootstrap, settings.topology()
    asyncio.run(ensure_pipeline_topics(KafkaConnection(bootstrap=bootstrap), topology))
    request_id = f"readme-{uuid.uuid4().hex[:8]}"
    source = tmp_path / "ReadmeProducer.java"
    source.write_text(readme_java(bootstrap, topology.requests, request_id))
    classpath = os.pathsep.join([str(ensure_jars(settings) / "*"), str(tmp_path / "classes")])
    compile_java(source, classpath, tmp_path / "classes")
    produced = subprocess.run(["java", "-Xmx256m", "-cp", classpath, "ReadmeProducer"],
                              capture_output=True, text=True, timeout=180, check=False)
    assert produced.returncode == 0, produced.stderr

    [result] = answered(settings, tmp_path, [request_id]).results[request_id]
    assert result.batch_id is None and result.content  # a stream request, answered
