"""``submit --deadline`` over the provider-batch route on the real broker and the real mock (issue 31 item 3, design
§8): the first attempts go into provider batches before the deadline; the mock expires each of them half-done after
it; the lines it left unrun come back through the retry tiers past the deadline and are called synchronously instead
of going into new provider batches. Every request ends once, and ``status`` charges the lines half and the calls the
full price."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from streamproc.core.identity import request_id_for
from streamproc.core.provider_batch_lines import PROVIDER_BATCH_EXPIRED
from streamproc.settings import Settings
from tests.integration.pipeline import OutcomeReader, Outcomes, WorkerProcess, start_mock, worker_env
from tests.integration.provider_batch_rig import (
    ROUTED,
    ended_once,
    routed_batch_file,
    synchronous_calls,
    wait_all_open,
)
from tests.integration.test_operations import cli, wait_converged

pytestmark = [pytest.mark.integration, pytest.mark.serial]

COUNT = 40
# long enough for a worker on a loaded CI machine to read all COUNT first attempts before it (a first attempt read
# after it is called synchronously, and the test would see fewer members open than COUNT)
DEADLINE_S = 20
WARM_UP = 2  # requests of a model not routed, called before the batch so that the worker reads it at once
PRICES = {"mock-small": (1.0, 2.0), "mock-large": (1.0, 2.0)}  # USD per million prompt / completion tokens
# the retry budget's ratio of 40 first attempts would end some of the ~20 expired lines retry_budget_exhausted
DEADLINE_ROUTED = {**ROUTED, "retry_budget_min": "100"}


async def outcomes_of(settings: Settings, ids: list[str], worker: WorkerProcess) -> Outcomes:
    assert settings.kafka_bootstrap is not None
    async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
        return await reader.wait_until_ended(ids, 120, worker)


def cost_usd(outcomes: Outcomes, ids: list[str], discounted: set[str]) -> float:
    """What the results' usage costs at PRICES, the ``discounted`` ids' at half."""
    total = 0.0
    for request_id in ids:
        usage = json.loads(outcomes.results[request_id][0].response_json)["usage"]
        full = (usage["prompt_tokens"] * PRICES["mock-small"][0] + usage["completion_tokens"] * PRICES["mock-small"][1])
        total += full / 1e6 * (0.5 if request_id in discounted else 1.0)
    return total


def test_lines_retried_past_the_deadline_are_called_at_the_full_price(settings: Settings, tmp_path: Path) -> None:
    expiring = [arg for n in range(1, settings.partitions + 1) for arg in ("--batch-fault", f"{n}:expire=0.5")]
    # every provider batch expires half-done, and not before the deadline has passed
    mock = start_mock("clean", 5, "--batch-seconds", str(DEADLINE_S), *expiring)
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w1", **DEADLINE_ROUTED), tmp_path / "worker.log")
    ids = [request_id_for("soon", f"soon-{i}") for i in range(COUNT)]
    worker.start()
    try:
        warm = routed_batch_file(tmp_path / "warm.jsonl", WARM_UP, "warm", model="mock-large")
        assert cli(settings, "submit", str(warm), "--batch-id", "warm").returncode == 0
        wait_converged(settings, "warm", 120, worker)
        sent = cli(settings, "submit", str(routed_batch_file(tmp_path / "in.jsonl", COUNT, "soon")), "--batch-id",
                   "soon", "--deadline", f"{DEADLINE_S}s", "--completion-window", "1h")
        assert sent.returncode == 0, sent.stderr
        records = asyncio.run(wait_all_open(settings, COUNT, worker))  # gathered before the deadline
        outcomes = asyncio.run(outcomes_of(settings, ids, worker))
        final = wait_converged(settings, "soon", 30, worker)[-1]
        status = cli(settings, "status", "--batch-id", "soon", "--json", "--verify", model_prices=json.dumps(PRICES))
        stats = mock.stats(detail=True)
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()
        mock.stop()

    assert outcomes.unfinished(ids) == [] and ended_once(outcomes, ids) == [], worker.log_tail()
    assert final["succeeded"] == COUNT  # the clean profile answers every line and every call
    expired = {i for i in ids if any(e.error_code == PROVIDER_BATCH_EXPIRED for e in outcomes.failures.get(i, []))}
    assert 0 < len(expired) < COUNT
    batches = stats["batches"]["openai"]
    assert batches["created"] == len(records)  # no new provider batch past the deadline
    assert set(batches["by_phase"]) == {"expired"}, batches
    # each expired line was called once on its own; the lines the batches answered were not called again
    assert synchronous_calls(stats) - WARM_UP == len(expired)
    assert batches["lines_answered"] == COUNT - len(expired)
    assert all(outcomes.results[i][0].attempts == 2 for i in expired)
    spend = json.loads(status.stdout)["spend"]
    assert spend["cost_usd"] == pytest.approx(cost_usd(outcomes, ids, set(ids) - expired), abs=2e-6)
    assert spend["cost_usd"] > cost_usd(outcomes, ids, set(ids))  # more than had every answer been a line
