"""The pace against 429s that are not all the limiter's (issue 27), end to end: a worker with its default
pacing against a mock with a rate limit that also refuses a share of calls with a 429 of its own (only
``retry-after: 1``, whatever the rate), and against one with those 429s and no limit at all."""

from __future__ import annotations

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

pytestmark = pytest.mark.integration

RPM = 1200  # 20 calls/s, a one-second burst
NOISE = 0.03  # of all calls: a 429 of the server's own (three times the strict profile's)
REQUESTS = 600
PACE_METRIC = "streamproc_rate_limit_requests_per_second"


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


async def run_batch(settings: Settings, tmp_path: Path, rpm: int | None) -> tuple[float, dict[str, int], int,
                                                                                    float | None]:
    """The batch through one worker with default pacing: (seconds from producing to the last outcome, the
    mock's outcomes, its calls, the requests/s limit the worker paced the model under at the end)."""
    mock = start_mock(str(noisy_profile(tmp_path, rpm)), 3)
    port = free_port()
    worker = WorkerProcess(worker_env(settings, mock.url, tmp_path / "w", worker_metrics_port=str(port)),
                           tmp_path / "worker.log")
    requests = [chat_request(f"p-{i}", i) for i in range(REQUESTS)]
    ids = [r.request_id for r in requests]
    worker.start()
    try:
        assert settings.kafka_bootstrap is not None
        started = time.monotonic()
        await produce_requests(settings.kafka_bootstrap, settings, requests)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 180, worker)
        seconds = time.monotonic() - started
        pace = scrape_gauge(port, PACE_METRIC, {"model": "mock-small"})
        stats = mock.stats()
    finally:
        worker.stop()
        mock.stop()
    assert not outcomes.unfinished(ids), worker.log_tail()
    assert all(len(outcomes.results.get(i, [])) == 1 for i in ids), worker.log_tail()  # every 429 recovered
    return seconds, stats["by_outcome"], stats["calls"], pace


@pytest.mark.xfail(strict=False, reason="known open bound (issue 27): the limiter's 429s exceed 2 % of calls in "
                   "about half the runs (32 and 50 of ~660 seen); the test runs and reports XPASS when it holds")
async def test_noise_429s_beside_a_limiter_neither_storm_nor_collapse_the_pace(settings: Settings,
                                                                                tmp_path: Path) -> None:
    seconds, by_outcome, calls, pace = await run_batch(settings, tmp_path, RPM)
    ideal = calls / (RPM / 60)
    limiter_429s = by_outcome.get("rate_limited", 0)
    assert limiter_429s <= 0.02 * calls, by_outcome  # no 429 storm: the limiter's refusals stay a small share
    assert by_outcome.get("rate_limit", 0) >= 0.01 * calls  # the noise was there
    # the limit paced at is the server's, not one learnt from its noise (every noise 429 read as congestion
    # learnt one from the rate sent at the first, and cut it further at each: 14/s of 20)
    assert pace == pytest.approx(RPM / 60), pace
    # no collapse: the batch took about what the limit allows, + the worker's start and Kafka's first rebalance
    assert seconds <= 1.3 * ideal + 15, (seconds, ideal)


async def test_noise_429s_without_a_limiter_set_no_pace(settings: Settings, tmp_path: Path) -> None:
    seconds, by_outcome, calls, pace = await run_batch(settings, tmp_path, None)
    assert by_outcome.get("rate_limit", 0) >= 0.01 * calls
    assert pace is None  # no limit was learnt from the server's own 429s
    assert seconds <= 20 + 15, seconds  # bound by the in-flight limit, not paced
