"""One tenant's requests failing alike pause that tenant, not the model (issue 28 item 4): another tenant's batch
on the same model completes while it is paused, and every request of the paused tenant ends exactly once: the
refused ones as explained failures, the rest as results once a probe finds it fixed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from streamproc.core.events import InferenceRequest
from streamproc.core.vocabulary import FailureLayer
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

pytestmark = pytest.mark.integration

# the mock refuses the first calls of tenant A's (identical) body alike, then answers; as many as pause A: the calls
# in flight at the pause are answered, which neither prolongs nor ends it, so the first probe ends it
REFUSED_CALLS = 5
PROBE_S = 30.0  # A's pause lasts at least this: B's batch, and status, must be done inside it on a loaded machine


def status(env: dict[str, str], batch_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamproc", "status", "--batch-id", batch_id, "--json"], env=env,
                          capture_output=True, text=True, timeout=120, check=True)


def tenant_a_request(i: int) -> InferenceRequest:
    """One body for every request of A: the mock counts its attempts by content, so its refusals end after
    REFUSED_CALLS calls, as if A's integration was fixed then."""
    body = {"model": "mock-small", "max_tokens": 256,
            "messages": [{"role": "user", "content": f"Label this [mock:invalid_request*{REFUSED_CALLS}]"}]}
    return InferenceRequest(f"a-{i}", json.dumps(body), batch_id="batch-a", submitted_ms=int(time.time() * 1000),
                            tenant="team-a")


async def test_a_tenant_refused_alike_is_paused_while_another_tenants_batch_completes(
        settings: Settings, tmp_path: Path) -> None:
    mock = start_mock("clean", 3, "--latency", "0.3")
    port = free_port()
    env = worker_env(settings, mock.url, tmp_path / "w1", worker_metrics_port=str(port), in_flight="4",
                     adaptive_initial_in_flight="4", tenant_pause_probe_s=str(PROBE_S),
                     tenant_pause_after=str(REFUSED_CALLS))
    worker = WorkerProcess(env, tmp_path / "worker.log")
    of_b = [replace(chat_request(f"b-{i}", i, batch_id="batch-b"), tenant="team-b") for i in range(60)]
    of_a = [tenant_a_request(i) for i in range(20)]
    paused_labels = {"tenant": "team-a", "model": "mock-small"}
    worker.start()
    try:
        assert settings.kafka_bootstrap is not None
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            await produce_requests(settings.kafka_bootstrap, settings, of_b)
            deadline = time.monotonic() + 90
            while len(reader.outcomes.results) < 3 and time.monotonic() < deadline:  # B's calls are answered
                await reader.poll()
                await asyncio.sleep(0.2)
            await produce_requests(settings.kafka_bootstrap, settings, of_a)
            outcomes = await reader.wait_until_ended([r.request_id for r in of_b], 120, worker)
            paused_when_b_ended = scrape_gauge(port, "streamproc_tenant_paused", paused_labels)
            shown_a, shown_b = await asyncio.gather(asyncio.to_thread(status, env, "batch-a"),
                                                    asyncio.to_thread(status, env, "batch-b"))
            outcomes = await reader.wait_until_ended([r.request_id for r in of_a], 120 + 2 * PROBE_S, worker)
            await asyncio.sleep(3)  # anything written twice would show now
            await reader.poll()
        paused_after = scrape_gauge(port, "streamproc_tenant_paused", paused_labels)
    finally:
        worker.stop()
        mock.stop()
    log = worker.log_path.read_text()

    for request in [*of_a, *of_b]:  # exactly one place each
        ended = len(outcomes.results.get(request.request_id, [])) + len(outcomes.terminal(request.request_id))
        assert ended == 1, (request.request_id, worker.log_tail())
    assert all(outcomes.results.get(r.request_id) for r in of_b)  # B was never held by A's failures
    refused = [outcomes.terminal(r.request_id)[0] for r in of_a if outcomes.terminal(r.request_id)]
    assert len(refused) == REFUSED_CALLS  # the calls the mock refused, each ended explained; no other
    assert all(f.layer is FailureLayer.BUSINESS and f.error_code == "invalid_request_error" for f in refused)
    assert "tenant team-a paused on model mock-small" in log and "tenant team-a resumed on model mock-small" in log
    assert paused_when_b_ended == 1.0, log[-3000:]  # B completed while A was paused
    assert paused_after is None  # resumed: no series
    # status, while A was paused: A's batch says why and how many wait for it; B's names no tenant's pause
    a_json, b_json = json.loads(shown_a.stdout), json.loads(shown_b.stdout)
    [out] = a_json["deployments_out"]
    assert out["deployment"] == "mock-small for tenant team-a" and "tenant team-a paused" in out["reason"], out
    assert "failed alike" in out["reason"] and a_json["parked"].get("tenant_paused", 0) >= 1, a_json
    assert b_json["deployments_out"] == [] and b_json["parked"] == {}, b_json
    assert sum(bool(outcomes.results.get(r.request_id)) for r in of_a) == len(of_a) - REFUSED_CALLS
