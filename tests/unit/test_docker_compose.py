"""docker-compose.yml is valid and runs the same Kafka version as the built-in broker."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from streamproc.settings import DEFAULT_KAFKA_VERSION

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def compose_command() -> list[str] | None:
    """`docker compose` (the v2 plugin) when installed, else the standalone `docker-compose`."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                 check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    command = compose_command()
    assert command is not None
    return subprocess.run([*command, "-f", str(path), "config", "--quiet"], capture_output=True, text=True,
                          timeout=60, check=False)


def test_compose_uses_the_local_broker_version() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert services["kafka"]["image"] == f"apache/kafka:{DEFAULT_KAFKA_VERSION}"
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"


@pytest.mark.skipif(compose_command() is None, reason="neither `docker compose` nor `docker-compose` is installed")
def test_compose_file_validates(tmp_path: Path) -> None:
    result = validate(COMPOSE)
    assert result.returncode == 0, result.stderr
    broken = tmp_path / "docker-compose.yml"  # the validator really checks: a broken file is refused
    broken.write_text(COMPOSE.read_text().replace("    ports:\n", "    bogus_option: 1\n    ports:\n"))
    assert validate(broken).returncode != 0
