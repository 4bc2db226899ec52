"""A small tenant behind a flood (issue 28 item 2): on the real broker, against the mock LLM with a fixed number of
slots, tenant A submits a flood and tenant B a small batch right behind it; B's batch ends long before A's, because
the worker parks A's records past its share on the backlog topic and reads on to B's (design §5.11). Every request of
both still ends exactly once."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import pytest

from streamproc.core.tenancy import TENANT_HEADER
from streamproc.settings import Settings
from tests.integration.pipeline import (
    OutcomeReader,
    WorkerProcess,
    parked_records,
    record_positions,
    start_mock,
    worker_env,
)
from tests.integration.test_operations import cli
from tests.integration.test_pipeline_faults import wait_for_assignment

pytestmark = [pytest.mark.integration, pytest.mark.serial]

SERVER_SLOTS = 4
IN_FLIGHT = 4  # of all workers together, fixed (floor = start = ceiling): the test is about the shares, not the
# adaptive limit
LATENCY_S = 1.0  # the server answers SERVER_SLOTS / LATENCY_S = 4 requests a second: the bottleneck, as a shared
# model is (a worker reads and parks far faster, even on a loaded machine)
FLOOD = 300
SMALL = 16


def _batch(path: Path, prefix: str, count: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"{prefix}-{i}", "prompt": f"Label item {i}."}) + "\n"
                            for i in range(count)))
    return path


async def _parked(settings: Settings) -> dict[str, int]:
    """Records on the backlog topic, by their x-tenant header."""
    return dict(Counter(hdrs.get(TENANT_HEADER, b"").decode() for _key, hdrs in await parked_records(settings)))


async def _run(settings: Settings, tmp_path: Path, workers: int,
               batches: list[tuple[str, str, int, tuple[str, ...]]], **deployment: str) -> dict[str, list[int]]:
    """Submit ``batches`` (batch id, id prefix, count, submit's options) in order to ``workers`` workers sharing
    IN_FLIGHT calls against a mock of SERVER_SLOTS slots (``deployment``: settings of the workers and ``submit``);
    every request must end exactly once. Each batch's completion times (ms), sorted."""
    profile = tmp_path / "slots.json"
    profile.write_text(json.dumps({"base": "clean", "slots": SERVER_SLOTS,
                                   "models": {"mock-small": {"latency": LATENCY_S}}}))
    mock = start_mock(str(profile), 3)
    in_flight = str(IN_FLIGHT // workers)
    fleet = [WorkerProcess(worker_env(settings, mock.url, tmp_path / f"w{n}", in_flight=in_flight,
                                      adaptive_min_in_flight=in_flight, adaptive_initial_in_flight=in_flight,
                                      llm_hedge_ratio="0", retry_budget_min="1000",
                                      tenant_read_ahead="40",  # past 40 waiting (20 each once B waits): parked
                                      **deployment),
                           tmp_path / f"worker-{n}.log")
             for n in range(1, workers + 1)]
    for worker in fleet:
        worker.start()
    try:
        assert settings.kafka_bootstrap is not None
        # every worker in the group first: a rebalance parks the records waiting in memory at the backlog's tail,
        # where a small tenant's read at once by its group's topic would wait behind the flood's (design §5.11)
        await wait_for_assignment(settings.kafka_bootstrap, settings.app_id, members=workers, timeout_s=90)
        for batch_id, prefix, count, options in batches:
            submitted = cli(settings, "submit", str(_batch(tmp_path / f"{prefix}.jsonl", prefix, count)),
                            "--batch-id", batch_id, *options, **deployment)
            assert submitted.returncode == 0, submitted.stderr
        ids = [f"{batch_id}/{prefix}-{i}" for batch_id, prefix, count, _ in batches for i in range(count)]
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 300, *fleet)
    finally:
        for worker in fleet:
            worker.stop()
        mock.stop()
    assert not outcomes.failures, {key: [e.error_code for e in events] for key, events in outcomes.failures.items()}
    assert not outcomes.unfinished(ids), [worker.log_tail() for worker in fleet]
    duplicates = {request_id: len(found) for request_id, found in outcomes.results.items() if len(found) != 1}
    assert not duplicates, duplicates  # exactly once, parked or not
    assert set(outcomes.results) == set(ids)
    return {batch_id: sorted(found[0].completed_ms for request_id, found in outcomes.results.items()
                             if request_id.startswith(f"{batch_id}/"))
            for batch_id, _, _, _ in batches}


@pytest.mark.parametrize(("workers", "groups"), [(1, 1), (2, 1), (2, 2)],
                         ids=["one-worker", "two-workers", "two-workers-two-tenant-groups"])
async def test_a_small_tenant_behind_a_flood_ends_long_before_it(settings: Settings, tmp_path: Path,
                                                                 workers: int, groups: int) -> None:
    """With two workers each shares its own hand (design §5.11, costs (5)): B's records on either worker's
    partitions still reach past A's. With two tenant groups B's records are on a topic of their own, never behind
    A's."""
    pinned = {"tenant_groups": str(groups), "tenant_group_of": json.dumps({"team-a": 0, "team-b": 1})} \
        if groups > 1 else {}
    done = await _run(settings, tmp_path, workers, [("flood", "a", FLOOD, ("--tenant", "team-a")),
                                                    ("small", "b", SMALL, ("--tenant", "team-b"))], **pinned)
    a_done, b_done = done["flood"], done["small"]
    start = min(a_done)
    a_half, a_last, b_last = a_done[len(a_done) // 2] - start, a_done[-1] - start, b_done[-1] - start
    print(f"A's first to half {a_half} ms, to last {a_last} ms; B's last {b_last} ms after A's first "
          f"({b_last / a_last:.2f} of A's run; B's median {statistics.median(b_done) - start} ms)")
    parked = await _parked(settings)
    assert b_last < a_half, (b_last, a_half, parked)  # first come, first served: B's last comes after all of A's
    assert parked.get("team-a", 0) > FLOOD // 2, parked  # most of the flood went through the backlog
    assert parked.get("team-b", 0) == 0, parked  # within its part of the read-ahead
    if groups > 1:
        assert settings.kafka_bootstrap is not None
        topology = settings.topology()
        on_own = set(await record_positions(settings.kafka_bootstrap, topology.priority_requests("normal", 1)))
        assert on_own == {f"small/b-{i}" for i in range(SMALL)}  # B's group topic holds B's records, none of A's


async def test_a_high_batch_behind_its_own_tenants_low_flood_ends_long_before_it(settings: Settings,
                                                                                  tmp_path: Path) -> None:
    """The hand counts per (tenant, priority): the ``high`` records do not wait or park behind the ``low`` ones
    of the same tenant, and the gate starts them first."""
    done = await _run(settings, tmp_path, 1, [("flood", "a", FLOOD, ("--tenant", "team-a", "--priority", "low")),
                                              ("urgent", "h", SMALL, ("--tenant", "team-a", "--priority", "high"))])
    low, high = done["flood"], done["urgent"]
    start = min(low)
    low_half, low_last, high_last = low[len(low) // 2] - start, low[-1] - start, high[-1] - start
    print(f"low's first to half {low_half} ms, to last {low_last} ms; high's first {high[0] - start} ms, last "
          f"{high_last} ms after low's first ({high_last / low_last:.2f} of low's run)")
    assert high_last < low_half, (high_last, low_half)  # per tenant only, high's last came near the flood's end
    parked = await _parked(settings)
    assert parked.get("team-a", 0) > FLOOD // 2, parked  # the flood's excess still went through the backlog
