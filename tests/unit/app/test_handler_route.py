"""The handler with the provider-batch route (design §8): a routed model's request is answered by the route instead
of a guarded call, its outcome goes the handler's one way, and the route hears that it was written only after."""

from __future__ import annotations

import random
from typing import Any

from streamproc.app.handler import Disposition, Handler, HandlerOptions
from streamproc.app.observe import LlmCall, NullObserver, Observer
from streamproc.app.spend import SpendGate
from streamproc.core import headers
from streamproc.core.decision import Retries
from streamproc.core.events import InferenceRequest
from streamproc.core.guards.budget import RetryBudget
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.outcome import ConfigurationProblem, Failure, Success
from streamproc.core.provider_batch_deadline import Way
from streamproc.core.retry_policy import RetryPolicy
from streamproc.core.spend_cap import Cap, Spend, batch_scope
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.core.written_outcome import WrittenOutcome
from streamproc.llm.client import CallResult
from streamproc.llm.guarded import Guards
from tests.unit.app.test_handler import (
    BODY,
    NOW,
    PARTITION,
    UNAVAILABLE,
    Clock,
    DictStore,
    RecordingSink,
    Reply,
    ScriptedCaller,
    answer,
    make_request,
    next_hop,
    rate_limited,
    submission,
)
from tests.unit.app.test_spend import ANSWERED_USD, PRICES


class ScriptedRoute:
    """Routes ``gpt-test`` and answers from a script, logging into the rig's event log."""

    def __init__(self, log: list[str], replies: list[Reply]) -> None:
        self.log = log
        self.replies = replies
        self.holding: set[str] = set()  # members of an open provider batch (taken over, awaiting their lines)
        self.asked: list[tuple[str, str, int]] = []  # (held/call, request id, attempt) as the handler asked
        self.ended_before: WrittenOutcome | None = None  # the outcome a killed owner wrote, given back to a call

    def routes(self, model: object) -> bool:
        return model == "gpt-test"

    async def held(self, request_id: str, attempt: int, partition: int) -> bool:
        self.asked.append(("held", request_id, attempt))
        return request_id in self.holding

    async def call(self, request: InferenceRequest, body: dict[str, Any], attempt: int, partition: int,
                   ) -> CallResult | WrittenOutcome:
        self.asked.append(("call", request.request_id, attempt))
        self.log.append(f"batched p{partition}")
        return self.ended_before or self.replies.pop(0)(body)

    def written(self, request_id: str) -> None:
        self.log.append(f"written {request_id}")


def routed_rig(replies: list[Reply], budget: RetryBudget | None = None,
               ) -> tuple[Handler, list[str], RecordingSink, DictStore, ScriptedCaller]:
    handler, log, sink, store, caller, _ = deadline_rig(replies, budget=budget)
    return handler, log, sink, store, caller


def deadline_rig(replies: list[Reply], deadline_ms: int | None = None, spend: SpendGate | None = None,
                 observer: Observer | None = None, budget: RetryBudget | None = None,
                 ) -> tuple[Handler, list[str], RecordingSink, DictStore, ScriptedCaller, ScriptedRoute]:
    """The routed rig whose batch ``batch-1`` has ``submit --deadline`` passing at ``deadline_ms``."""
    log: list[str] = []
    sink, store, caller = RecordingSink(log), DictStore(log), ScriptedCaller([])
    route = ScriptedRoute(log, replies)
    problems: list[ConfigurationProblem] = []
    handler = Handler(Guards(caller, budget=budget), sink, store, Retries(RetryPolicy(), random.Random(7)),
                      problems.append,
                      HandlerOptions(clock_ms=Clock(), route=route, spend=spend, observer=observer,
                                     deadline=lambda batch_id: deadline_ms if batch_id == "batch-1" else None))
    return handler, log, sink, store, caller, route


async def test_a_routed_request_is_answered_by_its_batch_and_the_route_hears_once_it_is_written() -> None:
    handler, log, sink, _, caller = routed_rig([answer("spam")])
    assert await handler.handle(submission(make_request())) is Disposition.ACK
    assert caller.calls == []  # no synchronous call
    assert log == ["state in_flight", f"batched p{PARTITION}", "result req-1", "state succeeded", "written req-1"]
    assert sink.results[0].content == "spam"


async def test_a_failed_line_goes_through_the_retry_tiers_before_the_route_hears() -> None:
    handler, log, _, store, _ = routed_rig([rate_limited(2_000)])
    await handler.handle(submission(make_request()))
    assert log == ["state in_flight", f"batched p{PARTITION}", "failure service terminal=False", "retry 5s",
                   "state retrying", "written req-1"]
    state = store.get("req-1")
    assert state is not None and state.status is RequestStatus.RETRYING


async def test_an_outcome_written_before_a_takeover_writes_only_the_state() -> None:
    """The batch's killed owner wrote the result; its state write was lost: the redelivered record's state follows
    the written result (its usage kept, as a provider batch's line), and nothing is sent again."""
    handler, log, sink, store, _, route = deadline_rig([])
    route.ended_before = WrittenOutcome(1, Success("spam", "gpt-test", 12, 3))
    assert await handler.handle(submission(make_request())) is Disposition.ACK
    assert log == ["state in_flight", f"batched p{PARTITION}", "state succeeded", "written req-1"]
    assert sink.results == []
    state = store.get("req-1")
    assert state is not None and (state.prompt_tokens, state.completion_tokens, state.provider_batch) == (12, 3, True)


async def test_a_terminal_failure_written_before_a_takeover_writes_only_the_state() -> None:
    handler, log, _, store, _, route = deadline_rig([])
    route.ended_before = WrittenOutcome(1, Failure(FailureLayer.BUSINESS, "invalid_request", "bad", 400))
    await handler.handle(submission(make_request()))
    assert log == ["state in_flight", f"batched p{PARTITION}", "state failed", "written req-1"]
    state = store.get("req-1")
    assert state is not None and (state.status, state.last_error_code) == (RequestStatus.FAILED, "invalid_request")


async def test_a_record_asking_for_a_call_is_called_though_its_model_is_routed() -> None:
    handler, log, sink, _, caller = routed_rig([])
    caller.replies.append(answer("ham"))
    await handler.handle(submission(make_request(), hdrs={headers.ROUTE: b"call"}))
    assert len(caller.calls) == 1 and not any(entry.startswith(("batched", "written")) for entry in log)
    assert sink.results[0].content == "ham"


async def test_a_record_asking_for_the_provider_batch_route_is_batched_though_its_model_is_not_routed() -> None:
    handler, log, sink, _, caller = routed_rig([answer("spam")])
    other = make_request(body={**BODY, "model": "gpt-other"})
    await handler.handle(submission(other, hdrs={headers.ROUTE: b"provider-batch"}))
    assert caller.calls == [] and f"batched p{PARTITION}" in log
    assert sink.results[0].content == "spam"


async def test_a_model_not_routed_is_called() -> None:
    handler, log, sink, _, caller = routed_rig([])
    caller.replies.append(answer("ham"))
    other = make_request(body={**BODY, "model": "gpt-other"})
    await handler.handle(submission(other))
    assert len(caller.calls) == 1 and not any(entry.startswith(("batched", "written")) for entry in log)
    assert sink.results[0].content == "ham"


async def test_a_routed_first_attempt_counts_for_the_retry_budget() -> None:
    """A line is no call through the guards, yet it is a first attempt: a budget of one retry per first attempt
    lets its failure be retried (it was terminal, ``retry_budget_exhausted``, when only calls counted)."""
    handler, log, _, store, _ = routed_rig([UNAVAILABLE], RetryBudget(ratio=1.0, minimum=0))
    await handler.handle(submission(make_request()))
    assert "failure service terminal=False" in log
    state = store.get("req-1")
    assert state is not None and state.status is RequestStatus.RETRYING


class CallsSeen(NullObserver):
    """An observer that keeps the calls it hears of."""

    def __init__(self) -> None:
        self.calls: list[LlmCall] = []

    def on_llm_call(self, call: LlmCall) -> None:
        self.calls.append(call)


async def test_before_the_deadline_a_routed_request_goes_into_a_provider_batch_at_half_the_price() -> None:
    gate, seen = SpendGate({"batch-1": Cap(max_cost_usd=1e9)}.get, PRICES, TokenEstimator()), CallsSeen()
    handler, log, _, store, caller, _ = deadline_rig([answer("spam")], deadline_ms=NOW + 1, spend=gate,
                                                      observer=seen)
    await handler.handle(submission(make_request()))
    assert caller.calls == [] and f"batched p{PARTITION}" in log
    assert gate.ledger.spent(batch_scope("batch-1")) == Spend(ANSWERED_USD / 2, 12)
    assert [call.way for call in seen.calls] == [Way.PROVIDER_BATCH]
    state = store.get("req-1")  # status prices its usage at the discount
    assert state is not None and state.provider_batch and state.prompt_tokens == 9


async def test_past_the_deadline_a_routed_request_is_called_at_the_full_price() -> None:
    gate, seen = SpendGate({"batch-1": Cap(max_cost_usd=1e9)}.get, PRICES, TokenEstimator()), CallsSeen()
    handler, log, sink, store, caller, _ = deadline_rig([], deadline_ms=NOW, spend=gate, observer=seen)
    caller.replies.append(answer("ham"))
    await handler.handle(submission(make_request()))  # a first attempt read after the deadline
    assert len(caller.calls) == 1 and not any(entry.startswith(("batched", "written")) for entry in log)
    assert sink.results[0].content == "ham"
    assert gate.ledger.spent(batch_scope("batch-1")) == Spend(ANSWERED_USD, 12)
    assert [call.way for call in seen.calls] == [Way.CALL]
    state = store.get("req-1")  # status prices its usage at the full price
    assert state is not None and state.status is RequestStatus.SUCCEEDED and not state.provider_batch
    assert state.prompt_tokens == 9


async def test_a_line_retried_after_the_deadline_is_called() -> None:
    handler, log, sink, _, caller, _ = deadline_rig([rate_limited(2_000)], deadline_ms=NOW)
    caller.replies.append(answer("ham"))
    handler_before, _, before_sink, _, _, _ = deadline_rig([rate_limited(2_000)], deadline_ms=NOW + 1)
    await handler_before.handle(submission(make_request()))  # its provider batch's line failed before the deadline
    retried = before_sink.retries[0]
    assert await handler.handle(next_hop(retried, offset=1)) is Disposition.ACK
    assert len(caller.calls) == 1 and not any(entry.startswith("batched") for entry in log)
    assert sink.results[0].content == "ham" and sink.results[0].attempts == 2


async def test_a_request_a_provider_batch_holds_waits_for_its_line_past_the_deadline() -> None:
    handler, log, sink, _, caller, route = deadline_rig([answer("spam")], deadline_ms=NOW)
    route.holding.add("req-1")  # redelivered while its provider batch, taken over, is open
    await handler.handle(submission(make_request()))
    assert caller.calls == [] and f"batched p{PARTITION}" in log and sink.results[0].content == "spam"


async def test_a_batch_without_a_deadline_is_never_called() -> None:
    handler, log, _, _, caller, _ = deadline_rig([answer("spam")])
    await handler.handle(submission(make_request()))
    assert caller.calls == [] and f"batched p{PARTITION}" in log


async def test_the_route_is_told_the_attempt_it_answers() -> None:
    """A taken-over batch's line answers only the attempt it was gathered for: the route is asked by attempt."""
    handler, _, sink, _, _, route = deadline_rig([rate_limited(2_000)])
    await handler.handle(submission(make_request()))
    later, _, later_sink, _, _, later_route = deadline_rig([answer("spam")])
    await later.handle(next_hop(sink.retries[0], offset=1))
    assert route.asked == [("call", "req-1", 1)] and later_route.asked == [("call", "req-1", 2)]
    assert later_sink.results[0].attempts == 2


async def test_past_the_deadline_the_route_is_asked_whether_it_holds_this_attempt() -> None:
    handler, _, _, _, _, route = deadline_rig([answer("spam")], deadline_ms=NOW)
    route.holding.add("req-1")
    await handler.handle(submission(make_request()))
    assert route.asked == [("held", "req-1", 1), ("call", "req-1", 1)]
