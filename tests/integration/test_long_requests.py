"""The pool for long requests end to end (issue 28 item 3): on the real broker, against the mock LLM with a fixed
number of slots, a few long generations mixed into many short calls do not hold the short ones up."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from streamproc.core.events import InferenceRequest, InferenceResult
from streamproc.settings import Settings
from tests.integration.pipeline import (
    OutcomeReader,
    WorkerProcess,
    chat_request,
    produce_requests,
    start_mock,
    worker_env,
)

pytestmark = [pytest.mark.integration, pytest.mark.serial]

SERVER_SLOTS = 8
IN_FLIGHT = 16  # fixed (floor = start = ceiling): the test is about the pool, not the adaptive limit
LONG_SECONDS = 6.0  # mock-large's answer time: a long generation
SHORT_SECONDS = 0.1


def _profile(tmp_path: Path) -> Path:
    path = tmp_path / "slow-long.json"
    path.write_text(json.dumps({
        "base": "clean", "slots": SERVER_SLOTS,
        "models": {"mock-small": {"latency": SHORT_SECONDS}, "mock-large": {"latency": LONG_SECONDS}},
    }))
    return path


def _long_request(i: int) -> InferenceRequest:
    body = {"model": "mock-large", "max_tokens": 3000,  # over the 2,000-token threshold
            "messages": [{"role": "user", "content": f"Write a long essay about item {i}."}]}
    return InferenceRequest(request_id=f"long-{i}", body_json=json.dumps(body), batch_id="mix",
                            submitted_ms=int(time.time() * 1000))


def _longs_beside_shorts(longs: list[InferenceResult], shorts: list[InferenceResult]) -> int:
    """The most long calls in flight when a short call was sent (each call's send is its answer minus its
    latency): while short calls are about, the pool holds long ones to their share; after the last short call,
    long ones may take every slot (work-conserving), which this does not count."""
    spans = [(r.completed_ms - r.latency_ms, r.completed_ms) for r in longs]
    return max(sum(1 for sent, answered in spans if sent <= short.completed_ms - short.latency_ms < answered)
               for short in shorts)


def _p99(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@pytest.mark.parametrize("pool", [True, False], ids=["pool", "no-pool"])
async def test_short_calls_are_not_held_behind_long_generations(settings: Settings, tmp_path: Path,
                                                                pool: bool) -> None:
    """5 % long requests (6 s generations) among 240: with the pool they hold at most a quarter of the 16 slots,
    so the server's other slots keep answering short calls in about their own time; without it (the control)
    the long generations take the server's slots and the short calls queue behind them."""
    mock = start_mock(str(_profile(tmp_path)), 3)
    env = worker_env(settings, mock.url, tmp_path / "w1", in_flight=str(IN_FLIGHT),
                     adaptive_min_in_flight=str(IN_FLIGHT), adaptive_initial_in_flight=str(IN_FLIGHT),
                     llm_timeout_s="60", llm_hedge_ratio="0", retry_budget_min="1000",
                     long_request_tokens="2000" if pool else "0", long_request_share="0.25")
    worker = WorkerProcess(env, tmp_path / "worker.log")
    worker.start()
    requests = [_long_request(i) if i % 20 == 10 else chat_request(f"short-{i}", i, batch_id="mix")
                for i in range(240)]
    ids = [r.request_id for r in requests]
    try:
        assert settings.kafka_bootstrap is not None
        await produce_requests(settings.kafka_bootstrap, settings, requests, scheduled=True)
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended(ids, 180, worker)
    finally:
        worker.stop()
        mock.stop()
    assert not outcomes.failures, dict(outcomes.failures)
    results = {request_id: found[0] for request_id, found in outcomes.results.items()}
    longs = [result for request_id, result in results.items() if request_id.startswith("long-")]
    shorts = [result for request_id, result in results.items() if request_id.startswith("short-")]
    assert (len(longs), len(shorts)) == (12, 228)
    short_p99_ms = _p99([r.latency_ms for r in shorts])
    beside = _longs_beside_shorts(longs, shorts)
    print(f"pool={pool}: long calls beside a short one {beside}, short p99 {short_p99_ms} ms, "
          f"short max {max(r.latency_ms for r in shorts)} ms")
    if pool:
        assert beside <= IN_FLIGHT // 4 + 1  # the share (+1: answers timed to the ms overlap)
        assert short_p99_ms < 1500, short_p99_ms  # a few rounds of 0.1 s calls through 4 free server slots
    else:  # the control: the test can fail
        assert beside > IN_FLIGHT // 4 + 1
        assert short_p99_ms > 2000, short_p99_ms  # measured 3.3 s (the pool: 0.3 s)
