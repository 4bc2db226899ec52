"""A short chaos run (the CI cut of ``scripts/chaos``): nothing lost, no export line twice, no stalled partition.

It starts its own broker (the session broker cannot be restarted under the other tests), the mock LLM server,
2 workers, and then kills each worker once, restarts the broker, takes the LLM down for 10 s and sends two
waves of every kind of poison record while 500 requests run. The mock is paced to 1,200 RPM so that the batch
lasts until every fault has landed, and the workers keep 64 records in flight so that a rebalance (which
waits for all of them) stays short under that pace.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from streamproc.devstack.chaos.chaos_run import run_chaos
from streamproc.devstack.chaos.config import ChaosConfig
from streamproc.devstack.chaos.tally import format_table

pytestmark = [pytest.mark.integration, pytest.mark.serial]

CONFIG = ChaosConfig(requests=500, workers=2, kills=2, kill_pause_s=3.0, broker_restarts=1, broker_down_s=3.0,
                     outage_s=10.0, poison_per_kind=1, mock_rpm=1200, in_flight=64, retry_tiers="1s,2s,4s,10s",
                     timeout_s=170.0, max_fault_gap_s=30.0)


@pytest.mark.timeout(420)
async def test_chaos_loses_nothing_duplicates_no_line_and_stalls_no_partition(tmp_path: Path) -> None:
    lines: list[str] = []
    report = await run_chaos(replace(CONFIG, work_dir=tmp_path / "chaos"), lines.append)
    table = format_table(report.result)
    print("\n".join([*lines, table, *report.result.details]))
    rows = {row.label: row.value for row in report.result.rows}
    explain = f"\n{table}\n" + "\n".join(report.result.details) + f"\nlogs: {report.work_dir}"
    assert rows["lost"] == "0", explain
    assert rows["duplicate export lines"] == "0", explain
    assert rows["stalled partitions"] == "0", explain
    assert report.facts.converged_at_s is not None, explain
    assert report.result.ok, explain  # also: every poison record explained, every planned fault fired
