"""The monitoring configuration checked by the tools of Debian's prometheus and prometheus-alertmanager packages
(scripts/system-deps installs them): promtool checks the rules and runs their unit tests, amtool checks the
Alertmanager's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = shutil.which(tool)
    assert path is not None, f"{tool} is not installed: apt-get install prometheus prometheus-alertmanager"
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=120, check=False)


def test_rules_are_valid() -> None:
    result = run("promtool", "check", "rules", str(DOCKER / "alerts.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_passes_its_unit_tests() -> None:
    result = run("promtool", "test", "rules", str(DOCKER / "alerts.test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    alerts = {rule["alert"] for group in yaml.safe_load((DOCKER / "alerts.yml").read_text())["groups"]
              for rule in group["rules"]}
    cases: list[dict[str, Any]] = [case for test in yaml.safe_load((DOCKER / "alerts.test.yml").read_text())["tests"]
                                   for case in test["alert_rule_test"]]
    assert {case["alertname"] for case in cases if case.get("exp_alerts")} == alerts
    assert {case["alertname"] for case in cases if not case.get("exp_alerts")} == alerts


def test_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The unit tests really check: the breaker alert of old (any state >= 1, half-open included) fails them."""
    rules = (DOCKER / "alerts.yml").read_text()
    current = 'max by (model) (max_over_time(streamproc_circuit_breaker_state{state="open"}[1m])) == 1'
    assert current in rules
    old = "max by (model) (streamproc_circuit_breaker_state) >= 1"
    (tmp_path / "alerts.yml").write_text(rules.replace(current, old))
    shutil.copy(DOCKER / "alerts.test.yml", tmp_path / "alerts.test.yml")
    result = run("promtool", "test", "rules", str(tmp_path / "alerts.test.yml"))
    assert result.returncode != 0
    assert "StreamprocCircuitBreakerOpen" in result.stdout + result.stderr


def test_prometheus_config_is_valid(tmp_path: Path) -> None:
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    config["rule_files"] = [str(DOCKER / Path(path).name) for path in config["rule_files"]]  # the mounted files
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = run("promtool", "check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_config_is_valid() -> None:
    result = run("amtool", "check-config", str(DOCKER / "alertmanager.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
