"""The pace against 429s that are not all the limiter's (issue 27), end to end: a worker with its default
pacing against a mock with a rate limit that also refuses a share of calls with a 429 of its own (only
``retry-after: 1``, whatever the rate), and against one with those 429s and no limit at all."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamproc.core.guards.gradient import SLOW_START_GROWTH
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

RPM = 1200  # 20 calls/s, a one-second burst
NOISE = 0.03  # of all calls: a 429 of the server's own (three times the strict profile's)
REQUESTS = 600
PACE_METRIC = "streamproc_rate_limit_requests_per_second"
LIMITER_429 = "rate_limited"  # the mock's outcome for its limiter's 429s ("rate_limit": its own, injected)
ADAPTIVE_INITIAL_IN_FLIGHT = Settings.model_fields["adaptive_initial_in_flight"].default


def noisy_profile(tmp_path: Path, rpm: int | None) -> Path:
    """strict's 429s (limiter's with their headers, the server's own with only retry-after) and nothing else:
    no other fault, a short fixed latency."""
    faults = ("hang", "reset", "truncated_body", "non_json_body", "server_error", "bad_gateway",
              "service_unavailable", "empty_content", "invalid_json", "schema_mismatch", "length",
              "invalid_request", "content_policy")
    limits = "null" if rpm is None else f"{{rpm: {rpm}, burst_seconds: 1.0}}"
    path = tmp_path / "noisy.yaml"
    path.write_text(f"base: strict\nlatency: 0.1\nrate_limits: {limits}\nfaults:\n  rate_limit: {NOISE}\n"
                    + "".join(f"  {kind}: 0\n" for kind in faults), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Run:
    """What one batch through the worker showed."""

    seconds: float  # from producing to the last outcome
    by_outcome: dict[str, int]  # the mock's outcomes
    calls: int
    pace: float | None  # the requests/s limit the worker paced the model under at the end
    first_contact: dict[str, int] | None  # the mock's stats a second after the worker knew the limit


async def limit_known(port: int, timeout_s: float) -> bool:
    """Whether the worker published a pace for the model (it knows a limit) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if scrape_gauge(port, PACE_METRIC, {"model": "mock-small"}) is not None:
            return True
        await asyncio.sleep(0.05)
    return False


async def run_batch(settings: Settings, tmp_path: Path, rpm: int | None) -> Run:
    """The batch through one worker with default pacing."""
    mock = start_mock(str(noisy_profile(tmp_path, rpm)), 3)
    port = free_port()
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w", worker_metrics_port=str(port)),
                           tmp_path / "worker.log")
    requests = [chat_request(f"p-{i}", i) for i in range(REQUESTS)]
    ids = [r.request_id for r in requests]
    worker.start()
    first_contact = None
    try:
        assert settings.kafka_bootstrap is not None
        started = time.monotonic()
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            if rpm is not None and await limit_known(port, 60):
                await asyncio.sleep(1.0)  # the calls sent before it was known have been answered
                first_contact = mock.stats()["by_outcome"]
            outcomes = await reader.wait_until_ended(ids, 180, worker)
        seconds = time.monotonic() - started
        pace = scrape_gauge(port, PACE_METRIC, {"model": "mock-small"})
        stats = mock.stats()
    finally:
        worker.stop()
        mock.stop()
    assert not outcomes.unfinished(ids), worker.log_tail()
    assert all(len(outcomes.results.get(i, [])) == 1 for i in ids), worker.log_tail()  # every 429 recovered
    return Run(seconds, stats["by_outcome"], stats["calls"], pace, first_contact)


async def test_noise_429s_beside_a_limiter_neither_storm_nor_collapse_the_pace(settings: Settings,
                                                                                tmp_path: Path) -> None:
    run = await run_batch(settings, tmp_path, RPM)
    ideal = run.calls / (RPM / 60)
    assert run.first_contact is not None, "the worker never paced under the server's limit"
    # The limit is unknown until the limiter's first 429 names it: the calls then in flight meet the emptied
    # bucket, at most the in-flight limit after one step of its slow start (design §5.5).
    first_contact_429s = run.first_contact.get(LIMITER_429, 0)
    assert first_contact_429s <= ADAPTIVE_INITIAL_IN_FLIGHT * SLOW_START_GROWTH, run.first_contact
    # no 429 storm once it is known: the limiter's refusals stay a small share of the calls after that
    calls_after = run.calls - sum(run.first_contact.values())
    assert run.by_outcome.get(LIMITER_429, 0) - first_contact_429s <= 0.02 * calls_after, run.by_outcome
    assert run.by_outcome.get("rate_limit", 0) >= 0.01 * run.calls  # the noise was there
    # the limit paced at is the server's, not one learnt from its noise (every noise 429 read as congestion
    # learnt one from the rate sent at the first, and cut it further at each: 14/s of 20)
    assert run.pace == pytest.approx(RPM / 60), run.pace
    # no collapse: the batch took about what the limit allows, + the worker's start and Kafka's first rebalance
    assert run.seconds <= 1.3 * ideal + 15, (run.seconds, ideal)


async def test_noise_429s_without_a_limiter_set_no_pace(settings: Settings, tmp_path: Path) -> None:
    run = await run_batch(settings, tmp_path, None)
    assert run.by_outcome.get("rate_limit", 0) >= 0.01 * run.calls
    assert run.pace is None  # no limit was learnt from the server's own 429s
    assert run.seconds <= 20 + 15, run.seconds  # bound by the in-flight limit, not paced
