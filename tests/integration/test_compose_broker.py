"""The compose stack's broker settings, run without Docker: docker/kafka-init.sh makes the CA, keystore and SCRAM
users with the real keytool and Kafka 3.9.2 storage tool; the kafka service's KAFKA_* environment becomes
server.properties by the image's rule (and its run script's keystore lines); then real clients log in. What Docker
adds (the image's scripts, the volumes' owners) is not covered here."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.helpers import create_ssl_context

from streamproc.devstack.broker import ensure_jars, free_port
from streamproc.settings import Settings

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("java") is None or shutil.which("keytool") is None, reason="needs java, keytool"),
]

ROOT = Path(__file__).resolve().parents[2]
SERVICES = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
WORKER_PASSWORD = "worker-password-1"
OPERATOR_PASSWORD = "operator-password-1"


def image_properties(env: dict[str, object]) -> dict[str, str]:
    """The apache/kafka image's rule: KAFKA_A_B -> a.b, __ -> _, ___ -> -; KAFKA_OPTS stays an environment variable."""
    properties = {}
    for key, value in env.items():
        if key.startswith("KAFKA_") and key != "KAFKA_OPTS":
            name = key.removeprefix("KAFKA_").lower().replace("_", ".").replace("...", "-").replace("..", "_")
            properties[name] = str(value)
    return properties


@dataclass
class ComposeBroker:
    host_bootstrap: str
    internal_bootstrap: str  # the compose network's listener (kafka:19092 there)
    dirs: dict[str, Path]  # the volumes kafka-init filled: secrets, ca, data, worker-secrets
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def ca_file(self) -> Path:
        return self.dirs["ca"] / "ca.pem"


def run_init(tmp: Path, jars: Path, controller_port: int) -> dict[str, Path]:
    dirs = {name: tmp / name for name in ("secrets", "ca", "data", "worker-secrets")}
    for path in dirs.values():
        path.mkdir()
    storage_tool = tmp / "kafka-storage.sh"
    storage_tool.write_text(f"#!/bin/sh\nexec java -cp '{jars}/*' kafka.tools.StorageTool \"$@\"\n")
    storage_tool.chmod(0o755)
    init_env = SERVICES["kafka-init"]["environment"]
    env = {**os.environ, "KAFKA_INIT_SECRETS_DIR": str(dirs["secrets"]), "KAFKA_INIT_CA_DIR": str(dirs["ca"]),
           "KAFKA_INIT_DATA_DIR": str(dirs["data"]), "KAFKA_INIT_STORAGE_TOOL": str(storage_tool),
           "KAFKA_INIT_WORKER_SECRETS_DIR": str(dirs["worker-secrets"]),
           "CLUSTER_ID": init_env["CLUSTER_ID"], "KAFKA_NODE_ID": str(init_env["KAFKA_NODE_ID"]),
           "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@127.0.0.1:{controller_port}",
           "WORKER_PASSWORD": WORKER_PASSWORD, "OPERATOR_PASSWORD": OPERATOR_PASSWORD}
    for _ in range(2):  # a second run (the next `up`) keeps what the first made
        init = subprocess.run(["bash", str(ROOT / "docker" / "kafka-init.sh")], env=env, capture_output=True,
                              text=True, timeout=180, check=False)
        assert init.returncode == 0, init.stdout + init.stderr
    return dirs


@pytest.fixture(scope="module")
def compose_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeBroker]:
    tmp = tmp_path_factory.mktemp("compose-broker")
    jars = ensure_jars(Settings())
    host_port, internal_port, controller_port = free_port(), free_port(), free_port()
    dirs = run_init(tmp, jars, controller_port)
    secrets = dirs["secrets"]

    env = dict(SERVICES["kafka"]["environment"])
    text = yaml.safe_dump(env)  # the container's paths and ports, moved to this test's
    for old, new in (("/etc/kafka/secrets", str(secrets)), ("/var/lib/kafka/data", str(dirs["data"])),
                     ("kafka:19092", f"localhost:{internal_port}"), (":19092", f":{internal_port}"),
                     ("127.0.0.1:9093", f"127.0.0.1:{controller_port}"), (":9092", f":{host_port}")):
        text = text.replace(old, new)
    env = yaml.safe_load(text)
    properties = image_properties(env)
    # what the image's run script adds for an SSL listener: the keystore and its passwords from the files named
    properties["ssl.keystore.location"] = str(secrets / env["KAFKA_SSL_KEYSTORE_FILENAME"])
    properties["ssl.keystore.password"] = (secrets / env["KAFKA_SSL_KEYSTORE_CREDENTIALS"]).read_text()
    properties["ssl.key.password"] = (secrets / env["KAFKA_SSL_KEY_CREDENTIALS"]).read_text()
    server_properties = tmp / "server.properties"
    server_properties.write_text("".join(f"{key}={value}\n" for key, value in sorted(properties.items())))
    log4j = tmp / "log4j.properties"
    log4j.write_text("log4j.rootLogger=INFO, stdout\nlog4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
                     "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n")
    log = tmp / "broker.log"
    with log.open("wb") as out:
        process = subprocess.Popen(["java", "-Xmx512m", f"-Dlog4j.configuration=file:{log4j}",
                                    *env["KAFKA_OPTS"].split(), "-cp", f"{jars}/*", "kafka.Kafka",
                                    str(server_properties)], stdout=out, stderr=subprocess.STDOUT)
    broker = ComposeBroker(f"127.0.0.1:{host_port}", f"localhost:{internal_port}", dirs, process, log)
    try:
        for _ in range(600):
            if process.poll() is not None:
                pytest.fail("the broker exited:\n" + log.read_text()[-4000:])
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", host_port)) == 0:
                    break
            time.sleep(0.1)
        yield broker
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def client_settings(broker: ComposeBroker, username: str, password: str) -> dict[str, object]:
    return {"bootstrap_servers": broker.host_bootstrap, "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": username, "sasl_plain_password": password,
            "ssl_context": create_ssl_context(cafile=str(broker.ca_file))}


async def round_trip(broker: ComposeBroker, topic: str) -> list[bytes]:
    admin = AIOKafkaAdminClient(**client_settings(broker, "operator", OPERATOR_PASSWORD))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(**client_settings(broker, "worker", WORKER_PASSWORD), acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"over TLS with SCRAM")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, **client_settings(broker, "worker", WORKER_PASSWORD),
                                auto_offset_reset="earliest", group_id="compose-test")
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=20_000, max_records=1)
        return [record.value for records in batch.values() for record in records if record.value is not None]
    finally:
        await consumer.stop()


def test_the_users_log_in_over_tls_and_a_record_goes_round(compose_broker: ComposeBroker) -> None:
    assert asyncio.run(round_trip(compose_broker, "compose-check")) == [b"over TLS with SCRAM"]


async def refused(broker: ComposeBroker, **overrides: object) -> bool:
    producer = AIOKafkaProducer(**{**client_settings(broker, "worker", "not-the-password"), **overrides},
                                request_timeout_ms=5_000)
    try:
        await asyncio.wait_for(producer.start(), 30)
    except KafkaError:  # KafkaConnectionError among them: the broker closed the connection
        return True
    await producer.stop()
    return False


def test_a_wrong_password_and_a_plaintext_client_are_refused(compose_broker: ComposeBroker) -> None:
    assert not asyncio.run(refused(compose_broker, sasl_plain_password=WORKER_PASSWORD))  # the control
    assert asyncio.run(refused(compose_broker))
    assert asyncio.run(refused(compose_broker, sasl_plain_username="operator"))
    assert asyncio.run(refused(compose_broker, security_protocol="PLAINTEXT", ssl_context=None))


def test_the_healthcheck_command_succeeds(compose_broker: ComposeBroker) -> None:
    """The kafka service's healthcheck, with its client file made by kafka-init, as the Java tools run it."""
    healthcheck = SERVICES["kafka"]["healthcheck"]["test"][1]
    assert "--command-config /etc/kafka/secrets/healthcheck.properties" in healthcheck
    secrets = compose_broker.dirs["secrets"]
    jars = ensure_jars(Settings())
    result = subprocess.run(["java", "-cp", f"{jars}/*", "kafka.admin.BrokerApiVersionsCommand", "--bootstrap-server",
                             compose_broker.host_bootstrap.replace("127.0.0.1", "localhost"), "--command-config",
                             str(secrets / "healthcheck.properties")],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "(id: 1 rack: null)" in result.stdout, result.stdout[-2000:]



def lag(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`streamproc lag` of a group nobody joined: exits 2 (unknown group) once it reached the broker, 3 when not."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("STREAMPROC_KAFKA")}
    return subprocess.run([sys.executable, "-m", "streamproc", "lag", "--group", "nobody", "--json"],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False)


def test_the_host_commands_connect_as_the_compose_header_says(compose_broker: ComposeBroker, tmp_path: Path) -> None:
    """streamproc's own client settings (STREAMPROC_KAFKA_*) as the compose file's header gives them."""
    password_file = tmp_path / "operator-password"
    password_file.write_text(OPERATOR_PASSWORD + "\n")
    env = {"STREAMPROC_DATA_DIR": str(tmp_path), "STREAMPROC_KAFKA_BOOTSTRAP": compose_broker.host_bootstrap,
           "STREAMPROC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "STREAMPROC_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "STREAMPROC_KAFKA_SASL_USERNAME": "operator", "STREAMPROC_KAFKA_SASL_PASSWORD_FILE": str(password_file),
           "STREAMPROC_KAFKA_SSL_CAFILE": str(compose_broker.ca_file)}
    reached = lag(env)
    assert reached.returncode == 2, reached.stdout + reached.stderr
    assert "does not exist" in reached.stderr, reached.stderr
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    refused = lag({**env, "STREAMPROC_KAFKA_SASL_PASSWORD_FILE": str(wrong)})
    assert refused.returncode == 3, refused.stdout + refused.stderr


def test_the_compose_workers_settings_reach_the_internal_listener(compose_broker: ComposeBroker,
                                                                   tmp_path: Path) -> None:
    """The worker service's STREAMPROC_KAFKA_* as written, its paths moved to the volumes kafka-init filled."""
    env = {key: str(value) for key, value in SERVICES["worker"]["environment"].items()
           if key.startswith("STREAMPROC_KAFKA")}
    assert env.pop("STREAMPROC_KAFKA_BOOTSTRAP") == "kafka:19092"
    env["STREAMPROC_KAFKA_BOOTSTRAP"] = compose_broker.internal_bootstrap
    env["STREAMPROC_KAFKA_SSL_CAFILE"] = env["STREAMPROC_KAFKA_SSL_CAFILE"].replace(
        "/kafka-ca", str(compose_broker.dirs["ca"]))
    env["STREAMPROC_KAFKA_SASL_PASSWORD_FILE"] = env["STREAMPROC_KAFKA_SASL_PASSWORD_FILE"].replace(
        "/run/secrets/streamproc", str(compose_broker.dirs["worker-secrets"]))
    reached = lag({**env, "STREAMPROC_DATA_DIR": str(tmp_path)})
    assert reached.returncode == 2, reached.stdout + reached.stderr
    assert "does not exist" in reached.stderr, reached.stderr
