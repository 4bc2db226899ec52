"""The compose stack's worker, mock server and Prometheus fit together: names, ports, paths, metric names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import generate_latest

from streamproc.app.metrics import WorkerMetrics
from streamproc.core.events import InferenceRequest
from streamproc.core.lag import PartitionLag
from streamproc.llm.client import CallResult
from streamproc.llm.guarded import Guards
from streamproc.mockllm.cli import mock_llm
from streamproc.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def load(path: str) -> Any:
    return yaml.safe_load((ROOT / path).read_text())


def services() -> dict[str, Any]:
    result: dict[str, Any] = load("docker-compose.yml")["services"]
    return result


def test_worker_environment_names_real_settings() -> None:
    env = services()["worker"]["environment"]
    fields = {key.removeprefix("STREAMPROC_").lower(): str(value) for key, value in env.items()}
    settings = Settings(**fields)  # type: ignore[arg-type]  # extra="forbid": a misspelt variable fails here
    assert settings.worker_metrics_port == 9464
    assert settings.worker_metrics_host == "0.0.0.0"
    assert settings.llm_base_url == "http://mock-llm:8100/v1"


def test_images_are_built_from_the_dockerfile() -> None:
    for name in ("worker", "mock-llm"):
        build = services()[name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).is_file()


def test_mock_llm_command_parses() -> None:
    command = services()["mock-llm"]["command"]
    assert command[0] == "mock-llm"
    context = mock_llm.make_context("mock-llm", list(command[1:]))
    assert (context.params["host"], context.params["port"]) == ("0.0.0.0", 8100)
    assert "mock-llm:8100" in services()["worker"]["environment"]["STREAMPROC_LLM_BASE_URL"]


def test_prometheus_scrapes_the_worker_port_and_loads_the_rules() -> None:
    prometheus = services()["prometheus"]
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in prometheus["volumes"] if ":" in volume
              and volume.startswith("./")}
    config = load(mounts["/etc/prometheus/prometheus.yml"].removeprefix("./"))
    [job] = config["scrape_configs"]
    [discovery] = job["dns_sd_configs"]
    assert discovery["names"] == ["worker"]
    assert discovery["port"] == int(services()["worker"]["environment"]["STREAMPROC_WORKER_METRICS_PORT"])
    for rule_file in config["rule_files"]:
        assert rule_file in mounts, f"{rule_file} is not mounted into the prometheus container"
        assert (ROOT / mounts[rule_file]).is_file()


def test_alert_rules_use_metrics_the_worker_exposes() -> None:
    metrics = WorkerMetrics()
    metrics.set_lag([PartitionLag("g", "llm.requests", 0, 0, 1)], now=0.0)
    metrics.track_guards(Guards.from_settings(Settings(llm_base_url="http://llm"), NeverCalled()))
    text = generate_latest(metrics.registry).decode()
    exposed = {name + suffix for name, kind in re.findall(r"^# TYPE (\S+) (\w+)", text, re.MULTILINE)
               for suffix in (("", "_total") if kind == "counter" else ("",))}
    rules = [rule for group in load("docker/alerts.yml")["groups"] for rule in group["rules"]]
    assert {"StreamprocLagBacklog", "StreamprocCircuitBreakerOpen", "StreamprocRetryBudgetExhausted"} <= {
        rule["alert"] for rule in rules}
    for rule in rules:
        for name in re.findall(r"\bstreamproc_\w+", rule["expr"]):
            assert name in exposed, f"{rule['alert']} uses {name}, which the worker does not expose"


class NeverCalled:
    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        raise AssertionError("no call in a configuration test")
