"""A flood of distinct model names (issue 26 item 3): 100,000 through every per-model guard and the metrics,
and neither the worker's memory (tracemalloc) nor the number of metric series grows with them."""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from streamproc.app.metrics import WorkerMetrics
from streamproc.app.observe import LlmCall
from streamproc.core.events import InferenceRequest
from streamproc.core.guards.breaker import BreakerState
from streamproc.core.guards.budget import RetryBudget
from streamproc.core.guards.gradient import GradientLimit
from streamproc.core.guards.own_queue import OwnQueue
from streamproc.core.guards.rate_limits import RateLimiter, RateLimits
from streamproc.core.guards.routing import Routes
from streamproc.core.guards.timeouts import AdaptiveTimeout
from streamproc.core.model_labels import FIRST_SEEN, OTHER
from streamproc.core.outcome import Failure, Success
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.client import CallResult
from streamproc.llm.guarded import Guards
from streamproc.settings import Settings
from tests.unit.app.test_handler_guards import MonotonicClock

MODELS = 100_000
WARM = 20_000  # far past every bound (1,024 states, 50 labels): from here on nothing may grow
CONFIGURED = "gpt-configured"


class Answering:
    """Answers every call at once; every third fails alike (so the pauses judge the model too)."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        self.calls += 1
        outcome = (Failure(FailureLayer.BUSINESS, "invalid_request_error", "no", 400) if self.calls % 3 == 0
                   else Success("ok", body["model"], 5, 1))
        headers: Mapping[str, str] = {"x-ratelimit-limit-requests": "600"}
        return CallResult(outcome, b"{}", 20, headers, body["model"])


def series(registry: CollectorRegistry) -> int:
    return sum(len(metric.samples) for metric in registry.collect())


def model_labels(registry: CollectorRegistry) -> set[str]:
    return {sample.labels["model"] for metric in registry.collect() for sample in metric.samples
            if "model" in sample.labels}


async def test_100000_model_names_leave_memory_and_series_flat() -> None:
    clock = MonotonicClock()
    guards = Guards(Answering(), routes=Routes(model_fallbacks={CONFIGURED: ["gpt-spare"]}),
                    limiter=RateLimiter(RateLimits(None, None), 1.0), adaptive=GradientLimit(1, 64, 8),
                    breakers=Settings(breaker_min_calls=2).guards.breaker, budget=RetryBudget(), clock=clock,
                    sleep=clock.sleep, wait=clock.wait)
    metrics = WorkerMetrics(CollectorRegistry(), prices={"gpt-priced": (1.0, 2.0)})
    metrics.track_guards(guards)
    queue, timeouts = OwnQueue(), AdaptiveTimeout(60.0)
    request = InferenceRequest("b/r", json.dumps({"model": "x", "messages": []}))

    async def flood(first: int, last: int) -> None:
        for i in range(first, last):
            model = f"model-{i}"
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            called = await guards.call(request, body, attempt=1)
            assert isinstance(called, CallResult)
            place = queue.start(model, clock.now)
            queue.finish(place, clock.now + 0.02, answered=True)
            timeouts.observe(model, 0.02, 16)
            metrics.on_llm_call(LlmCall(model, "success", 0.02, 5, 1))
            clock.now += 0.001

    await flood(0, WARM)
    metrics.on_llm_call(LlmCall(CONFIGURED, "success", 0.02, 5, 1))
    series_warm = series(metrics.registry)
    gc.collect()
    tracemalloc.start()  # traced from here: the bounded states are all replaced by the next WARM names
    try:
        await flood(WARM, 2 * WARM)
        gc.collect()
        middle, _ = tracemalloc.get_traced_memory()
        await flood(2 * WARM, MODELS)
        series_end = series(metrics.registry)
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    grown = end - middle
    print(f"traced after {2 * WARM:,} model names {middle / 1e6:.2f} MB, after {MODELS:,} {end / 1e6:.2f} MB "
          f"({grown / 1e3:+.1f} kB); metric series {series_warm} -> {series_end}")
    assert grown < 256 * 1024, f"memory grew {grown:,} bytes over {MODELS - WARM:,} more model names"
    assert series_end == series_warm
    labels = model_labels(metrics.registry)
    assert CONFIGURED in labels and OTHER in labels and f"model-{MODELS - 1}" not in labels
    assert len(labels - {CONFIGURED, OTHER}) == FIRST_SEEN
    # the per-model guard states stay at their bound; a model called again has its state back (the newest)
    assert len(guards.breakers) <= 1024 and len(guards.rate_limits()) <= 1024
    assert guards.breaker_states().get(f"model-{MODELS - 1}") is BreakerState.CLOSED
    assert "model-0" not in guards.breakers


async def test_an_invalid_model_name_is_a_business_failure_before_any_call() -> None:
    caller = Answering()
    guards = Guards(caller)
    for model, reason in (("a" * 257, "257 characters, over the 256-character limit"),
                          ("gpt 4", "' ' at position 3"), ("m\x00", "'\\x00' at position 1"), ("", "is empty")):
        checked = guards.precheck({"model": model, "messages": []})
        assert isinstance(checked, Failure), model
        assert (checked.layer, checked.code) == (FailureLayer.BUSINESS, "invalid_model_name")
        assert reason in checked.message and "not called" in checked.message
    assert caller.calls == 0
    assert guards.precheck({"model": "meta-llama/Llama-3.1-8B-Instruct:Q4@v1", "messages": []}) == {
        "model": "meta-llama/Llama-3.1-8B-Instruct:Q4@v1", "messages": []}
