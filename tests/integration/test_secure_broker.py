"""The secure built-in broker (``broker start --secure``), reached with plain aiokafka on each of its listeners
(SCRAM-SHA-512/256, mutual TLS, OAUTHBEARER) and with Kafka's own console consumer, its ACLs enforced.

One broker for the module, started through the command line as a user starts it; its own data dir, free ports.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    TopicAuthorizationFailedError,
)
from aiokafka.helpers import create_ssl_context

from streamproc.devstack.client_properties import parse_properties
from streamproc.devstack.secure_broker import SecureBroker, SecureBrokerStatus, console_consumer_command
from streamproc.settings import Settings
from tests.unsecured_jws import unsecured_jws

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def streamproc(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAMPROC_DATA_DIR": str(data_dir), "STREAMPROC_LOCAL_KAFKA_PORT": "0",
           "STREAMPROC_LOCAL_KAFKA_CONTROLLER_PORT": "0"}
    env.pop("STREAMPROC_KAFKA_BOOTSTRAP", None)
    return subprocess.run([sys.executable, "-m", "streamproc", *args], env=env, capture_output=True, text=True,
                          timeout=240, check=False)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    data_dir = tmp_path_factory.mktemp("secure-broker")
    started = streamproc(data_dir, "broker", "start", "--secure")
    try:
        assert started.returncode == 0, started.stderr
        yield data_dir
    finally:
        streamproc(data_dir, "broker", "stop", "--secure")


@pytest.fixture(scope="module")
def secure(data_dir: Path) -> SecureBrokerStatus:
    status = SecureBroker(Settings(data_dir=data_dir)).status()
    assert status.running
    return status


def tls(status: SecureBrokerStatus, keystore: str | None = None) -> ssl.SSLContext:
    path = None if keystore is None else str(status.certificates[keystore])
    context: ssl.SSLContext = create_ssl_context(cafile=str(status.ca), certfile=path, keyfile=path)
    return context


def scram(status: SecureBrokerStatus, user: str, mechanism: str = "SCRAM-SHA-512",
          password: str | None = None) -> dict[str, Any]:
    return {"bootstrap_servers": status.listeners["scram"], "security_protocol": "SASL_SSL",
            "sasl_mechanism": mechanism, "sasl_plain_username": user,
            "sasl_plain_password": status.scram_passwords[user] if password is None else password,
            "ssl_context": tls(status)}


def mtls(status: SecureBrokerStatus, keystore: str) -> dict[str, Any]:
    return {"bootstrap_servers": status.listeners["mtls"], "security_protocol": "SSL",
            "ssl_context": tls(status, keystore)}


class UnsecuredToken(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka's abc is untyped
    def __init__(self, subject: str) -> None:
        self.subject = subject

    async def token(self) -> str:
        return unsecured_jws(self.subject)


def oauth(status: SecureBrokerStatus, subject: str) -> dict[str, Any]:
    return {"bootstrap_servers": status.listeners["oauth"], "security_protocol": "SASL_SSL",
            "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": UnsecuredToken(subject),
            "ssl_context": tls(status)}


def topic_name(kind: str) -> str:
    return f"llm.requests.t-{kind}-{uuid.uuid4().hex[:8]}"


async def create_topic(client: dict[str, Any], name: str) -> None:
    admin = AIOKafkaAdminClient(**client)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1)])
    finally:
        await admin.close()


async def round_trip(client: dict[str, Any], topic: str, values: list[bytes]) -> list[bytes]:
    """Create ``topic``, write ``values``, read them back from the start (no group)."""
    await create_topic(client, topic)
    producer = AIOKafkaProducer(**client, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(**client, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        batches = await consumer.getmany(timeout_ms=10_000, max_records=len(values))
        return [record.value for records in batches.values() for record in records if record.value is not None]
    finally:
        await consumer.stop()


async def test_scram_sha512_round_trip(secure: SecureBrokerStatus) -> None:
    values = [b"scram-%d" % i for i in range(5)]
    assert await round_trip(scram(secure, "worker"), topic_name("scram"), values) == values


async def test_scram_sha256_is_enabled_too(secure: SecureBrokerStatus) -> None:
    assert await round_trip(scram(secure, "worker", "SCRAM-SHA-256"), topic_name("scram256"), [b"x"]) == [b"x"]


async def test_wrong_scram_password_is_refused(secure: SecureBrokerStatus) -> None:
    async def connects(password: str) -> KafkaError | None:
        producer = AIOKafkaProducer(**scram(secure, "worker", password=password), request_timeout_ms=10_000)
        try:
            await producer.start()
        except KafkaError as exc:
            return exc
        finally:
            await producer.stop()
        return None

    refused = await connects("not-the-password")
    print(f"wrong password: {refused!r}")
    assert isinstance(refused, KafkaConnectionError)  # aiokafka reports the broker closing the connection
    assert await connects(secure.scram_passwords["worker"]) is None  # the same client, the right password


async def test_mtls_round_trip(secure: SecureBrokerStatus) -> None:
    values = [b"mtls-%d" % i for i in range(3)]
    assert await round_trip(mtls(secure, "worker"), topic_name("mtls"), values) == values


async def test_an_expired_client_certificate_is_refused(secure: SecureBrokerStatus) -> None:
    producer = AIOKafkaProducer(**mtls(secure, "worker-expired"), request_timeout_ms=10_000)
    with pytest.raises(KafkaError) as refused:
        await producer.start()
    await producer.stop()
    print(f"expired certificate: {refused.value!r}")


async def test_oauthbearer_round_trip_with_an_unsecured_token(secure: SecureBrokerStatus) -> None:
    values = [b"oauth-%d" % i for i in range(3)]
    assert await round_trip(oauth(secure, "worker"), topic_name("oauth"), values) == values


async def test_acls_let_each_principal_do_its_part_and_nothing_else(secure: SecureBrokerStatus) -> None:
    worker, submitter = scram(secure, "worker"), scram(secure, "submitter")
    await create_topic(worker, "llm.requests")
    await create_topic(worker, "llm.results")
    producer = AIOKafkaProducer(**submitter, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait("llm.requests", b"a request")  # granted
        with pytest.raises(TopicAuthorizationFailedError) as refused:  # only workers write results
            await producer.send_and_wait("llm.results", b"a forged result")
        print(f"submitter writing llm.results: {refused.value!r}")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer("llm.requests", **submitter, group_id="streamproc", enable_auto_commit=False,
                                auto_offset_reset="earliest")
    try:  # the submitter may describe the workers' group, never join it
        with pytest.raises(GroupAuthorizationFailedError):
            await consumer.start()
    finally:
        await consumer.stop()


@pytest.fixture(scope="module")
def console_topic(secure: SecureBrokerStatus) -> tuple[str, list[bytes]]:
    import asyncio

    topic, values = topic_name("console"), [b"console-%d" % i for i in range(3)]
    assert asyncio.run(round_trip(scram(secure, "worker"), topic, values)) == values
    return topic, values


@pytest.mark.parametrize(("config", "listener"), [("worker-scram", "scram"), ("worker-oauth-unsecured", "oauth")])
def test_kafka_s_console_consumer_reads_with_the_worker_files(secure: SecureBrokerStatus, data_dir: Path,
                                                               console_topic: tuple[str, list[bytes]], config: str,
                                                               listener: str) -> None:
    topic, values = console_topic
    path = secure.client_properties[config]
    assert parse_properties(path.read_text())["bootstrap.servers"] == secure.listeners[listener]
    started = time.monotonic()
    proc = subprocess.run(console_consumer_command(Settings(data_dir=data_dir), secure.home, secure.listeners[listener],
                                                   path, topic, max_messages=3, timeout_ms=30_000),
                          capture_output=True, text=True, timeout=120, check=False)
    print(f"console consumer with {config}: {time.monotonic() - started:.1f}s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [value.decode() for value in values]


def test_kafka_s_console_consumer_is_refused_what_the_sink_may_not_read(
        secure: SecureBrokerStatus, data_dir: Path, console_topic: tuple[str, list[bytes]]) -> None:
    topic, _ = console_topic  # under llm.requests: the workers' input, not the sink's
    proc = subprocess.run(console_consumer_command(Settings(data_dir=data_dir), secure.home, secure.listeners["scram"],
                                                   secure.client_properties["sink-scram"], topic, max_messages=3,
                                                   timeout_ms=30_000),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout == ""  # the tool exits 0 after the error: its output and log say what happened
    assert f"TopicAuthorizationException: Not authorized to access topics: [{topic}]" in proc.stderr


def test_status_json_names_listeners_and_files_without_secrets(data_dir: Path, secure: SecureBrokerStatus) -> None:
    proc = streamproc(data_dir, "broker", "status", "--secure", "--json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["running"] is True
    assert set(document["listeners"]) == {"scram", "mtls", "oauth"}
    assert {"worker-scram", "worker-mtls", "submitter-scram", "sink-scram", "broker-admin"} <= \
        set(document["client_properties"])
    for password in secure.scram_passwords.values():
        assert password not in proc.stdout
    assert streamproc(data_dir, "broker", "status", "--secure", "--bootstrap").stdout.strip() == \
        secure.listeners["scram"]
