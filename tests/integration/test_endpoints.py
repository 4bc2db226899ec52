"""Two deployments of one model on the real broker (issue 33): calls are spread over both; one killed (or hung)
mid-batch is taken out by its breaker, its calls go on to the other within their attempt, and every request
succeeds on its first attempt, none waiting for the sick one to come back; while it is down, ``status`` names it
out, and why."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamproc.devstack.broker import free_port
from streamproc.settings import Settings
from tests.integration.pipeline import (
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce_requests,
    scrape_gauge,
    start_mock,
    worker_env,
)

pytestmark = [pytest.mark.integration, pytest.mark.serial]

REQUESTS = 300


def model_list(path: Path, *urls: str) -> Path:
    deployments = "".join(f"  - model_name: mock-small\n    litellm_params:\n      model: openai/mock-small\n"
                          f"      api_base: {url}\n      api_key: os.environ/MOCK_KEY\n" for url in urls)
    path.write_text(f"model_list:\n{deployments}", encoding="utf-8")
    return path


def status(env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamproc", "status", "--batch-id", "b1", *options], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("sickness", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
async def test_a_deployment_killed_mid_batch_is_taken_out_and_no_request_waits_for_it(
        settings: Settings, tmp_path: Path, sickness: signal.Signals) -> None:
    east, west = start_mock("clean", 1, "--latency", "0.2"), start_mock("clean", 2, "--latency", "0.2")
    port = free_port()
    env = worker_env(settings, "", tmp_path / "w1", models_file=str(model_list(tmp_path / "models.yaml", east.url,
                                                                                west.url)),
                     worker_metrics_port=str(port), in_flight="16")
    del env["STREAMPROC_LLM_BASE_URL"]  # the model list is the only endpoint
    env["MOCK_KEY"] = "sk-mock-0123456789"
    worker = WorkerProcess(env, tmp_path / "worker.log")
    requests = [chat_request(f"r-{i}", i) for i in range(REQUESTS)]
    ids = [r.request_id for r in requests]
    worker.start()
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            deadline = time.monotonic() + 120
            while len(reader.outcomes.results) < REQUESTS // 3 and time.monotonic() < deadline and worker.alive():
                await reader.poll()
            assert len(reader.outcomes.results) >= REQUESTS // 3, worker.log_tail()
            west_calls = west.stats()["calls"]
            # mid-batch, calls in flight: it never comes back (killed), or takes every call and never answers (hung,
            # cut by the adaptive timeout)
            west.process.send_signal(sickness)
            killed_at = time.monotonic()
            outcomes = await reader.wait_until_ended(ids, 120, worker)
            finished_after_s = time.monotonic() - killed_at
            await asyncio.sleep(1)
            await reader.poll()
        shown = await asyncio.to_thread(status, env, "--json")
        in_words = (await asyncio.to_thread(status, env)).stdout
        west_closed = scrape_gauge(port, "streamproc_circuit_breaker_state",
                                   {"model": "mock-small@2", "state": "closed"})
        east_calls = east.stats()["calls"]
        log = worker.log_path.read_text()
    finally:
        worker.stop()
        east.stop()
        west.process.send_signal(signal.SIGCONT)
        west.stop()

    assert all(len(outcomes.results[i]) == 1 for i in ids), worker.log_tail()
    assert not any(outcomes.failures.values())  # no failure event: nothing was retried through a tier
    assert all(outcomes.results[i][0].attempts == 1 for i in ids)
    assert {outcomes.results[i][0].deployment for i in ids} == {"mock-small@1", "mock-small@2"}  # who answered
    # the rest of the batch (two thirds, at 16 in flight x 0.2 s) took seconds, far from any retry tier's wait
    assert finished_after_s < 60
    assert west_calls > REQUESTS // 10  # both deployments took calls before the kill
    assert east_calls < REQUESTS + 30
    assert "circuit breaker for mock-small@2: closed -> open" in log
    # status, while it is still down: the worker's beat names it out and why (a hang, or a refused connection)
    assert shown.returncode == 0, shown.stderr
    out = json.loads(shown.stdout)["deployments_out"]
    assert [(o["deployment"], o["workers"]) for o in out] == [("mock-small@2", 1)], out
    why = "calls that hang" if sickness is signal.SIGSTOP else "transport failures"
    assert out[0]["reason"].startswith("circuit breaker ") and why in out[0]["reason"], out
    line = next((line for line in in_words.splitlines() if line.startswith("out ")), "")
    assert line.startswith("out        mock-small@2: circuit breaker ") and why in line, in_words
    assert west_closed == 0  # open, or half-open while it probes the dead one
