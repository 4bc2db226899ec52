"""Spend caps (design §5.9) on the real broker: two worker processes against a mock whose answers report their usage,
priced by STREAMPROC_MODEL_PRICES.

A batch capped at about half its cost stops at the cap, within the bound the design states (the other workers'
calls in flight), with every request accounted for: a result for each call made, the rest waiting, which
``status`` shows as ``stalled: budget_exhausted``; raising the cap finishes it. A second batch, capped and then
cancelled, ends its waiting requests ``budget_exceeded``. The day's cap holds an uncapped batch the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from streamproc.settings import Settings
from tests.integration.pipeline import MockServer, WorkerProcess, start_mock, worker_env
from tests.integration.test_operations import cli, read_jsonl, wait_converged

pytestmark = pytest.mark.integration

MODEL = "mock-small"
USD_PER_TOKEN = 0.001
PRICES = json.dumps({MODEL: [USD_PER_TOKEN * 1e6, USD_PER_TOKEN * 1e6]})
WORKERS = 2
IN_FLIGHT = 2
LATENCY_S = 1.5  # longer than a beat lag (a beat, 1 s, and its read): a worker starts at most IN_FLIGHT calls unseen
MAX_TOKENS = 100  # each request's completion budget, above what the mock's answers take: none is cut
REQUESTS = 120
CAP_USD = 3.0  # about half of what the batch costs (checked below from what it did cost)
SHOWN = {"model_prices": PRICES, "stall_after_s": "3"}  # what `status` prices the spend at, and when it says why


def requests_file(path: Path, count: int) -> Path:
    with open(path, "w") as out:
        for i in range(count):
            out.write(json.dumps({"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions",
                                  "body": {"model": MODEL, "max_tokens": MAX_TOKENS,
                                           "messages": [{"role": "user", "content": f"Question {i}?"}]}}) + "\n")
    return path


@contextmanager
def fleet(settings: Settings, tmp_path: Path, **extra: str) -> Iterator[tuple[MockServer, list[WorkerProcess]]]:
    """The mock and two workers on it, each with at most IN_FLIGHT calls and no hedges (a hedge is a copy the
    estimate does not cover)."""
    mock = start_mock("clean", 5, "--latency", str(LATENCY_S))
    workers = [WorkerProcess(worker_env(settings, mock.url, tmp_path / f"w{i}", in_flight=str(IN_FLIGHT),
                                        adaptive_initial_in_flight=str(IN_FLIGHT), llm_hedge_ratio="0",
                                        model_prices=PRICES, **extra), tmp_path / f"w{i}.log")
               for i in range(WORKERS)]
    for worker in workers:
        worker.start()
    try:
        yield mock, workers
    finally:
        for worker in workers:
            worker.stop()
        mock.stop()


def status(settings: Settings, batch_id: str) -> dict[str, Any]:
    result = cli(settings, "status", "--batch-id", batch_id, "--json", **SHOWN)
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def wait_held_at_cap(settings: Settings, batch_id: str, workers: list[WorkerProcess],
                     timeout_s: float = 240) -> dict[str, Any]:
    """Poll ``status`` until the batch stalled with every request that has no result waiting at its cap."""
    deadline, current = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline and all(worker.alive() for worker in workers):
        current = status(settings, batch_id)
        stalled = current["stalled"]
        waiting = current["submitted"] - current["succeeded"]
        if stalled is not None and stalled["reasons"] == {"budget_exhausted": waiting} and waiting > 0:
            return current
        time.sleep(1)
    raise AssertionError(f"batch {batch_id} was not held at its cap: {current}\n{workers[0].log_tail()}")


def in_flight_bound(final: dict[str, Any]) -> float:
    """What the design's bound allows past a cap here: every worker's calls in flight at the dearest call (twice
    the mean prompt, the prompts being alike, and a whole completion budget). The design's own is the other
    workers' calls only; this leaves room for the prompt estimate, which learns the mock's count as it goes."""
    longest_prompt: int = max(1, final["usage"]["prompt_tokens"] // max(1, final["succeeded"]))
    return WORKERS * IN_FLIGHT * (2 * longest_prompt + MAX_TOKENS) * USD_PER_TOKEN


def test_a_batch_capped_at_half_its_cost_waits_at_the_cap_and_ends_when_it_is_raised(
        settings: Settings, tmp_path: Path) -> None:
    with fleet(settings, tmp_path) as (mock, workers):
        submitted = cli(settings, "submit", str(requests_file(tmp_path / "capped.jsonl", REQUESTS)), "--batch-id",
                        "capped", "--max-cost-usd", str(CAP_USD))
        assert submitted.returncode == 0, submitted.stderr
        held = wait_held_at_cap(settings, "capped", workers)
        calls_held = mock.stats()["calls"]
        listed = json.loads(cli(settings, "batches", "--json", **SHOWN).stdout)
        text = cli(settings, "status", "--batch-id", "capped", **SHOWN).stdout
        raised = cli(settings, "raise-cap", "--batch-id", "capped", "--max-cost-usd", "100")
        wait_converged(settings, "capped", 240, workers[0])
        final, calls = status(settings, "capped"), mock.stats()["calls"]

        doomed_file = requests_file(tmp_path / "doomed.jsonl", 40)
        assert cli(settings, "submit", str(doomed_file), "--batch-id", "doomed", "--max-cost-usd", "0.6",
                   "--max-tokens", "100000").returncode == 0
        doomed_held = wait_held_at_cap(settings, "doomed", workers)
        cancelled = cli(settings, "cancel", "--batch-id", "doomed")
        wait_converged(settings, "doomed", 120, workers[0])
        doomed = status(settings, "doomed")
        exported = cli(settings, "results", "--batch-id", "doomed", "--output", str(tmp_path / "out.jsonl"),
                       "--errors", str(tmp_path / "errors.jsonl"))

    spent, cost = held["spend"]["cost_usd"], final["spend"]["cost_usd"]
    bound = in_flight_bound(final)
    print(f"held at ${spent:.3f} of a ${CAP_USD} cap (bound ${CAP_USD + bound:.3f}) after {calls_held} calls; "
          f"the whole batch cost ${cost:.3f} in {calls} calls ({final['usage']})")
    # about half: the cap was meant to be half of what the batch costs
    assert 0.35 <= CAP_USD / cost <= 0.65, (CAP_USD, cost)
    # held at the cap: within the bound past it, and no further below it than one call can cost
    assert CAP_USD - bound / (WORKERS * IN_FLIGHT) <= spent <= CAP_USD + bound, (spent, bound)
    # every request accounted for: a result for each call, the rest waiting at the cap and shown so
    assert held["succeeded"] == calls_held and held["failed"] == dict.fromkeys(held["failed"], 0)
    assert held["stalled"]["reasons"] == {"budget_exhausted": REQUESTS - calls_held}
    assert held["spend"]["max_cost_usd"] == CAP_USD and held["spend"]["tokens"] == held["usage"]["total_tokens"]
    [entry] = [batch for batch in listed["data"] if batch["id"] == "capped"]
    assert entry["spend"] == held["spend"] and entry["status"] == "in_progress"
    assert "waiting at the spend cap" in text and f"(cap ${CAP_USD:g})" in text
    # raised, it ends with a result for every request, each called once
    assert raised.returncode == 0 and "spend cap now $100" in raised.stdout, raised.stderr
    assert final["succeeded"] == REQUESTS == calls and final["spend"]["max_cost_usd"] == 100
    # the cancelled batch: its waiting requests end budget_exceeded
    assert doomed_held["spend"]["cost_usd"] <= 0.6 + bound
    assert cancelled.returncode == 0, cancelled.stderr
    waiting = doomed_held["submitted"] - doomed_held["succeeded"]
    assert doomed["converged"] and doomed["failed"]["business"] == waiting > 0, doomed
    assert exported.returncode == 0, exported.stderr
    errors = read_jsonl(tmp_path / "errors.jsonl")
    assert len(errors) == waiting and {error["error"]["code"] for error in errors} == {"budget_exceeded"}
    assert len(read_jsonl(tmp_path / "out.jsonl")) == doomed["succeeded"]


def test_the_day_s_cap_holds_every_batch_across_the_workers(settings: Settings, tmp_path: Path) -> None:
    day_cap = 1.0
    with fleet(settings, tmp_path, max_cost_usd_per_day=str(day_cap)) as (mock, workers):
        submitted = cli(settings, "submit", str(requests_file(tmp_path / "in.jsonl", 60)), "--batch-id", "daily")
        assert submitted.returncode == 0, submitted.stderr
        held = wait_held_at_cap(settings, "daily", workers)
        calls = mock.stats()["calls"]
    spent, bound = held["spend"]["cost_usd"], in_flight_bound(held)
    print(f"held at ${spent:.3f} of the day's ${day_cap} (bound ${day_cap + bound:.3f}) after {calls} calls")
    assert day_cap - bound / (WORKERS * IN_FLIGHT) <= spent <= day_cap + bound, (spent, bound)
    assert held["succeeded"] == calls and held["spend"]["max_cost_usd"] is None  # the batch has no cap of its own
