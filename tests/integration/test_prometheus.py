"""A real Prometheus (Debian's ``prometheus`` package) scrapes a running worker: its series arrive, the alert rules
load and evaluate, and every query of the Grafana dashboard is one Prometheus accepts."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamproc.devstack.broker import free_port
from streamproc.processes import stop_process
from streamproc.settings import Settings
from tests.integration.pipeline import (
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce_requests,
    start_mock,
    worker_env,
)
from tests.unit.test_monitoring_config import dashboard_queries

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PRICES = {"mock-small": (1.0, 2.0)}  # US dollars per million input / output tokens


class Prometheus:
    """A Prometheus server on a free port of 127.0.0.1 that scrapes ``target`` every second."""

    def __init__(self, target: str, workdir: Path) -> None:
        config = yaml.safe_load((ROOT / "docker/prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(ROOT / "docker/alerts.yml")]
        del config["alerting"]  # no Alertmanager here: the rules still evaluate
        [job] = config["scrape_configs"]
        del job["dns_sd_configs"]
        job["static_configs"] = [{"targets": [target]}]
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        binary = shutil.which("prometheus")
        assert binary is not None, "prometheus is not installed: apt-get install prometheus (scripts/system-deps does)"
        self.port = free_port()
        self.log = workdir / "prometheus.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:  # a refused query answers 400 with the reason as JSON
            return json.loads(error.read())

    def value(self, query: str) -> float | None:
        """The single value of an instant query, None while it has no result (or Prometheus is not up)."""
        try:
            answer = self.api("query", query=query)
        except OSError:
            return None
        result = answer.get("data", {}).get("result", [])
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def wait_for(self, query: str, wanted: float, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while (seen := self.value(query)) != wanted:
            assert time.monotonic() < deadline, f"{query} = {seen}, not {wanted}\n{self.log.read_text()[-3000:]}"
            time.sleep(0.5)

    def stop(self) -> None:
        stop_process(self.process, 30)


async def test_prometheus_scrapes_a_running_worker(settings: Settings, tmp_path: Path) -> None:
    assert settings.kafka_bootstrap is not None
    port = free_port()
    mock = start_mock("clean")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", worker_metrics_port=str(port),
                                      model_prices=json.dumps(PRICES)), tmp_path / "worker.log")
    requests = [chat_request(f"p-{i}", i) for i in range(10)]
    worker.start()
    (tmp_path / "prometheus").mkdir()
    prometheus = Prometheus(f"127.0.0.1:{port}", tmp_path / "prometheus")
    try:
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended([r.request_id for r in requests], 120, worker)
        assert not outcomes.unfinished(r.request_id for r in requests), worker.log_tail()

        await asyncio.to_thread(prometheus.wait_for, 'up{job="streamproc-worker"}', 1.0)
        calls = 'sum(streamproc_llm_calls_total{job="streamproc-worker",model="mock-small",outcome="success"})'
        await asyncio.to_thread(prometheus.wait_for, calls, 10.0)
        assert prometheus.value("sum(streamproc_results_total)") == 10
        tokens = {direction: prometheus.value(f'sum(streamproc_llm_tokens_total{{type="{direction}"}})')
                  for direction in ("input", "output")}
        assert tokens["input"] and tokens["output"], tokens  # the mock's answers carry usage
        cost = prometheus.value('sum(streamproc_estimated_cost_usd_total{model="mock-small"})')
        assert cost == pytest.approx((tokens["input"] * 1.0 + tokens["output"] * 2.0) / 1e6)
        p99 = prometheus.value('histogram_quantile(0.99, sum by (le) (streamproc_llm_latency_seconds_bucket))')
        assert p99 is not None and 0 < p99 < 5

        rules = prometheus.api("rules")["data"]["groups"]
        loaded = {rule["name"]: rule for group in rules for rule in group["rules"]}
        alerts = {rule["alert"] for group in yaml.safe_load((ROOT / "docker/alerts.yml").read_text())["groups"]
                  for rule in group["rules"]}
        assert set(loaded) == alerts
        lag_read = "max(streamproc_consumer_lag_updated_timestamp_seconds) > bool 0"  # every 10 s, from the start
        await asyncio.to_thread(prometheus.wait_for, lag_read, 1.0)
        await asyncio.to_thread(time.sleep, 2)  # a few evaluations of every rule against the live series
        rules = prometheus.api("rules")["data"]["groups"]
        assert {rule["name"]: (rule["health"], rule["state"]) for group in rules for rule in group["rules"]} == {
            name: ("ok", "inactive") for name in alerts}  # a healthy worker with no backlog fires nothing

        for query in dashboard_queries():  # as Grafana sends them: its variables filled in
            filled = query.replace("$__rate_interval", "1m").replace("$__range", "5m")
            answer = prometheus.api("query", query=filled)
            assert answer["status"] == "success", f"{query}: {answer.get('error')}"
    finally:
        prometheus.stop()
        worker.stop()
        mock.stop()
