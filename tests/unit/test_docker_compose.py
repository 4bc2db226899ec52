"""docker-compose.yml is valid, runs the same Kafka version as the built-in broker, has no default password, pins its
images, and serves Kafka only over TLS with SCRAM logins (docs/security.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamproc.settings import DEFAULT_KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
# what `.env` must give: the validator refuses the file without them
REQUIRED_VARIABLES = ("KAFKA_WORKER_PASSWORD", "KAFKA_OPERATOR_PASSWORD", "GRAFANA_ADMIN_PASSWORD")


def compose_command() -> list[str] | None:
    """`docker compose` (the v2 plugin) when installed, else the standalone `docker-compose`."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                 check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def validate(path: Path, variables: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = compose_command()
    assert command is not None
    env = {key: value for key, value in os.environ.items() if key not in REQUIRED_VARIABLES}
    env.update(variables if variables is not None else dict.fromkeys(REQUIRED_VARIABLES, "a-test-password-1"))
    # --project-directory: a .env next to the file (a developer's own) must not fill the variables in
    return subprocess.run([*command, "-f", str(path), "--project-directory", str(path.parent), "config", "--quiet"],
                          capture_output=True, text=True, timeout=60, check=False, env=env, cwd=path.parent)


def services() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return loaded


def test_compose_uses_the_local_broker_version() -> None:
    kafka = services()["kafka"]
    assert kafka["image"] == f"apache/kafka:{DEFAULT_KAFKA_VERSION}"
    assert services()["kafka-init"]["image"] == kafka["image"]
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"


def test_every_image_is_pinned_to_an_exact_version() -> None:
    for name, service in services().items():
        if "build" in service:  # built here from the pinned Dockerfile
            continue
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+(:v?\d+\.\d+\.\d+[\w.-]*)(@sha256:[0-9a-f]{64})?", image), (name, image)
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    [base] = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-[\w.-]+(@sha256:[0-9a-f]{64})?", base), base
    assert "-c constraints.txt" in dockerfile


def test_no_password_has_a_default() -> None:
    text = COMPOSE.read_text()
    for variable in REQUIRED_VARIABLES:
        assert re.search(r"\$\{" + variable + r":\?", text), variable  # required, with a message
        assert not re.search(r"\$\{" + variable + r":?-", text), variable  # never a fallback value
    assert "GF_SECURITY_ADMIN_PASSWORD: ${GRAFANA_ADMIN_PASSWORD:?" in text


def test_kafka_listens_to_clients_only_over_tls_with_scram() -> None:
    env = services()["kafka"]["environment"]
    protocols = dict(pair.split(":") for pair in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = dict(entry.split("://") for entry in env["KAFKA_LISTENERS"].split(","))
    advertised = dict(entry.split("://") for entry in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert protocols["HOST"] == "SASL_SSL"
    assert advertised["HOST"] == "127.0.0.1:9092"
    for name in advertised:  # every listener a client can be told about
        assert protocols[name] == "SASL_SSL", name
    for name, address in listeners.items():  # a plaintext listener only on the container's loopback
        if protocols[name] == "PLAINTEXT":
            assert address.startswith("127.0.0.1:"), (name, address)
    assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert services()["kafka"]["ports"] == ["127.0.0.1:9092:9092"]


def test_the_worker_logs_in_with_scram_over_tls() -> None:
    worker = services()["worker"]
    env = worker["environment"]
    assert env["STREAMPROC_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert env["STREAMPROC_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert "STREAMPROC_KAFKA_SASL_PASSWORD" not in env  # a file, out of `docker inspect`
    assert env["STREAMPROC_KAFKA_SASL_PASSWORD_FILE"] == "/run/secrets/streamproc/kafka-sasl-password"
    assert env["STREAMPROC_KAFKA_SSL_CAFILE"] == "/kafka-ca/ca.pem"
    assert {"kafka-ca:/kafka-ca:ro", "worker-secrets:/run/secrets/streamproc:ro"} <= set(worker["volumes"])
    assert "${KAFKA_WORKER_PASSWORD:?" in services()["kafka-init"]["environment"]["WORKER_PASSWORD"]
    assert not any(str(volume).startswith("kafka-secrets") for volume in worker["volumes"])  # never the broker's keys
    assert worker["depends_on"]["kafka"]["condition"] == "service_healthy"
    init = services()["kafka-init"]
    assert services()["kafka"]["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert init["environment"]["CLUSTER_ID"] == services()["kafka"]["environment"]["CLUSTER_ID"]


def test_secrets_stay_out_of_the_image_and_env_example_names_every_required_variable() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ".env" in ignored
    example = (ROOT / ".env.example").read_text()
    for variable in REQUIRED_VARIABLES:
        assert re.search(rf"^{variable}=$", example, re.MULTILINE), variable  # listed, and left empty


@pytest.mark.skipif(compose_command() is None, reason="neither `docker compose` nor `docker-compose` is installed")
def test_compose_file_validates(tmp_path: Path) -> None:
    copy = tmp_path / "docker-compose.yml"  # in its own directory: no .env there
    copy.write_text(COMPOSE.read_text())
    result = validate(copy)
    assert result.returncode == 0, result.stderr
    broken = tmp_path / "broken" / "docker-compose.yml"  # the validator really checks: a broken file is refused
    broken.parent.mkdir()
    broken.write_text(COMPOSE.read_text().replace("    ports:\n", "    bogus_option: 1\n    ports:\n"))
    assert validate(broken).returncode != 0


@pytest.mark.skipif(compose_command() is None, reason="neither `docker compose` nor `docker-compose` is installed")
@pytest.mark.parametrize("missing", REQUIRED_VARIABLES)
def test_compose_refuses_to_start_without_a_password(tmp_path: Path, missing: str) -> None:
    copy = tmp_path / "docker-compose.yml"
    copy.write_text(COMPOSE.read_text())
    variables = {name: "a-test-password-1" for name in REQUIRED_VARIABLES if name != missing}
    result = validate(copy, variables)
    assert result.returncode != 0
    assert missing in result.stderr
