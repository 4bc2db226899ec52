"""A parked request holds its id (design §4 "Reservations", §5.11): on the real broker, a tenant's flood fills a hand
of two and its read-ahead, so its last records wait or are parked on the backlog; then a hostile producer writes a
record of each of those ids with another body and no tenant (the default tenant's, which has a free hand), later in
the same partitions, as the chaos run's produced duplicates are. The user's own records must still own their ids:
each ends with its own result, each duplicate ends ``conflicting_duplicate``, and the batch converges. Before the
reservation, the duplicates were admitted first and the parked originals refused (the chaos run's ``ticket-407``)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from streamproc import codec
from streamproc.core.events import InferenceRequest
from streamproc.core.identity import request_id_for
from streamproc.settings import Settings
from tests.integration.pipeline import OutcomeReader, WorkerProcess, parked_records, produce, start_mock, worker_env
from tests.integration.test_operations import cli

pytestmark = [pytest.mark.integration, pytest.mark.serial]

FLOOD = 40
HOSTILE_OF = 4  # the flood's last ids get a hostile duplicate each
BATCH = "flood"


async def _converged(settings: Settings, timeout_s: float) -> dict[str, Any]:
    """``status --json`` of the batch once it converged (the summaries lag the states by a second), or the last."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = await asyncio.to_thread(cli, settings, "status", "--batch-id", BATCH, "--json")
        assert done.returncode == 0, done.stderr
        status: dict[str, Any] = json.loads(done.stdout)
        if status["converged"] or time.monotonic() > deadline:
            return status
        await asyncio.sleep(1)


async def test_a_parked_request_keeps_its_id_against_a_later_duplicate_with_another_body(
        settings: Settings, tmp_path: Path) -> None:
    profile = tmp_path / "one-slot.json"
    profile.write_text(json.dumps({"base": "clean", "slots": 1, "models": {"mock-small": {"latency": 0.25}}}))
    mock = start_mock(str(profile), 3)
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", in_flight="1", adaptive_min_in_flight="1",
                                      adaptive_initial_in_flight="1", llm_hedge_ratio="0", tenant_read_ahead="2"),
                           tmp_path / "worker.log")
    worker.start()
    ids = [request_id_for(BATCH, f"a-{i}") for i in range(FLOOD)]
    targets = ids[-HOSTILE_OF:]
    try:
        batch = tmp_path / "flood.jsonl"
        batch.write_text("".join(json.dumps({"id": f"a-{i}", "prompt": f"Label item {i}."}) + "\n"
                                 for i in range(FLOOD)))
        submitted = cli(settings, "submit", str(batch), "--batch-id", BATCH, "--tenant", "team-a")
        assert submitted.returncode == 0, submitted.stderr
        hostile = [InferenceRequest(request_id=request_id, batch_id="hostile", body_json=json.dumps(
            {"model": "mock-small", "messages": [{"role": "user", "content": f"Not what {request_id} asked."}]}))
            for request_id in targets]
        assert settings.kafka_bootstrap is not None
        await produce(settings.kafka_bootstrap, settings.topology().requests,
                      ((r.request_id.encode(), codec.encode(r)) for r in hostile))
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 180, worker)
            # each hostile duplicate ends too (its conflict, or before the reservation its result)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and worker.alive() and not all(
                    len(outcomes.results.get(i, [])) + len(outcomes.terminal(i)) >= 2 for i in targets):
                await reader.poll()
            await reader.read_to_end()
        status = await _converged(settings, 30)
        parked = {key for key, _hdrs in await parked_records(settings)} & {i.encode() for i in targets}
    finally:
        worker.stop()
        mock.stop()
    assert parked, "none of the duplicated ids was parked: the test did not reach its case"
    own = {i: [(r.batch_id, r.input_hash) for r in outcomes.results.get(i, [])] for i in targets}
    refused = {i: [(e.request.batch_id, e.error_code) for e in outcomes.terminal(i)] for i in targets}
    assert all(len(found) == 1 and found[0][0] == BATCH for found in own.values()), (own, refused,
                                                                                    worker.log_tail())
    assert refused == {i: [("hostile", "conflicting_duplicate")] for i in targets}, refused
    others = {i: len(outcomes.results.get(i, [])) for i in ids if i not in targets}
    assert set(others.values()) == {1}, others  # every other request of the flood: one result
    assert not [i for i in ids if i not in targets and outcomes.terminal(i)]
    assert status["converged"] and status["succeeded"] == FLOOD and status["pending"] == 0, status
