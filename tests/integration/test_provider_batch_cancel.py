"""``streamproc cancel`` of a batch whose requests wait in open provider batches (issue 31, design §8): the worker
that follows those provider batches cancels them at the provider, and every member the provider had not run ends
``batch_cancelled`` long before the provider batch would have ended."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from streamproc.core.identity import request_id_for
from streamproc.settings import Settings
from tests.integration.pipeline import WorkerProcess, start_mock, worker_env
from tests.integration.provider_batch_rig import ROUTED, batch_records, routed_batch_file, wait_all_open
from tests.integration.test_operations import cli, wait_converged

pytestmark = [pytest.mark.integration, pytest.mark.serial]

BATCH_SECONDS = 90  # how long the mock takes to run a provider batch: the cancel must not wait for it


def test_cancel_cancels_the_open_provider_batches_holding_the_batch(settings: Settings, tmp_path: Path) -> None:
    count = 60
    submitted = cli(settings, "submit", str(routed_batch_file(tmp_path / "in.jsonl", count)), "--batch-id", "doomed")
    assert submitted.returncode == 0, submitted.stderr
    mock = start_mock("clean", 5, "--batch-seconds", str(BATCH_SECONDS))
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", **ROUTED), tmp_path / "worker.log")
    worker.start()
    try:
        records = asyncio.run(wait_all_open(settings, count, worker))  # all in open provider batches
        started = time.monotonic()
        cancelled = cli(settings, "cancel", "--batch-id", "doomed")
        assert cancelled.returncode == 0, cancelled.stderr
        final = wait_converged(settings, "doomed", BATCH_SECONDS / 2, worker)[-1]
        took_s = time.monotonic() - started
        stats = mock.stats(detail=True)
        exported = cli(settings, "results", "--batch-id", "doomed", "--output", str(tmp_path / "out.jsonl"),
                       "--errors", str(tmp_path / "errors.jsonl"))
        time.sleep(1)
        left = asyncio.run(batch_records(settings))
    finally:
        worker.stop()
        mock.stop()
    assert final["converged"] and final["cancelled_at"] is not None, (final, worker.log_tail())
    assert took_s < BATCH_SECONDS / 2  # ended by the provider's cancel, not by the batch running to its end
    # the lines the provider ran before the cancel are results (billed, as calls in flight finish); the rest end
    # batch_cancelled: most of them, as the cancel came early in the provider's run
    assert final["succeeded"] + final["failed"]["business"] == count, final
    assert final["failed"]["business"] >= count // 2, final
    batches = stats["batches"]["openai"]
    assert batches["created"] == len(records) >= 1
    assert set(batches["by_phase"]) <= {"cancelling", "cancelled"}, batches  # each one cancelled at the provider
    assert stats["calls"] == batches["lines_answered"] == final["succeeded"]  # no request called on its own
    assert "cancelled it" in worker.log_path.read_text()
    assert exported.returncode == 0, exported.stderr
    errors = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert len(errors) == count and {e["error"]["code"] for e in errors} == {"batch_cancelled"}, errors[:2]
    assert left == {}


def test_a_provider_batch_holding_a_live_batch_too_runs_on(settings: Settings, tmp_path: Path) -> None:
    """Both batches' requests share the provider batches of each partition: cancelling them would fail the live
    batch's requests; they run on, and the cancelled batch's members finish as calls in flight do."""
    count = 30
    for name in ("doomed", "kept"):
        sent = cli(settings, "submit", str(routed_batch_file(tmp_path / f"{name}.jsonl", count, name)),
                   "--batch-id", name)
        assert sent.returncode == 0, sent.stderr
    mock = start_mock("clean", 5, "--batch-seconds", "20")
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", **ROUTED), tmp_path / "worker.log")
    worker.start()
    try:
        records = asyncio.run(wait_all_open(settings, 2 * count, worker, timeout_s=60))
        assert cli(settings, "cancel", "--batch-id", "doomed").returncode == 0
        kept = wait_converged(settings, "kept", 90, worker)[-1]
        doomed = wait_converged(settings, "doomed", 30, worker)[-1]
        stats = mock.stats(detail=True)
    finally:
        worker.stop()
        mock.stop()
    batch_of = {request_id_for(name, f"{name}-{i}"): name for name in ("doomed", "kept") for i in range(count)}
    holds = {gather_id: {batch_of[m] for m in r.members} for gather_id, r in records.items()}
    mixed = [g for g, names in holds.items() if names == {"doomed", "kept"}]
    only_doomed = [g for g, names in holds.items() if names == {"doomed"}]
    assert mixed, "the test needs a provider batch holding both batches' requests"
    assert kept["converged"] and kept["succeeded"] == count, kept
    assert doomed["converged"] and doomed["cancelled_at"] is not None, doomed
    phases = stats["batches"]["openai"]["by_phase"]  # only the batches holding no live request were cancelled
    assert phases.get("completed", 0) == len(records) - len(only_doomed), (phases, holds)
    assert phases.get("cancelled", 0) + phases.get("cancelling", 0) == len(only_doomed), (phases, holds)
    doomed_in_mixed = sum(1 for g in mixed for m in records[g].members if batch_of[m] == "doomed")
    assert doomed["succeeded"] >= doomed_in_mixed  # its members in a batch that ran on finished, as calls in flight
    assert worker.log_path.read_text().count("cancelled it") == len(only_doomed)
