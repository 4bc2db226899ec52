"""The handler with the provider-batch route (design §8): a routed model's request is answered by the route instead
of a guarded call, its outcome goes the handler's one way, and the route hears that it was written only after."""

from __future__ import annotations

import random
from typing import Any

from streamproc.app.handler import Disposition, Handler, HandlerOptions
from streamproc.core.decision import Retries
from streamproc.core.events import InferenceRequest
from streamproc.core.guards.budget import RetryBudget
from streamproc.core.outcome import ConfigurationProblem
from streamproc.core.retry_policy import RetryPolicy
from streamproc.core.vocabulary import RequestStatus
from streamproc.llm.client import CallResult
from streamproc.llm.guarded import Guards
from tests.unit.app.test_handler import (
    BODY,
    PARTITION,
    UNAVAILABLE,
    Clock,
    DictStore,
    RecordingSink,
    Reply,
    ScriptedCaller,
    answer,
    make_request,
    rate_limited,
    submission,
)


class ScriptedRoute:
    """Routes ``gpt-test`` and answers from a script, logging into the rig's event log."""

    def __init__(self, log: list[str], replies: list[Reply]) -> None:
        self.log = log
        self.replies = replies

    def routes(self, model: object) -> bool:
        return model == "gpt-test"

    async def call(self, request: InferenceRequest, body: dict[str, Any], partition: int) -> CallResult:
        self.log.append(f"batched p{partition}")
        return self.replies.pop(0)(body)

    def written(self, request_id: str) -> None:
        self.log.append(f"written {request_id}")


def routed_rig(replies: list[Reply], budget: RetryBudget | None = None,
               ) -> tuple[Handler, list[str], RecordingSink, DictStore, ScriptedCaller]:
    log: list[str] = []
    sink, store, caller = RecordingSink(log), DictStore(log), ScriptedCaller([])
    problems: list[ConfigurationProblem] = []
    handler = Handler(Guards(caller, budget=budget), sink, store, Retries(RetryPolicy(), random.Random(7)),
                      problems.append, HandlerOptions(clock_ms=Clock(), route=ScriptedRoute(log, replies)))
    return handler, log, sink, store, caller


async def test_a_routed_request_is_answered_by_its_batch_and_the_route_hears_once_it_is_written() -> None:
    handler, log, sink, _, caller = routed_rig([answer("spam")])
    assert await handler.handle(submission(make_request())) is Disposition.ACK
    assert caller.calls == []  # no synchronous call
    assert log == ["state in_flight", f"batched p{PARTITION}", "result req-1", "state succeeded", "written req-1"]
    assert sink.results[0].content == "spam"


async def test_a_failed_line_goes_through_the_retry_tiers_before_the_route_hears() -> None:
    handler, log, _, store, _ = routed_rig([rate_limited(2_000)])
    await handler.handle(submission(make_request()))
    assert log == ["state in_flight", f"batched p{PARTITION}", "retry 5s", "failure service terminal=False",
                   "state retrying", "written req-1"]
    state = store.get("req-1")
    assert state is not None and state.status is RequestStatus.RETRYING


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
