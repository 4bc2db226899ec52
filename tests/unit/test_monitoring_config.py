"""The compose stack's services fit together: names, ports, paths, environment, healthchecks, metric names."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import generate_latest

from streamproc.app.metrics import WorkerMetrics
from streamproc.app.spend import SpendGate
from streamproc.core.events import InferenceRequest
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.lag import PartitionLag
from streamproc.core.spend_cap import Cap, Spend, day_scope
from streamproc.llm.client import CallResult
from streamproc.llm.guarded import Guards
from streamproc.mockllm.mock_llm_command import mock_llm
from streamproc.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docker/grafana/dashboards/streamproc.json"
# ${NAME}, ${NAME:-default} or ${NAME-default}: compose's interpolation (defaults here hold no braces)
VARIABLE = re.compile(r"\$\{(\w+)(?::?[-?]([^}]*))?\}")


def load(path: str) -> Any:
    return yaml.safe_load((ROOT / path).read_text())


def services() -> dict[str, Any]:
    result: dict[str, Any] = load("docker-compose.yml")["services"]
    return result


def unset(value: Any) -> str:
    """A compose value as the container gets it when no variable is set (the defaults of ``${NAME:-default}``)."""
    return VARIABLE.sub(lambda match: match.group(2) or "", str(value))


def mounts(service: str) -> dict[str, Path]:
    """Bind mounts of ``service``: path in the container -> file or directory of this repository."""
    return {volume.split(":")[1]: ROOT / volume.split(":")[0] for volume in services()[service]["volumes"]
            if volume.startswith("./")}


def exported_series() -> set[str]:
    """Every series name a worker exports (counters with ``_total``, histograms with their three suffixes)."""
    metrics = WorkerMetrics()
    metrics.set_lag([PartitionLag("g", "llm.requests", 0, 0, 1)], now=0.0)
    metrics.track_guards(Guards.from_settings(Settings(llm_rpm=60, llm_tpm=6000).guards, NeverCalled()))
    metrics.track_hedges(lambda: 0)
    gate = SpendGate(lambda _batch: None, {}, TokenEstimator(), Cap(max_cost_usd=1.0))
    gate.ledger.begin([(day_scope(0), Cap(max_cost_usd=1.0))], Spend(0.1, 10))  # a cap charged: its series exist
    metrics.track_spend(gate)
    text = generate_latest(metrics.registry).decode()
    suffixes = {"counter": ("", "_total"), "histogram": ("_bucket", "_count", "_sum")}
    return {name.removesuffix("_total") + suffix if kind == "counter" else name + suffix
            for name, kind in re.findall(r"^# TYPE (\S+) (\w+)", text, re.MULTILINE)
            for suffix in suffixes.get(kind, ("",))}


def test_worker_environment_names_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("STREAMPROC_")]:
        monkeypatch.delenv(name)
    for name, value in services()["worker"]["environment"].items():
        monkeypatch.setenv(name, unset(value))  # empty ones too: compose passes them as empty strings
    settings = Settings()  # extra="forbid": a misspelt variable fails here
    assert settings.worker_metrics_port == 9464
    assert settings.worker_metrics_host == "0.0.0.0"
    assert settings.llm_base_url == "http://mock-llm:8100/v1"  # no .env: the stack's mock server
    assert settings.llm_api_key is None and settings.model_prices == {}


def test_the_llm_endpoint_key_and_prices_come_from_the_environment() -> None:
    env = services()["worker"]["environment"]
    for name in ("STREAMPROC_LLM_BASE_URL", "STREAMPROC_LLM_API_KEY", "STREAMPROC_MODEL_PRICES"):
        match = VARIABLE.fullmatch(str(env[name]))
        assert match is not None and match.group(1) == name, f"{name} is not read from the environment"


def test_env_example_lists_exactly_the_variables_compose_reads() -> None:
    used = {match.group(1) for match in VARIABLE.finditer((ROOT / "docker-compose.yml").read_text())}
    listed = {line.split("=", 1)[0].lstrip("#") for line in (ROOT / ".env.example").read_text().splitlines()
              if re.match(r"#?[A-Z_]+=", line)}
    assert used == listed


def test_every_service_has_a_healthcheck() -> None:
    """Long-running services do; a one-shot step is waited for by its completion instead."""
    one_shot = {name for service in services().values() for name, when in service.get("depends_on", {}).items()
                if isinstance(when, dict) and when.get("condition") == "service_completed_successfully"}
    for name, service in services().items():
        if name not in one_shot:
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_healthchecks_ask_the_ports_the_services_listen_on() -> None:
    def checked_url(service: str) -> str:
        [url] = re.findall(r"http://[^'\" ]+", " ".join(services()[service]["healthcheck"]["test"]))
        return str(url)

    metrics_port = int(services()["worker"]["environment"]["STREAMPROC_WORKER_METRICS_PORT"])
    assert urlsplit(checked_url("worker")).port == metrics_port
    assert checked_url("mock-llm") == "http://127.0.0.1:8100/healthz"
    for service, port in (("prometheus", 9090), ("alertmanager", 9093), ("grafana", 3000)):
        assert urlsplit(checked_url(service)).port == port
        assert f"127.0.0.1:{port}:{port}" in services()[service]["ports"]


def test_kafka_writes_its_log_into_the_volume() -> None:
    kafka = services()["kafka"]
    mounts = dict(volume.split(":")[::-1] for volume in kafka["volumes"])  # path -> volume
    log_dirs = kafka["environment"]["KAFKA_LOG_DIRS"]  # the image's default is /tmp/kraft-combined-logs
    assert mounts.get(log_dirs) in load("docker-compose.yml")["volumes"]


def test_images_are_built_from_the_dockerfile() -> None:
    for name in ("worker", "mock-llm"):
        build = services()[name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).is_file()


def test_mock_llm_command_parses() -> None:
    command = services()["mock-llm"]["command"]
    assert command[0] == "mock-llm"
    context = mock_llm.make_context("mock-llm", list(command[1:]))
    assert (context.params["host"], context.params["port"]) == ("0.0.0.0", 8100)
    assert "mock-llm:8100" in unset(services()["worker"]["environment"]["STREAMPROC_LLM_BASE_URL"])


def test_prometheus_scrapes_the_worker_port_and_loads_the_rules() -> None:
    mounted = mounts("prometheus")
    config = yaml.safe_load(mounted["/etc/prometheus/prometheus.yml"].read_text())
    [job] = config["scrape_configs"]
    [discovery] = job["dns_sd_configs"]
    assert discovery["names"] == ["worker"]
    assert discovery["port"] == int(services()["worker"]["environment"]["STREAMPROC_WORKER_METRICS_PORT"])
    for rule_file in config["rule_files"]:
        assert rule_file in mounted, f"{rule_file} is not mounted into the prometheus container"
        assert mounted[rule_file].is_file()


def test_prometheus_sends_alerts_to_the_alertmanager() -> None:
    config = yaml.safe_load(mounts("prometheus")["/etc/prometheus/prometheus.yml"].read_text())
    [manager] = config["alerting"]["alertmanagers"]
    [static] = manager["static_configs"]
    assert static["targets"] == ["alertmanager:9093"]
    alertmanager = services()["alertmanager"]
    config_flag = next(arg for arg in alertmanager["command"] if arg.startswith("--config.file="))
    assert mounts("alertmanager")[config_flag.split("=", 1)[1]].is_file()


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    mounted = mounts("grafana")
    provisioning = mounted["/etc/grafana/provisioning"]
    [source] = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"]
    assert (source["type"], source["url"]) == ("prometheus", "http://prometheus:9090")
    [provider] = yaml.safe_load((provisioning / "dashboards/streamproc.yml").read_text())["providers"]
    assert mounted[provider["options"]["path"]] == DASHBOARD.parent
    home = services()["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert mounted[str(Path(home).parent)] / Path(home).name == DASHBOARD
    panels = [panel for panel in json.loads(DASHBOARD.read_text())["panels"] if panel["type"] != "row"]
    assert {panel["datasource"]["uid"] for panel in panels} == {source["uid"]}


def dashboard_queries() -> list[str]:
    return [target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"]
            for target in panel.get("targets", [])]


def test_dashboard_uses_only_metrics_the_worker_exports() -> None:
    exported = exported_series()
    used = {name for query in dashboard_queries() for name in re.findall(r"\bstreamproc_\w+", query)}
    assert used, "the dashboard queries no streamproc series"
    assert used <= exported, f"not exported by the worker: {sorted(used - exported)}"


def test_dashboard_shows_the_golden_signals() -> None:
    queries = "\n".join(dashboard_queries())
    for needed in ("streamproc_results_total", "streamproc_failures_total", 'code="rate_limit_exceeded"',
                   "histogram_quantile(0.99, sum by (model, le) (rate(streamproc_llm_latency_seconds_bucket",
                   "histogram_quantile(0.5, sum by (model, le) (rate(streamproc_llm_latency_seconds_bucket",
                   "streamproc_consumer_lag", "deriv(", 'streamproc_circuit_breaker_state{state="open"}',
                   "streamproc_retry_budget_exhausted_total", "streamproc_llm_tokens_total",
                   "streamproc_estimated_cost_usd_total"):
        assert needed in queries, needed


def test_dashboard_and_alerts_show_paused_models_and_tenants() -> None:
    queries = "\n".join(dashboard_queries())
    rules = {rule["alert"]: rule["expr"] for group in load("docker/alerts.yml")["groups"] for rule in group["rules"]}
    assert "max by (model) (streamproc_model_paused)" in queries
    assert "max by (tenant, model) (streamproc_tenant_paused)" in queries
    assert rules["StreamprocTenantPaused"] == "max by (tenant, model) (streamproc_tenant_paused) == 1"


def test_alert_rules_use_metrics_the_worker_exposes() -> None:
    exported = exported_series()
    rules = [rule for group in load("docker/alerts.yml")["groups"] for rule in group["rules"]]
    assert {"StreamprocLagBacklog", "StreamprocCircuitBreakerOpen", "StreamprocRetryBudgetExhausted"} <= {
        rule["alert"] for rule in rules}
    for rule in rules:
        for name in re.findall(r"\bstreamproc_\w+", rule["expr"]):
            assert name in exported, f"{rule['alert']} uses {name}, which the worker does not expose"


class NeverCalled:
    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        raise AssertionError("no call in a configuration test")
