"""The handler with its guards: breaker deferral, retry budget, pre-check and context fallback (issue 6).

The guards run on a fake monotonic clock and a sleep that only advances it, so no test waits.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field

from streamproc.app.handler import Disposition, Handler, HandlerOptions
from streamproc.core import headers
from streamproc.core.decision import Retries
from streamproc.core.guards.budget import RetryBudget
from streamproc.core.guards.gradient import GradientLimit
from streamproc.core.guards.rate_limits import RateLimiter, RateLimits
from streamproc.core.guards.routing import Routes
from streamproc.core.request_state import CIRCUIT_OPEN, REBALANCING
from streamproc.core.verdict import classify_http_error
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.llm.client import CallResult
from streamproc.llm.guarded import Guards
from streamproc.settings import BreakerSettings
from tests.unit.app.test_handler import (
    BODY,
    CONTEXT_TOO_LONG,
    SEED,
    UNAVAILABLE,
    Reply,
    Rig,
    answer,
    cut_off,
    make_request,
    next_hop,
    submission,
    text,
)


@dataclass
class MonotonicClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        """An event wait that times out at once, on this clock (nothing else runs in these tests)."""
        if not event.is_set():
            self.now += timeout_s


@dataclass
class GuardedRig(Rig):
    """The handler rig of test_handler, with real guards in front of the scripted caller."""

    routes: Routes = field(default_factory=Routes)
    breakers: BreakerSettings | None = None
    budget: RetryBudget | None = None
    limiter: RateLimiter | None = None
    adaptive: GradientLimit | None = None
    rebalancing: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.monotonic = MonotonicClock()
        self.guards = Guards(self.caller, routes=self.routes, breakers=self.breakers, budget=self.budget,
                             limiter=self.limiter, adaptive=self.adaptive, clock=self.monotonic,
                             sleep=self.monotonic.sleep,
                             wait=self.monotonic.wait, giving_way=lambda: self.rebalancing)
        self.handler = Handler(self.guards, self.sink, self.store, Retries(self.policy, random.Random(SEED)),
                               self.problems.append, HandlerOptions(clock_ms=self.clock))


async def test_open_breaker_parks_the_record_without_a_call_and_its_attempt_runs_later() -> None:
    rig = GuardedRig([UNAVAILABLE, UNAVAILABLE, answer("ok")],
                     breakers=BreakerSettings(failure_rate=0.5, window_s=10, min_calls=2, open_s=5, hold_s=0))
    for i in range(2):  # two 503s open the breaker of gpt-test
        assert await rig.handle(submission(make_request(f"r{i}"), offset=i)) is Disposition.ACK
    assert rig.guards.breaker_states()["gpt-test"].value == "open"

    parked = make_request("parked")
    assert await rig.handle(submission(parked, offset=10)) is Disposition.ACK
    assert len(rig.caller.calls) == 2  # no call for the parked record
    deferred = rig.sink.retries[-1]
    assert deferred.request == parked
    assert text(deferred.headers, headers.ATTEMPT) == "1"  # the attempt was not made
    assert text(deferred.headers, headers.DEFERRED) == "1"
    assert text(deferred.headers, headers.ERROR_CODE) == CIRCUIT_OPEN
    assert headers.FIRST_FAILURE_TS not in deferred.headers  # nothing failed
    assert int(text(deferred.headers, headers.DUE_TS)) - rig.clock.now >= 5_000  # not before the probe
    assert not [event for event, _ in rig.sink.failures if event.request.request_id == "parked"]
    state = rig.state("parked")
    assert (state.status, state.attempts, state.last_error_code) == (RequestStatus.RETRYING, 1, CIRCUIT_OPEN)

    resubmitted = await rig.handle(submission(parked, offset=11))  # a duplicate submission while parked
    assert resubmitted is Disposition.ACK and len(rig.caller.calls) == 2

    rig.monotonic.now += 5  # the breaker half-opens: the parked attempt is the probe, and it succeeds
    assert await rig.handle(next_hop(deferred, offset=1)) is Disposition.ACK
    assert len(rig.caller.calls) == 3
    assert [result.request_id for result in rig.sink.results] == ["parked"]
    assert rig.state("parked").status is RequestStatus.SUCCEEDED
    assert rig.guards.breaker_states()["gpt-test"].value == "closed"

    assert await rig.handle(next_hop(deferred, offset=2)) is Disposition.ACK  # a stale copy: skipped
    assert len(rig.caller.calls) == 3


async def test_a_call_waits_for_the_probe_when_the_breaker_half_opens_within_the_hold() -> None:
    """With a hold longer than the open period, the record waits (its slot held, no Kafka traffic) and is
    itself the half-open probe: no parking, one call."""
    rig = GuardedRig([UNAVAILABLE, UNAVAILABLE, answer("ok")],
                     breakers=BreakerSettings(failure_rate=0.5, window_s=10, min_calls=2, open_s=5, hold_s=10))
    for i in range(2):
        await rig.handle(submission(make_request(f"r{i}"), offset=i))
    opened_at = rig.monotonic.now
    await rig.handle(submission(make_request("waits"), offset=10))
    assert [result.request_id for result in rig.sink.results] == ["waits"]
    assert not rig.sink.retries[2:]  # only the two 503s were scheduled for retry: nothing parked
    assert rig.monotonic.now - opened_at >= 5  # not before the open period ended
    assert rig.guards.breaker_states()["gpt-test"].value == "closed"


async def test_a_call_is_parked_when_the_breaker_cannot_probe_within_the_hold() -> None:
    rig = GuardedRig([UNAVAILABLE, UNAVAILABLE],
                     breakers=BreakerSettings(failure_rate=0.5, window_s=10, min_calls=2, open_s=30, hold_s=10))
    for i in range(2):
        await rig.handle(submission(make_request(f"r{i}"), offset=i))
    await rig.handle(submission(make_request("parked"), offset=10))
    assert len(rig.caller.calls) == 2
    assert rig.sink.retries[-1].request.request_id == "parked"
    assert text(rig.sink.retries[-1].headers, headers.DEFERRED) == "1"


async def test_breaker_open_sends_to_the_fallback_model_and_the_result_says_so() -> None:
    fallback_answer = answer("from the fallback")
    rig = GuardedRig([UNAVAILABLE, UNAVAILABLE, fallback_answer],
                     routes=Routes(model_fallbacks={"gpt-test": ["gpt-small"]}),
                     breakers=BreakerSettings(failure_rate=0.5, window_s=10, min_calls=2, open_s=5, hold_s=10))
    for i in range(2):
        await rig.handle(submission(make_request(f"r{i}"), offset=i))
    await rig.handle(submission(make_request("routed"), offset=10))
    assert rig.caller.calls[-1][1]["model"] == "gpt-small"
    assert rig.sink.results[-1].request_id == "routed"
    assert rig.guards.fallbacks == {("gpt-test", "gpt-small", "breaker_open"): 1}


async def test_spent_retry_budget_makes_a_retryable_failure_terminal() -> None:
    rig = GuardedRig([UNAVAILABLE, UNAVAILABLE], budget=RetryBudget(ratio=0.0, minimum=1))
    await rig.handle(submission(make_request("first"), offset=0))
    await rig.handle(submission(make_request("second"), offset=1))
    assert [sent.request.request_id for sent in rig.sink.retries] == ["first"]
    event, _ = rig.sink.failures[-1]
    assert event.request.request_id == "second" and event.terminal
    assert (event.layer, event.error_code) == (FailureLayer.SERVICE, "retry_budget_exhausted")
    assert event.message.startswith("server_error, not retried") and "HTTP 503" in event.message, event.message
    assert rig.state("second").status is RequestStatus.FAILED
    assert rig.guards.budget_exhausted == 1


async def test_escalations_spend_nothing_of_the_batch_s_retry_budget_which_stays_for_real_failures() -> None:
    rig = GuardedRig([cut_off("The message is"), cut_off("The message is spam"), UNAVAILABLE],
                     budget=RetryBudget(ratio=0.0, minimum=1))
    await rig.handle(submission(make_request("cut", {**BODY, "max_tokens": 16}), offset=0))
    await rig.handle(next_hop(rig.sink.retries[0], offset=1))
    await rig.handle(next_hop(rig.sink.retries[1], offset=2))  # a 503: the one retry the budget allows
    assert [body["max_tokens"] for _, body in rig.caller.calls] == [16, 32, 64]
    assert [text(sent.headers, headers.MAX_TOKENS) for sent in rig.sink.retries] == ["32", "64", "64"]
    assert rig.guards.budget_exhausted == 0 and rig.state("cut").retries_spent == 1
    assert rig.guards.budget is not None and rig.guards.budget.counts("batch-1") == (1, 1)


async def test_an_escalation_never_asks_for_more_than_the_model_s_window_leaves() -> None:
    body = {**BODY, "max_tokens": 64}
    prompt = Guards(Rig().caller).estimator.prompt_tokens(body)
    rig = GuardedRig([cut_off("The message is"), cut_off("The message is spam"), answer("Spam.")],
                     routes=Routes(context_windows={"gpt-test": prompt + 100}))
    await rig.handle(submission(make_request("near", body), offset=0))
    await rig.handle(next_hop(rig.sink.retries[0], offset=1))
    assert [sent["max_tokens"] for _, sent in rig.caller.calls] == [64, 100]  # not 128: the window is full
    second = rig.sink.retries[1]  # no room left to give: a repair, with the budget it had
    assert text(second.headers, headers.MAX_TOKENS) == "100" and second.request.repair is not None
    assert rig.state("near").retries_spent == 1


async def test_an_escalation_past_the_window_goes_to_the_context_fallback() -> None:
    body = {**BODY, "max_tokens": 64}
    prompt = Guards(Rig().caller).estimator.prompt_tokens(body)
    routes = Routes(context_windows={"gpt-test": prompt + 100, "gpt-big": prompt + 1_000},
                    context_fallbacks={"gpt-test": "gpt-big"})
    assert routes.completion_room("gpt-test", prompt) == 1_000
    assert routes.completion_room("gpt-big", prompt) == 1_000
    assert Routes(context_windows={"gpt-test": 10}, context_fallbacks={"gpt-test": "unknown"}).completion_room(
        "gpt-test", 5) is None  # a fallback whose window is unknown takes any budget
    assert Routes().completion_room("gpt-test", 5) is None
    rig = GuardedRig([cut_off("The message is"), answer("Spam.")], routes=routes)
    await rig.handle(submission(make_request("grows", body), offset=0))
    await rig.handle(next_hop(rig.sink.retries[0], offset=1))
    assert [(sent["model"], sent["max_tokens"]) for _, sent in rig.caller.calls] == [("gpt-test", 64),
                                                                                   ("gpt-big", 128)]
    assert [result.request_id for result in rig.sink.results] == ["grows"]


async def test_precheck_fails_an_input_over_the_window_before_any_call() -> None:
    rig = GuardedRig([], routes=Routes(context_windows={"gpt-test": 100}))
    body = {**BODY, "max_tokens": 90}
    await rig.handle(submission(make_request("big", body), offset=0))
    assert rig.caller.calls == []
    (event, _), = rig.sink.failures
    assert event.terminal and (event.layer, event.error_code) == (FailureLayer.BUSINESS, "context_length_exceeded")
    assert "no context fallback is configured" in event.message
    assert rig.state("big").status is RequestStatus.FAILED


async def test_precheck_routes_to_the_context_fallback() -> None:
    rig = GuardedRig([answer("long answer")], routes=Routes(context_windows={"gpt-test": 100, "gpt-long": 1000},
                                                            context_fallbacks={"gpt-test": "gpt-long"}))
    await rig.handle(submission(make_request("big", {**BODY, "max_tokens": 90}), offset=0))
    assert [body["model"] for _, body in rig.caller.calls] == ["gpt-long"]
    assert len(rig.sink.results) == 1 and not rig.sink.failures


async def test_provider_context_refusal_goes_on_to_the_fallback_in_the_same_attempt() -> None:
    rig = GuardedRig([CONTEXT_TOO_LONG, answer("fits now")],
                     routes=Routes(context_fallbacks={"gpt-test": "gpt-long"}))
    await rig.handle(submission(make_request("big"), offset=0))
    assert [body["model"] for _, body in rig.caller.calls] == ["gpt-test", "gpt-long"]
    assert rig.sink.results[0].attempts == 1 and not rig.sink.failures


async def test_without_a_context_fallback_the_refusal_is_a_business_failure() -> None:
    rig = GuardedRig([CONTEXT_TOO_LONG])
    await rig.handle(submission(make_request("big"), offset=0))
    (event, _), = rig.sink.failures
    assert event.terminal and event.error_code == "context_length_exceeded"


async def test_a_call_not_sent_when_a_rebalance_begins_is_parked_and_its_attempt_runs_after() -> None:
    rig = GuardedRig([answer("ok")], limiter=RateLimiter(RateLimits(rpm=60), share=1.0), rebalancing=True)
    waiting = make_request("waiting")
    assert await rig.handle(submission(waiting, offset=0)) is Disposition.ACK
    assert rig.caller.calls == []
    parked = rig.sink.retries[-1]
    assert parked.request == waiting and parked.tier == rig.policy.tiers[0]
    assert text(parked.headers, headers.ATTEMPT) == "1"  # the attempt was not made: it spends nothing
    assert text(parked.headers, headers.ERROR_CODE) == REBALANCING
    assert int(text(parked.headers, headers.DUE_TS)) - rig.clock.now <= 1_000  # due at once (and a jitter)
    assert not rig.sink.failures
    state = rig.state("waiting")
    assert (state.status, state.attempts, state.last_error_code) == (RequestStatus.RETRYING, 1, REBALANCING)

    rig.rebalancing = False  # whoever reads the tier next makes the attempt
    assert await rig.handle(next_hop(parked, offset=1)) is Disposition.ACK
    assert [result.request_id for result in rig.sink.results] == ["waiting"]
    assert rig.state("waiting").status is RequestStatus.SUCCEEDED


async def test_rate_limiter_paces_calls_on_the_monotonic_clock() -> None:
    rig = GuardedRig([answer(str(i)) for i in range(5)], limiter=RateLimiter(RateLimits(rpm=60), share=1.0))
    started = rig.monotonic.now
    for i in range(5):
        await rig.handle(submission(make_request(f"p{i}"), offset=i))
    # 60/min = 1/s, with a burst of one: the 5th call waits about 4 s after the first
    assert 3.5 <= rig.monotonic.now - started <= 4.5, rig.monotonic.now - started
    assert len(rig.sink.results) == 5



def limited(remaining_requests: str) -> Reply:
    """A 429 as OpenAI sends it, with the account's limit and what remains of it."""
    hdrs = {"retry-after-ms": "2000", "x-ratelimit-limit-requests": "600",
            "x-ratelimit-remaining-requests": remaining_requests, "x-ratelimit-remaining-tokens": "90000"}
    raw = json.dumps({"error": {"message": "Rate limit reached", "type": "requests",
                                "code": "rate_limit_exceeded"}}).encode()
    outcome = classify_http_error(429, hdrs, raw)
    return lambda body: CallResult(outcome, raw, 30, hdrs)


async def test_a_429_saying_the_bucket_is_empty_pauses_the_model_and_cuts_the_in_flight_limit() -> None:
    rig = GuardedRig([limited("0"), answer("after the pause")], limiter=RateLimiter(RateLimits(), share=1.0),
                     adaptive=GradientLimit(1, 100, initial=100))
    refused_at = rig.monotonic.now
    await rig.handle(submission(make_request("r"), offset=0))
    model = rig.guards.rate_limits()["gpt-test"]
    assert model.rpm == 600  # learned from x-ratelimit-limit-requests
    assert rig.limiter is not None and rig.adaptive is not None
    assert rig.limiter.for_model("gpt-test", rig.monotonic.now).paused_until == refused_at + 2.0
    assert rig.adaptive.limit == 90
    # the refused call waited out the pause and went again, in the same attempt: no retry, no failure event
    assert len(rig.caller.calls) == 2 and rig.monotonic.now >= refused_at + 2.0
    assert rig.sink.results[0].attempts == 1 and not rig.sink.retries and not rig.sink.failures


async def test_a_429_while_the_provider_has_room_is_that_request_s_refusal_only() -> None:
    rig = GuardedRig([limited("5"), answer("after its own wait")], limiter=RateLimiter(RateLimits(), share=1.0),
                     adaptive=GradientLimit(1, 100, initial=100))
    refused_at = rig.monotonic.now
    await rig.handle(submission(make_request("r"), offset=0))
    assert rig.limiter is not None and rig.adaptive is not None
    assert rig.limiter.for_model("gpt-test", rig.monotonic.now).paused_until == float("-inf")
    assert rig.adaptive.limit == 100
    assert len(rig.caller.calls) == 2 and rig.monotonic.now >= refused_at + 2.0  # its retry-after-ms
    assert len(rig.sink.results) == 1
