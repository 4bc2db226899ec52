"""The guard wrappers one by one, and the order Guards stacks them in (the handler tests cover them together).

Time is a fake monotonic clock; sleeps only advance it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.budget import RetryBudget
from streamproc.core.guards.gradient import GradientLimit
from streamproc.core.guards.long_requests import LongRequests
from streamproc.core.guards.rate_limits import RateLimiter, RateLimits
from streamproc.core.guards.routing import Routes
from streamproc.core.guards.tenant_pauses import TenantPauses
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.outcome import Failure, Success
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.breakers import BreakerLayer, Breakers
from streamproc.llm.client import CallResult, hedge_permit
from streamproc.llm.context_fallback import ContextFallbackLayer
from streamproc.llm.gated import AdaptiveGate, GatedLayer
from streamproc.llm.guarded import Guards
from streamproc.llm.layer import Refused
from streamproc.llm.metered import MeteredCaller
from streamproc.llm.paced import MAX_SENDS, RateLimitedLayer
from streamproc.llm.routed import Deferred, Routed, RoutingLayer
from streamproc.settings import BreakerSettings
from tests.unit.app.test_handler_guards import MonotonicClock
from tests.unit.core.test_guard_gradient import QUEUED_FIRST_WINDOW

REQUEST = InferenceRequest("r-1", "{}", batch_id="b")
BODY: dict[str, Any] = {"model": "big", "messages": [{"role": "user", "content": "x" * 400}]}
OK = CallResult(Success("fine", "big", prompt_tokens=200, completion_tokens=1), b"{}", 40)
DOWN = CallResult(Failure(FailureLayer.SERVICE, "server_error", "HTTP 503", http_status=503), b"", 10)
TOO_LONG = CallResult(Failure(FailureLayer.BUSINESS, "context_length_exceeded", "too long", http_status=400), b"", 10)
EMPTY_BUCKET = CallResult(Failure(FailureLayer.SERVICE, "rate_limit_exceeded", "429", 429, retry_after_ms=3_000),
                          b"", 10, {"x-ratelimit-remaining-requests": "0"})
BREAKERS = BreakerSettings(failure_rate=0.5, window_s=10, min_calls=1, open_s=5, hold_s=0)


@dataclass
class Script:
    """The HTTP caller (and a layer that never refuses), answering from a list, then OK."""

    answers: list[CallResult] = field(default_factory=list)
    calls: list[tuple[dict[str, Any], bool]] = field(default_factory=list)

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool = True) -> CallResult:
        self.calls.append((body, first))
        return self.answers.pop(0) if self.answers else OK


@dataclass
class Refusing:
    """A layer whose breaker check refuses every call."""

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
        return Refused(body["model"])


def open_breaker(breakers: Breakers, model: str, now: float) -> None:
    breaker = breakers.get(model)
    assert breaker is not None
    breaker.record(False, now)  # min_calls=1: one failure opens it


async def test_metered_counts_first_attempts_only_and_calibrates_the_estimate() -> None:
    budget, estimator = RetryBudget(), TokenEstimator()
    metered = MeteredCaller(Script(), budget, estimator)
    await metered.call(REQUEST, BODY, True)
    await metered.call(REQUEST, BODY, False)
    assert budget.counts("b") == (1, 0)
    assert estimator.ratio > 1  # 200 prompt tokens reported for a raw estimate of 107


async def test_breaker_layer_records_what_breaks_and_refuses_once_open_without_calling() -> None:
    clock, script = MonotonicClock(), Script([DOWN, EMPTY_BUCKET, DOWN])
    breakers = Breakers(BreakerSettings(failure_rate=0.5, window_s=10, min_calls=3, open_s=5, hold_s=10))
    layer = BreakerLayer(script, breakers, clock)
    await layer.call(REQUEST, BODY, True)  # a 503: a failure
    await layer.call(REQUEST, BODY, True)  # a 429 is an answer from a working service: not one
    breaker = breakers.get("big")
    assert breaker is not None and breaker.window(clock()) == (2, 1)
    await layer.call(REQUEST, BODY, True)  # 2 of 3: open
    assert await layer.call(REQUEST, BODY, True) == Refused("big")
    assert len(script.calls) == 3


async def test_without_breaker_settings_the_breaker_layer_only_calls() -> None:
    script = Script([DOWN] * 20)
    layer = BreakerLayer(script, Breakers(None), MonotonicClock())
    for _ in range(20):
        assert await layer.call(REQUEST, BODY, True) == DOWN
    assert Breakers(None).get("big") is None


async def test_a_breaker_that_opens_during_the_token_wait_refuses_and_the_routing_picks_the_fallback() -> None:
    clock, counted, breakers = MonotonicClock(), list[tuple[str, ...]](), Breakers(BREAKERS)
    limiter = RateLimiter(RateLimits(rpm=60), share=1.0)
    limiter.for_model("big", clock()).reserve(1, clock())  # the bucket is empty: the next call waits a second

    async def sleep(seconds: float) -> None:  # while it waits, the breaker of "big" opens
        clock.now += seconds
        open_breaker(breakers, "big", clock())

    script = Script()
    paced = RateLimitedLayer(BreakerLayer(script, breakers, clock), limiter, TokenEstimator(), clock, sleep)
    routing = RoutingLayer(paced, Routes(model_fallbacks={"big": ["small"]}), breakers,
                           lambda *key: counted.append(key), clock)
    assert await routing.call(REQUEST, BODY, True) == Routed("small", replace(OK, model="small", deployment=""))
    assert [body["model"] for body, _ in script.calls] == ["small"]  # "big" was not called
    assert counted == [("big", "small", "breaker_open")]


async def test_routing_without_breakers_sends_the_body_as_it_is() -> None:
    script = Script()
    routing = RoutingLayer(script, Routes(), Breakers(None), lambda *key: None, MonotonicClock())
    assert await routing.call(REQUEST, BODY, True) == Routed("big", replace(OK, model="big", deployment=""))
    assert script.calls[0][0] is BODY


async def test_routing_defers_until_the_breaker_may_probe() -> None:
    clock, breakers = MonotonicClock(), Breakers(BREAKERS)
    open_breaker(breakers, "big", clock())
    clock.now += 2
    routing = RoutingLayer(Script(), Routes(), breakers, lambda *key: None, clock)
    assert await routing.call(REQUEST, BODY, True) == Deferred(3.0, "big", "circuit_open",
                                                               "the circuit breaker of big is open")


async def test_a_model_whose_first_calls_all_fail_alike_is_paused_and_probed() -> None:
    """A model the server refuses the same way every time: three calls, then its requests are parked."""
    clock = MonotonicClock()
    refused = CallResult(Failure(FailureLayer.BUSINESS, "invalid_request_error", "HTTP 400: bad param", 400), b"", 5)
    script = Script([refused] * 4)
    routing = RoutingLayer(script, Routes(), Breakers(None), lambda *key: None, clock)
    for _ in range(3):
        assert isinstance(await routing.call(REQUEST, BODY, True), Routed)
    deferred = await routing.call(REQUEST, BODY, True)
    assert isinstance(deferred, Deferred) and deferred.code == "model_paused" and "bad param" in deferred.reason
    assert deferred.delay_s == 60.0 and len(script.calls) == 3
    clock.now += 60  # the probe
    assert isinstance(await routing.call(REQUEST, BODY, True), Routed)
    assert isinstance(await routing.call(REQUEST, BODY, True), Deferred)  # one probe per interval


@dataclass
class RefusesTenant:
    """The HTTP caller: refuses every call of one tenant alike (a bad parameter its integration sets) until fixed."""

    tenant: str
    fixed: bool = False

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult:
        if request.tenant == self.tenant and not self.fixed:
            return CallResult(Failure(FailureLayer.BUSINESS, "invalid_value", "HTTP 400: temperature > 2", 400), b"", 5)
        return OK


async def test_a_tenant_whose_calls_fail_alike_is_paused_while_other_tenants_calls_go_on() -> None:
    clock, caller = MonotonicClock(), RefusesTenant("a")
    routing = RoutingLayer(caller, Routes(), Breakers(None), lambda *key: None, clock,
                           tenants=TenantPauses(threshold=3, probe_interval_s=10))
    of_a, of_b = replace(REQUEST, tenant="a"), replace(REQUEST, tenant="b")
    assert isinstance(await routing.call(of_b, BODY, True), Routed)
    for _ in range(3):
        assert isinstance(await routing.call(of_a, BODY, True), Routed)  # the failures themselves are answers
    deferred = await routing.call(of_a, BODY, True)
    assert isinstance(deferred, Deferred) and deferred.code == "tenant_paused" and deferred.delay_s == 10.0
    assert "tenant a is paused on big" in deferred.reason and "temperature > 2" in deferred.reason
    assert isinstance(await routing.call(of_b, BODY, True), Routed)  # the model is not paused for b
    clock.now += 10
    caller.fixed = True
    assert isinstance(await routing.call(of_a, BODY, True), Routed)  # the probe, answered: resumed
    assert isinstance(await routing.call(of_a, BODY, True), Routed)


@dataclass
class FirstCallWaits:
    """The HTTP caller: the first call waits for ``released`` and then gives ``first``; every later one gives
    ``later`` at once (a server that refuses fast and answers slowly)."""

    released: asyncio.Event
    first: CallResult
    later: CallResult
    sent: int = 0

    async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult:
        self.sent += 1
        if self.sent == 1:
            await self.released.wait()
            return self.first
        return self.later


async def test_fast_refusals_of_later_calls_do_not_pause_a_model_whose_first_call_is_being_answered() -> None:
    """As a real llama.cpp server does: a refused parameter comes back at once, an answer after a second."""
    clock, answered = MonotonicClock(), asyncio.Event()
    refused = CallResult(Failure(FailureLayer.BUSINESS, "invalid_request_error", "HTTP 500: json_schema", 500), b"", 1)
    routing = RoutingLayer(FirstCallWaits(answered, OK, refused), Routes(), Breakers(None), lambda *key: None, clock)
    first_call = asyncio.create_task(routing.call(REQUEST, BODY, True))
    await asyncio.sleep(0)
    for _ in range(3):
        assert isinstance(await routing.call(REQUEST, BODY, True), Routed)
    assert isinstance(await routing.call(REQUEST, BODY, True), Routed)  # not paused: the first call is out
    answered.set()
    assert await first_call == Routed("big", replace(OK, model="big", deployment=""))


async def test_a_cancelled_call_does_not_hold_the_pause_of_the_calls_after_it() -> None:
    clock, never = MonotonicClock(), asyncio.Event()
    refused = CallResult(Failure(FailureLayer.BUSINESS, "invalid_request_error", "HTTP 400: bad param", 400), b"", 5)
    routing = RoutingLayer(FirstCallWaits(never, refused, refused), Routes(), Breakers(None), lambda *key: None, clock)
    hung = asyncio.create_task(routing.call(REQUEST, BODY, True))
    await asyncio.sleep(0)
    for _ in range(3):
        await routing.call(REQUEST, BODY, True)
    assert isinstance(await routing.call(REQUEST, BODY, True), Routed)  # the first call is still out
    hung.cancel()
    await asyncio.gather(hung, return_exceptions=True)
    deferred = await routing.call(REQUEST, BODY, True)  # the four refusals count now
    assert isinstance(deferred, Deferred) and deferred.code == "model_paused" and deferred.delay_s == 60.0


async def test_context_fallback_follows_the_model_that_was_called_and_is_not_a_first_attempt() -> None:
    counted: list[tuple[str, ...]] = []
    routes = Routes(context_fallbacks={"small": "long", "big": "unused"})

    @dataclass
    class Routing:
        seen: list[tuple[str, bool]] = field(default_factory=list)

        async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> Routed | Deferred:
            self.seen.append((body["model"], first))
            return Routed("small", TOO_LONG) if body["model"] == "big" else Routed(body["model"], OK)

    routing = Routing()
    layer = ContextFallbackLayer(routing, routes, lambda *key: counted.append(key))
    assert await layer.call(REQUEST, BODY, True) == OK
    assert routing.seen == [("big", True), ("long", False)]
    assert counted == [("small", "long", "context_length")]


async def test_rate_limited_layer_charges_the_estimate_made_before_the_call_and_reports_congestion() -> None:
    clock, congestion = MonotonicClock(), list[tuple[str, float]]()
    limiter = RateLimiter(RateLimits(rpm=60), share=1.0)
    inner = Script([OK, EMPTY_BUCKET])
    layer = RateLimitedLayer(inner, limiter, TokenEstimator(), clock, clock.sleep, lambda *cut: congestion.append(cut))
    started = clock.now
    await layer.call(REQUEST, BODY, True)
    assert await layer.call(REQUEST, BODY, True) == OK  # 60/min, a burst of one: this one waited a second
    assert congestion == [("big", started + 1)]  # the model called: its deployment's in-flight limit is cut
    assert limiter.for_model("big", clock()).paused_until == started + 4  # the 429's retry-after: 3 s
    # the refused call waited out the pause, then its turn at 0.9 x 1/s, and went again (not a first attempt)
    assert clock.now == pytest.approx(started + 4 + 1 / 0.9)
    assert [first for _, first in inner.calls] == [True, True, False]


BUSY = CallResult(Failure(FailureLayer.SERVICE, "rate_limit_exceeded", "429", 429, retry_after_ms=1_000), b"", 10,
                  {"retry-after": "1"})


async def test_a_429_that_names_no_bucket_pauses_its_call_not_the_model() -> None:
    clock, congestion = MonotonicClock(), list[tuple[str, float]]()
    limiter = RateLimiter(RateLimits(rpm=6000), share=1.0)
    inner = Script([BUSY])
    layer = RateLimitedLayer(inner, limiter, TokenEstimator(), clock, clock.sleep, lambda *cut: congestion.append(cut))
    started = clock.now
    assert await layer.call(REQUEST, BODY, True) == OK
    assert clock.now == pytest.approx(started + 1)  # its own retry-after
    assert congestion == [] and limiter.for_model("big", clock()).paused_until == float("-inf")
    assert limiter.for_model("big", clock()).pace == 1.0
    assert layer.resent == 1


async def test_a_call_refused_at_every_send_goes_back_to_the_handler() -> None:
    clock = MonotonicClock()
    inner = Script([BUSY] * 5)
    layer = RateLimitedLayer(inner, RateLimiter(RateLimits(), share=1.0), TokenEstimator(), clock, clock.sleep)
    assert await layer.call(REQUEST, BODY, True) == BUSY
    assert len(inner.calls) == MAX_SENDS
    assert layer.resent == MAX_SENDS - 1  # the sends after the first: no failure event records them


async def test_a_refused_call_told_to_wait_long_goes_back_to_the_handler_at_once() -> None:
    clock = MonotonicClock()
    slow_down = CallResult(Failure(FailureLayer.SERVICE, "rate_limit_exceeded", "429", 429, retry_after_ms=30_000),
                           b"", 10, {})
    inner = Script([slow_down])
    layer = RateLimitedLayer(inner, RateLimiter(RateLimits(), share=1.0), TokenEstimator(), clock, clock.sleep)
    started = clock.now
    assert await layer.call(REQUEST, BODY, True) == slow_down  # the handler parks it: no slot held for 30 s
    assert len(inner.calls) == 1 and clock.now == started


async def test_a_hedge_of_the_call_is_charged_to_the_same_limiter() -> None:
    clock = MonotonicClock()
    limiter = RateLimiter(RateLimits(rpm=60), share=1.0)
    permits: list[bool] = []

    @dataclass
    class Hedging:
        async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
            permit = hedge_permit.get()
            assert permit is not None
            permits.append(permit())
            return OK

    layer = RateLimitedLayer(Hedging(), limiter, TokenEstimator(), clock, clock.sleep)
    started = clock.now
    await layer.call(REQUEST, BODY, True)
    assert permits == [True] and hedge_permit.get() is None
    await layer.call(REQUEST, BODY, True)
    assert clock.now == pytest.approx(started + 2)  # 1/s: the call, its hedge, then this one


async def test_rate_limited_layer_learns_nothing_from_a_refusal() -> None:
    clock, congestion = MonotonicClock(), list[tuple[str, float]]()
    limiter = RateLimiter(RateLimits(), share=1.0)
    layer = RateLimitedLayer(Refusing(), limiter, TokenEstimator(), clock, clock.sleep,
                             lambda *cut: congestion.append(cut))
    assert await layer.call(REQUEST, BODY, True) == Refused("big")
    assert limiter.limits_by_model()["big"] == RateLimits() and congestion == []


async def test_gated_layer_holds_a_slot_during_the_call_and_feeds_the_limit_on_success() -> None:
    adaptive = GradientLimit(1, 10, initial=2, window=1)
    gate = AdaptiveGate(adaptive)
    in_use: list[int] = []

    @dataclass
    class Peek:
        async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
            in_use.append(gate.in_use)
            return OK

    await GatedLayer(Peek(), gate, MonotonicClock()).call(REQUEST, BODY, True)
    assert in_use == [1] and gate.in_use == 0
    assert adaptive.limit == 8 and adaptive.baseline_s == 0.04  # a window of one answer, no queue: slow start x4


async def test_gated_layer_feeds_a_long_call_to_the_limit_only_when_no_short_call_measures() -> None:
    """A long generation is no queue signal while short calls are about; alone, it is the only signal."""
    adaptive = GradientLimit(1, 10, initial=2, window=1)
    clock = MonotonicClock()
    gate = AdaptiveGate(adaptive, long_requests=LongRequests(threshold_tokens=500, share=0.5, quiet_s=2.0),
                        clock=clock)
    long_body = {**BODY, "max_tokens": 2000}
    layer = GatedLayer(Script(), gate, clock)
    await gate.acquire(long=False)  # a short call in flight
    await layer.call(REQUEST, long_body, True)
    assert adaptive.limit == 2 and adaptive.baseline_s is None
    gate.release(long=False)
    clock.now += 2.0  # the short calls are quiet
    await layer.call(REQUEST, long_body, True)
    assert adaptive.limit == 8  # sampled: slow start


async def test_gated_layer_lets_a_probe_measure_an_answer_that_failed_its_checks(
        caplog: pytest.LogCaptureFixture) -> None:
    """The call sent alone came back cut at max_tokens (a semantic failure, no sample): its latency and the
    tokens in its usage still judge the probe. A refusal with nothing generated does not."""
    adaptive = GradientLimit(1, 256, initial=16)
    for latency, tokens in QUEUED_FIRST_WINDOW:
        adaptive.on_sample(latency, 16, latency, tokens)
    assert adaptive.probing
    clock = MonotonicClock()
    clock.now = 40.0
    refused = CallResult(Failure(FailureLayer.BUSINESS, "invalid_request_error", "no", http_status=500), b"{}", 5)
    cut = CallResult(Failure(FailureLayer.SEMANTIC, "truncated", "cut", http_status=200),
                     b'{"usage": {"prompt_tokens": 30, "completion_tokens": 64}}', 1200)

    @dataclass
    class Answers:
        script: list[CallResult]

        async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
            return self.script.pop(0)

    layer = GatedLayer(Answers([refused, cut]), AdaptiveGate(adaptive), clock)
    await layer.call(REQUEST, BODY, True)
    assert adaptive.probing and adaptive.limit == 1
    with caplog.at_level(logging.INFO, logger="streamproc.llm.gated"):
        await layer.call(REQUEST, BODY, True)
    assert not adaptive.probing and adaptive.limit == 4
    assert ("probe ended, queue: a call alone took 1.20 s for 64 tokens, the first window's calls waited 9.1 such "
            "calls (median); baseline 0.0187 s per token, limit 4") in caplog.text


async def test_a_probe_held_up_by_a_hung_call_gives_up_and_lets_the_waiting_calls_go(
        caplog: pytest.LogCaptureFixture) -> None:
    """The first window (10 ms and 50 ms answers) is not calm, so the limit drops to 1 until the calls out
    drain; one of them hangs. After twice the drain a one-slot server would take, the probe gives up."""
    adaptive = GradientLimit(1, 16, initial=4, window=2, min_rise_s=0.0)
    gate, hang = AdaptiveGate(adaptive), asyncio.Event()
    seconds = {"a": 0.01, "b": 0.05, "d": 0.0}

    @dataclass
    class Sleeps:
        async def call(self, request: InferenceRequest, body: dict[str, Any], first: bool) -> CallResult | Refused:
            if request.request_id == "hung":
                await hang.wait()
            delay = seconds.get(request.request_id, 0.0)
            await asyncio.sleep(delay)
            return CallResult(Success("fine", "big", 10, 10), b"{}", int(delay * 1000))

    layer = GatedLayer(Sleeps(), gate, time.monotonic)
    calls = [asyncio.create_task(layer.call(InferenceRequest(name, "{}", batch_id="b"), BODY, True))
             for name in ("hung", "a", "b")]
    with caplog.at_level(logging.INFO, logger="streamproc.llm.gated"):
        await asyncio.wait_for(asyncio.gather(*calls[1:]), 1)
        assert adaptive.probing and adaptive.limit == 1 and gate.in_use == 1  # the hung call is still out
        waiting = asyncio.create_task(layer.call(InferenceRequest("d", "{}", batch_id="b"), BODY, True))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await asyncio.wait_for(waiting, 1)  # 2 x 50 ms x (4 / 2) after the window closed
    assert not adaptive.probing and adaptive.limit == 4
    assert "probe ended, expired; baseline" in caplog.text and "limit 4" in caplog.text
    hang.set()
    await asyncio.wait_for(calls[0], 1)


async def test_a_call_waiting_for_a_breaker_holds_no_gate_slot() -> None:
    """Routing runs outside the gate: with one slot, a call held for an open breaker does not block another
    model's call."""
    clock, released = MonotonicClock(), asyncio.Event()

    async def wait(event: asyncio.Event, timeout_s: float) -> None:
        await released.wait()
        clock.now += timeout_s

    script = Script([DOWN])
    guards = Guards(script, adaptive=GradientLimit(1, 1), clock=clock, sleep=clock.sleep, wait=wait,
                    breakers=BreakerSettings(failure_rate=0.5, window_s=10, min_calls=1, open_s=5, hold_s=10))
    assert await guards.call(REQUEST, BODY, 1) == replace(DOWN, model="big", deployment="")  # its breaker opens
    held = asyncio.create_task(guards.call(REQUEST, BODY, 1))
    await asyncio.sleep(0)
    assert not held.done()
    assert await asyncio.wait_for(guards.call(REQUEST, {**BODY, "model": "other"}, 1), 1) == replace(
        OK, model="other", deployment="")
    released.set()
    assert await held == replace(OK, model="big", deployment="")
    assert [body["model"] for body, _ in script.calls] == ["big", "other", "big"]


async def test_a_body_without_a_model_goes_straight_to_the_caller() -> None:
    script, budget = Script(), RetryBudget()
    guards = Guards(script, budget=budget, adaptive=GradientLimit(1, 1), breakers=BREAKERS)
    assert await guards.call(REQUEST, {"messages": []}, 1) == OK
    assert budget.counts("b") == (0, 0) and guards.breaker_states() == {}


async def test_a_call_waiting_its_turn_when_a_rebalance_begins_is_parked_unsent() -> None:
    clock = MonotonicClock()
    limiter = RateLimiter(RateLimits(rpm=60), share=1.0)
    script = Script()
    paced = RateLimitedLayer(script, limiter, TokenEstimator(), clock, clock.sleep, giving_way=lambda: True)
    routing = RoutingLayer(paced, Routes(), Breakers(None), lambda *key: None, clock)
    deferred = await routing.call(REQUEST, BODY, True)
    assert isinstance(deferred, Deferred) and deferred.code == "rebalancing" and deferred.delay_s == 0.0
    assert script.calls == []


async def test_a_deployment_whose_breaker_opened_is_out_with_its_last_failure_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    guards = Guards(Script([DOWN]), breakers=BREAKERS)
    assert guards.out() == {}
    with caplog.at_level(logging.WARNING, logger="streamproc.llm.breakers"):
        await guards.call(REQUEST, BODY, 1)
    assert guards.out() == {"big": "circuit breaker open after HTTP 503 answers (server_error)"}
    assert "circuit breaker for big: closed -> open (too many transport/5xx failures, the last: HTTP 503" in caplog.text
