"""Tenants and priorities end to end (issue 28 item 1): submit names them, a line may name its own, and they reach
status, batches, the export and the worker's metrics on the real broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamproc.devstack.broker import free_port
from streamproc.settings import Settings
from tests.integration.pipeline import WorkerProcess, scrape_gauge, start_mock, worker_env
from tests.integration.test_operations import cli, wait_converged

pytestmark = pytest.mark.integration


def test_submit_s_tenant_and_a_line_s_own_reach_status_batches_exports_and_metrics(settings: Settings,
                                                                                     tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    lines = [{"id": f"r-{i}", "prompt": f"Label item {i}."} for i in range(6)]
    lines[5] |= {"tenant": "team-b", "priority": "low"}  # a line's own wins over the flags
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    bad = cli(settings, "submit", str(path), "--batch-id", "bad", "--tenant", "team a")
    assert bad.returncode != 0 and "tenant 'team a' is not a tenant name" in bad.stderr, bad.stderr

    mock = start_mock("clean")
    metrics_port = free_port()
    env = worker_env(settings, mock.url, tmp_path / "w1", worker_metrics_port=str(metrics_port),
                     metrics_tenants='["team-a"]')
    worker = WorkerProcess(env, tmp_path / "worker.log")
    worker.start()
    try:
        submitted = cli(settings, "submit", str(path), "--batch-id", "tenancy", "--tenant", "team-a",
                        "--priority", "high")
        assert submitted.returncode == 0, submitted.stderr
        polls = wait_converged(settings, "tenancy", 120, worker)
        assert polls and polls[-1]["converged"], worker.log_tail()
        ended = scrape_gauge(metrics_port, "streamproc_requests_ended_total",
                             {"tenant": "team-a", "priority": "high", "outcome": "succeeded"})
        other = scrape_gauge(metrics_port, "streamproc_requests_ended_total",
                             {"tenant": "other", "priority": "low", "outcome": "succeeded"})
    finally:
        worker.stop()
        mock.stop()
    final = polls[-1]
    assert (final["tenants"], final["priorities"]) == ({"team-a": 5, "team-b": 1}, {"high": 5, "low": 1})
    assert polls[0]["tenants"].get("team-a", 0) >= 5  # the requests no worker took yet count as submit said
    assert (ended, other) == (5, 1)  # team-b is not in STREAMPROC_METRICS_TENANTS
    table = cli(settings, "batches").stdout.splitlines()
    assert table[1].split()[4:8] == ["team-a", "+1", "high", "+1"], table  # after the date and time
    exported = cli(settings, "results", "--batch-id", "tenancy", "--output", str(tmp_path / "out.jsonl"))
    assert exported.returncode == 0, exported.stderr
    marks = {line["custom_id"]: line["streamproc"]
             for line in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert marks["r-0"] == {"tenant": "team-a", "priority": "high"}
    assert marks["r-5"] == {"tenant": "team-b", "priority": "low"}

