"""A tenant's RPM quota from the tenants file (issue 28 item 2): on the real broker, against the mock LLM with a
fixed number of slots, tenant B (rpm quota) and tenant A (none) submit at once. B's calls keep to its quota while
A's go at the server's pace; nothing of B's fails or is lost (its records wait). The metric labels are the file's
tenants; a tenant it does not name is ``other``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamproc.devstack.broker import free_port
from streamproc.settings import Settings
from tests.integration.pipeline import OutcomeReader, WorkerProcess, scrape_gauge, start_mock, worker_env
from tests.integration.test_operations import cli, wait_converged
from tests.integration.test_spend_caps import (
    IN_FLIGHT as CAPPED_IN_FLIGHT,
)
from tests.integration.test_spend_caps import (
    WORKERS,
    fleet,
    in_flight_bound,
    requests_file,
    wait_held_at_cap,
)

pytestmark = [pytest.mark.integration, pytest.mark.serial]

SERVER_SLOTS = 8
IN_FLIGHT = 8
LATENCY_S = 0.5  # the server answers 16 requests a second
B_RPM = 120  # 2 a second: an eighth of the server
A_COUNT, B_COUNT, C_COUNT = 120, 20, 3


def _batch(path: Path, prefix: str, count: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"{prefix}-{i}", "prompt": f"Label item {i}."}) + "\n"
                            for i in range(count)))
    return path


async def test_a_tenant_at_its_rpm_quota_is_held_to_it_and_the_others_are_not(settings: Settings,
                                                                             tmp_path: Path) -> None:
    profile = tmp_path / "slots.json"
    profile.write_text(json.dumps({"base": "clean", "slots": SERVER_SLOTS,
                                   "models": {"mock-small": {"latency": LATENCY_S}}}))
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(f'team-a = 1\n[team-b]\nrpm = {B_RPM}\n')
    mock = start_mock(str(profile), 3)
    metrics_port = free_port()
    env = worker_env(settings, mock.url, tmp_path / "w1", in_flight=str(IN_FLIGHT),
                     adaptive_min_in_flight=str(IN_FLIGHT), adaptive_initial_in_flight=str(IN_FLIGHT),
                     llm_hedge_ratio="0", retry_budget_min="1000", tenants_file=str(tenants),
                     worker_metrics_port=str(metrics_port))
    worker = WorkerProcess(env, tmp_path / "worker.log")
    worker.start()
    try:
        for prefix, count in (("b", B_COUNT), ("a", A_COUNT), ("c", C_COUNT)):
            submitted = cli(settings, "submit", str(_batch(tmp_path / f"{prefix}.jsonl", prefix, count)),
                            "--batch-id", f"batch-{prefix}", "--tenant", f"team-{prefix}")
            assert submitted.returncode == 0, submitted.stderr
        ids = ([f"batch-a/a-{i}" for i in range(A_COUNT)] + [f"batch-b/b-{i}" for i in range(B_COUNT)]
               + [f"batch-c/c-{i}" for i in range(C_COUNT)])
        assert settings.kafka_bootstrap is not None
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 180, worker)
        ended = {tenant: scrape_gauge(metrics_port, "streamproc_requests_ended_total",
                                      {"tenant": tenant, "priority": "normal", "outcome": "succeeded"})
                 for tenant in ("team-a", "team-b", "other", "team-c")}
    finally:
        worker.stop()
        mock.stop()
    assert not outcomes.failures, {key: [e.error_code for e in events] for key, events in outcomes.failures.items()}
    assert not outcomes.unfinished(ids), worker.log_tail()
    assert {request_id: len(found) for request_id, found in outcomes.results.items()} == dict.fromkeys(ids, 1)

    def done(prefix: str) -> list[int]:
        return sorted(found[0].completed_ms for request_id, found in outcomes.results.items()
                      if request_id.startswith(f"batch-{prefix}/"))

    a_done, b_done = done("a"), done("b")
    b_rate = (B_COUNT - 1) / ((b_done[-1] - b_done[0]) / 1000)
    a_rate = (A_COUNT - 1) / ((a_done[-1] - a_done[0]) / 1000)
    print(f"B (rpm {B_RPM}): {B_COUNT} in {(b_done[-1] - b_done[0]) / 1000:.1f} s, {b_rate:.2f}/s; "
          f"A (no quota): {A_COUNT} in {(a_done[-1] - a_done[0]) / 1000:.1f} s, {a_rate:.2f}/s")
    # B's burst is one second of its quota (2 calls), then 2 a second: its 20 take at least 8.5 s
    assert b_rate <= B_RPM / 60 * (B_COUNT - 1) / (B_COUNT - 1 - 2 - 1), b_rate
    assert a_rate > 2 * B_RPM / 60, a_rate  # A is not held to B's quota
    assert ended == {"team-a": A_COUNT, "team-b": B_COUNT, "other": C_COUNT, "team-c": None}, ended


async def test_a_tenant_at_its_daily_cost_cap_waits_while_another_tenant_s_batch_ends(settings: Settings,
                                                                                     tmp_path: Path) -> None:
    cap_usd = 0.5
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"team-b": {"max_cost_usd_per_day": cap_usd}}))
    with fleet(settings, tmp_path, tenants_file=str(tenants)) as (_mock, workers):
        for tenant, count in (("team-b", 30), ("team-a", 10)):
            submitted = cli(settings, "submit", str(requests_file(tmp_path / f"{tenant}.jsonl", count)),
                            "--batch-id", f"of-{tenant}", "--tenant", tenant)
            assert submitted.returncode == 0, submitted.stderr
        held = wait_held_at_cap(settings, "of-team-b", workers)
        polls = wait_converged(settings, "of-team-a", 120, workers[0])
    spent = held["spend"]["cost_usd"]
    print(f"team-b held at ${spent:.3f} of its ${cap_usd} a day after {held['succeeded']} of 30 calls")
    assert polls[-1]["succeeded"] == 10 and polls[-1]["converged"], polls[-1]  # the other tenant is not held
    assert 0 < held["succeeded"] < 30 and held["failed"] == dict.fromkeys(held["failed"], 0)  # waiting, not failed
    assert cap_usd - in_flight_bound(held) / (WORKERS * CAPPED_IN_FLIGHT) <= spent <= cap_usd + in_flight_bound(held)
