"""The handler's decisions (core.decision): every outcome layer, attempt number, replay, deferral and closed batch
ends in the one outcome the rules give, its sends before its state write, its records' headers right (design §2,
§4, §5.2).

The expected outcome is stated here from the rules themselves (the layers' attempt budgets, business never
retried, a spent budget, a closed batch, a cut answer's escalation), not from the retry policy's code, so a wrong
decision fails.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamproc.core.decision import (
    BUDGET_EXCEEDED,
    Action,
    Answered,
    Attempt,
    Call,
    CallEnd,
    Defer,
    EmitFailure,
    EmitResult,
    EndAttempt,
    Hold,
    Parked,
    Retries,
    ScheduleRetry,
    WriteIfAbsent,
    WriteState,
    after_call,
    failure_emission,
    on_record,
    terminal_failure,
)
from streamproc.core.events import InferenceRequest, InferenceResult, RequestState
from streamproc.core.guards.budget import EXHAUSTED_REASON
from streamproc.core.headers import Hop, Origin, read_hop
from streamproc.core.outcome import ConfigurationProblem, Failure, Success
from streamproc.core.record_size import CARRIED_BYTES, REQUEST_TOO_LARGE, RESPONSE_TOO_LARGE
from streamproc.core.request_state import BUDGET_EXHAUSTED, CIRCUIT_OPEN, MODEL_PAUSED, RecordRef, Skip, input_hash
from streamproc.core.retention import BATCH_FORGOTTEN
from streamproc.core.retry_policy import TRUNCATED, CompletionBudget, RetryPolicy, Stop, Terminal, Tier
from streamproc.core.vocabulary import FailureLayer, RequestStatus

NOW = 1_700_000_000_000
AFTER_CALL = NOW + 1_500
FIRST_FAILURE = NOW - 60_000
ORIGIN = Origin("llm.requests", 3, 100)
SOURCE = RecordRef("llm.retry.5s", 42)
POLICY = RetryPolicy()
BUDGETS = {FailureLayer.TRANSPORT: 6, FailureLayer.SERVICE: 6, FailureLayer.SEMANTIC: 3, FailureLayer.BUSINESS: 1}
REQUEST = InferenceRequest("batch-1/req-1", json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                           batch_id="batch-1")
ANSWER = Success("spam", "m", 9, 3)
RESULT = InferenceResult(REQUEST.request_id, "batch-1", "m", "{}", "spam", 1, 12, AFTER_CALL, input_hash(REQUEST))

ENDS: dict[str, CallEnd] = {
    "success": Answered(ANSWER, RESULT),
    "success too large": Answered(ANSWER, RESULT, Failure(FailureLayer.BUSINESS, RESPONSE_TOO_LARGE, "big", 200)),
    "parked": Parked(2_000, Failure(FailureLayer.SERVICE, CIRCUIT_OPEN, "the breaker of m is open")),
    "parked long": Parked(60_000, Failure(FailureLayer.SERVICE, MODEL_PAUSED, "m is paused")),  # past the tier
    "account problem": ConfigurationProblem("invalid_api_key", "bad key", 401),
    "model problem": ConfigurationProblem("model_not_found", "no such model", 404),
    **{layer.value: Failure(layer, "some_code", "why", 503, retry_after_ms=1_000) for layer in FailureLayer},
    "cut": Failure(FailureLayer.SEMANTIC, TRUNCATED, "finish_reason=length: the answer was cut off", 200),
}
CLOSED = (None, "batch_cancelled", "batch_expired")


def spent(failure: Failure, attempt: int) -> Terminal | None:
    """A batch budget with nothing left (a retry of a 429 would not ask it: see core.retry_policy)."""
    return Terminal(EXHAUSTED_REASON, Failure(failure.layer, EXHAUSTED_REASON, "spent", failure.http_status))


# -- the record and the table that admit it ------------------------------------------------------------------------
def prior_state(attempt: int, replay: bool, deferred: bool) -> RequestState | None:
    """A table entry that admits the record: the parked attempt for a deferred record, a failed request for a replay,
    the previous attempt waiting for a retry, nothing for a first submission."""
    base = RequestState(REQUEST.request_id, RequestStatus.RETRYING, input_hash(REQUEST), attempts=attempt - 1,
                        batch_id="batch-1", created_ms=NOW - 90_000, updated_ms=NOW - 30_000, run=1)
    if deferred:
        return replace(base, attempts=attempt, last_error_code=CIRCUIT_OPEN)
    if replay:
        return replace(base, status=RequestStatus.FAILED, attempts=3, run=2)
    return None if attempt == 1 else base


def record_hop(attempt: int, replay: bool, deferred: bool) -> Hop:
    carried = deferred or (not replay and attempt > 1)
    return Hop(attempt, None, FIRST_FAILURE if attempt > 1 else None, ORIGIN, replay, deferred,
               max_tokens=64 if carried else None, run=1 if carried else 0)


@dataclass(frozen=True)
class Decided:
    """A record's two decisions: on_record's, and after_call's when it was called."""

    admitted: list[Action]
    called: list[Action] | None


def decide(end_kind: str, attempt: int, replay: bool, deferred: bool, closed: str | None,
           budget: Stop | None = None, seed: int = 7, completion: CompletionBudget | None = None) -> Decided:
    record = Attempt(REQUEST, record_hop(attempt, replay, deferred), SOURCE, NOW)
    admitted = on_record(record, prior_state(attempt, replay, deferred), closed)
    if not isinstance(admitted[-1], Call):
        return Decided(admitted, None)
    started = admitted[-1].attempt.at(AFTER_CALL)
    return Decided(admitted, after_call(started, ENDS[end_kind], Retries(POLICY, random.Random(seed)), budget,
                                        completion))


# -- what the rules say --------------------------------------------------------------------------------------------
def escalated_budget(end_kind: str, attempt: int, completion: CompletionBudget | None) -> int | None:
    """A cut answer after one of the first 3 attempts, its budget doubled within 8 times the request's own and the
    room (design §5.4); None when the retry is no escalation."""
    if end_kind != "cut" or attempt > 3 or completion is None or completion.own is None or completion.sent is None:
        return None
    room = completion.room if completion.room is not None else completion.own * 8
    grown = min(completion.sent * 2, completion.own * 8, room)
    return grown if grown > completion.sent else None


def expected_outcome(end_kind: str, attempt: int, replay: bool, closed: str | None, budget_spent: bool,
                     completion: CompletionBudget | None = None) -> str:
    if closed is not None and not replay:
        return "terminal"  # never called
    if end_kind == "success":
        return "result"
    if end_kind.startswith("parked"):
        return "deferral"
    if end_kind == "account problem":
        return "hold"
    if end_kind in ("success too large", "model problem"):
        return "terminal"
    if escalated_budget(end_kind, attempt, completion) is not None:  # neither the layer's attempts nor the budget
        return "retry"
    failure = ENDS[end_kind]
    assert isinstance(failure, Failure)
    layer = failure.layer
    if layer is FailureLayer.BUSINESS or attempt >= BUDGETS[layer] or budget_spent:
        return "terminal"
    return "retry"


SENDS = (EmitResult, EmitFailure, ScheduleRetry, Defer)
WRITES = (WriteState, EndAttempt, WriteIfAbsent)


def outcome_of(actions: list[Action]) -> str:
    """The one outcome the actions add up to (or what they were)."""
    kinds = [type(action).__name__ for action in actions if not isinstance(action, WRITES)]
    failures = [action.event.terminal for action in actions if isinstance(action, EmitFailure)]
    match kinds:
        case ["EmitResult"]:
            return "result"
        case ["EmitFailure", "ScheduleRetry"] if failures == [False]:  # the event first: a crash repeats it
            return "retry"
        case ["EmitFailure"] if failures == [True]:
            return "terminal"
        case ["Defer"]:
            return "deferral"
        case ["Hold"]:
            return "hold"
    return f"several: {kinds}"


def check(end_kind: str, attempt: int, replay: bool, deferred: bool, closed: str | None,
          budget_spent: bool = False, seed: int = 7, completion: CompletionBudget | None = None) -> None:
    decided = decide(end_kind, attempt, replay, deferred, closed, spent if budget_spent else None, seed, completion)
    first = decided.admitted[0]
    assert isinstance(first, WriteState) and first.state.status is RequestStatus.IN_FLIGHT  # every record starts
    assert first.state.attempts == attempt and first.state.run >= 1
    actions = decided.admitted[1:] if decided.called is None else decided.called
    outcome = outcome_of(actions)
    assert outcome == expected_outcome(end_kind, attempt, replay, closed, budget_spent, completion), actions
    escalated = escalated_budget(end_kind, attempt, completion)
    writes = [index for index, action in enumerate(actions) if isinstance(action, WRITES)]
    sends = [index for index, action in enumerate(actions) if isinstance(action, SENDS)]
    assert not writes or not sends or max(sends) < min(writes), actions  # every send before the state write
    started = first.state
    now = NOW if decided.called is None else AFTER_CALL
    hop = record_hop(attempt, replay, deferred)
    for action in actions:
        match action:
            case EmitFailure(event, hdrs):
                assert (event.attempt, event.run, event.last_failure_ms) == (attempt, started.run, now)
                assert event.first_failure_ms == (hop.first_failure_ms or now)
                assert read_hop(hdrs) == Hop(attempt, first_failure_ms=event.first_failure_ms, origin=ORIGIN,
                                             run=started.run)
            case ScheduleRetry(tier, request, next_hop, failure, repair):
                assert request == REQUEST and failure == ENDS[end_kind]
                assert (next_hop.attempt, next_hop.replay, next_hop.deferred) == (attempt + 1, False, False)
                assert next_hop.first_failure_ms == (hop.first_failure_ms or now)
                if escalated is not None:  # the same request, due at once, with more room
                    assert (next_hop.origin, next_hop.run, next_hop.max_tokens) == (ORIGIN, started.run, escalated)
                    assert (tier, next_hop.due_ms, repair) == (POLICY.tiers[0], now, False)
                else:
                    assert (next_hop.origin, next_hop.run, next_hop.max_tokens) == (ORIGIN, started.run,
                                                                                    hop.max_tokens)
                    hint = failure.retry_after_ms or 0
                    assert next_hop.due_ms is not None and now + hint <= next_hop.due_ms <= now + tier.delay_ms
                    assert repair is (failure.layer is FailureLayer.SEMANTIC)
            case Defer(tier, request, hdrs):
                parked, end = read_hop(hdrs), ENDS[end_kind]
                assert tier == POLICY.tiers[0] and request == REQUEST and isinstance(end, Parked)
                assert parked == replace(hop, deferred=True, run=started.run, due_ms=parked.due_ms)
                assert parked.due_ms is not None
                assert now + min(end.delay_ms, tier.delay_ms) <= parked.due_ms <= now + tier.delay_ms
            case EndAttempt(owner, state):
                assert owner == started
                assert state.status is {"retry": RequestStatus.RETRYING, "deferral": RequestStatus.RETRYING,
                                        "terminal": RequestStatus.FAILED}[outcome]
                assert (state.updated_ms, state.attempts, state.run) == (now, attempt, started.run)
                charged = outcome == "retry" and escalated is None  # an escalation spends no retry of the batch
                assert state.retries_spent == started.retries_spent + charged
            case WriteState(state):
                assert outcome == "result" and state.status is RequestStatus.SUCCEEDED
                assert (state.updated_ms, state.prompt_tokens, state.completion_tokens) == (now, 9, 3)
            case EmitResult(result):
                assert result == RESULT
            case Hold(problem):
                assert problem == ENDS[end_kind]
    if outcome == "terminal":
        [event] = [action.event for action in actions if isinstance(action, EmitFailure)]
        if closed is not None and not replay:
            assert (event.layer, event.error_code) == (FailureLayer.BUSINESS, closed)
        elif end_kind == "model problem":
            assert (event.layer, event.error_code) == (FailureLayer.BUSINESS, "model_not_found")
        elif budget_spent and expected_outcome(end_kind, attempt, replay, closed, False) == "retry":
            assert event.error_code == EXHAUSTED_REASON


@pytest.mark.parametrize("end_kind", list(ENDS))
def test_every_attempt_replay_deferral_and_closed_batch_ends_as_the_rules_say(end_kind: str) -> None:
    for attempt, replay, deferred, closed in itertools.product(range(1, 8), (False, True), (False, True), CLOSED):
        check(end_kind, attempt, replay, deferred, closed)


_completions = st.none() | st.builds(CompletionBudget, own=st.none() | st.sampled_from([1, 16, 64, 100, 1_000]),
                                     sent=st.none() | st.sampled_from([1, 16, 64, 128, 512, 800, 10**9]),
                                     room=st.none() | st.integers(-10, 2_000))


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(list(ENDS)), st.integers(1, 12), st.booleans(), st.booleans(), st.sampled_from(CLOSED),
       st.booleans(), st.integers(0, 2**32), _completions)
def test_any_combination_with_a_spent_budget_any_jitter_and_any_completion_budget(
        end_kind: str, attempt: int, replay: bool, deferred: bool, closed: str | None, budget_spent: bool, seed: int,
        completion: CompletionBudget | None) -> None:
    check(end_kind, attempt, replay, deferred, closed, budget_spent, seed, completion)


@pytest.mark.parametrize("budget_spent", [False, True])
def test_a_cut_answer_is_escalated_after_its_first_three_attempts_whatever_the_budget(budget_spent: bool) -> None:
    for attempt, replay, deferred, closed in itertools.product(range(1, 8), (False, True), (False, True), CLOSED):
        check("cut", attempt, replay, deferred, closed, budget_spent, completion=CompletionBudget(64, 64))
        check("cut", attempt, replay, deferred, closed, budget_spent, completion=CompletionBudget(None, None))
    assert outcome_of(decide("cut", 3, False, False, None, spent, completion=CompletionBudget(64, 256)).called
                      or []) == "retry"  # past the semantic layer's attempts, with the budget spent


# -- admission over any table state --------------------------------------------------------------------------------
_states = st.builds(
    RequestState, request_id=st.just(REQUEST.request_id), status=st.sampled_from(list(RequestStatus)),
    input_hash=st.sampled_from([input_hash(REQUEST), "another-body"]), attempts=st.integers(0, 6),
    last_error_code=st.sampled_from([None, CIRCUIT_OPEN, "server_error"]),
    source_topic=st.sampled_from([None, SOURCE.topic]), source_offset=st.sampled_from([None, SOURCE.offset, 7]),
    run=st.integers(0, 3))


@settings(max_examples=400, deadline=None)
@given(st.none() | _states, st.integers(1, 6), st.booleans(), st.booleans(), st.integers(0, 3),
       st.sampled_from(CLOSED), st.none() | st.just(FIRST_FAILURE))
def test_a_record_is_skipped_failed_as_a_conflict_or_started_whatever_the_table_says(
        current: RequestState | None, attempt: int, replay: bool, deferred: bool, run: int, closed: str | None,
        first_failure: int | None) -> None:
    hop = Hop(attempt, first_failure_ms=first_failure, origin=ORIGIN, replay=replay, deferred=deferred, run=run)
    actions = on_record(Attempt(REQUEST, hop, SOURCE, NOW), current, closed)
    match actions:
        case [Skip()]:
            pass
        case [WriteState(state), Skip(reason)]:  # an ended request's own state, sent to the changelog again
            assert state == current and reason.value in ("already_succeeded", "already_failed")
        case [EmitFailure(event, _)]:  # a conflict: no state of its own, in no run
            assert (event.error_code, event.terminal, event.run, event.first_failure_ms) == (
                "conflicting_duplicate", True, 0, NOW)
        case [WriteState(state), Call(attempt_started)]:
            assert state.status is RequestStatus.IN_FLIGHT and attempt_started.state == state
            assert closed is None or replay
        case [WriteState(state), EmitFailure(event, _), EndAttempt(owner, ended)]:
            assert closed is not None and not replay and event.error_code == closed and owner == state
            assert ended.status is RequestStatus.FAILED
        case _:
            pytest.fail(f"not a documented decision: {actions}")


# -- the rest of the table -----------------------------------------------------------------------------------------
def test_a_request_too_large_to_carry_is_not_retried_and_its_failure_event_goes_without_its_body() -> None:
    big = replace(REQUEST, body_json=json.dumps({"model": "m", "prompt": "x" * (CARRIED_BYTES + 1)}))
    started = Attempt(big, Hop(origin=ORIGIN), SOURCE, NOW)
    [_, call] = on_record(started, None, None)
    assert isinstance(call, Call)
    actions = after_call(call.attempt, Failure(FailureLayer.SERVICE, "server_error", "503", 503), Retries(POLICY))
    assert outcome_of(actions) == "terminal"
    [emission] = [action for action in actions if isinstance(action, EmitFailure)]
    assert emission.event.error_code == REQUEST_TOO_LARGE and emission.event.request.body_json == ""
    assert str(ORIGIN) in emission.event.request.metadata["body_omitted"]


def test_a_record_rejected_before_admission_writes_failed_only_for_an_unknown_id() -> None:
    unread = Attempt(REQUEST, Hop(origin=ORIGIN), SOURCE, NOW)
    emission, write = terminal_failure(unread, Failure(FailureLayer.BUSINESS, "undecodable_record", "bad bytes"))
    assert isinstance(emission, EmitFailure) and isinstance(write, WriteIfAbsent)
    assert (emission.event.attempt, emission.event.run, emission.event.first_failure_ms) == (1, 0, NOW)
    assert (write.state.status, write.state.last_error_code) == (RequestStatus.FAILED, "undecodable_record")


def test_a_waiting_state_names_the_record_that_continues_it() -> None:
    [_, call] = on_record(Attempt(REQUEST, Hop(origin=ORIGIN), SOURCE, NOW), None, None)
    assert isinstance(call, Call)
    actions = after_call(call.attempt, Failure(FailureLayer.SERVICE, "server_error", "503", 503), Retries(POLICY))
    end = actions[-1]
    assert isinstance(end, EndAttempt) and end.state.next_topic is None
    written = end.naming(RecordRef("llm.retry.5s", 77))
    assert (written.next_topic, written.next_offset) == ("llm.retry.5s", 77)
    assert end.naming(None) == end.state  # a terminal end, or a sink that does not say where


def test_an_internal_error_is_reported_in_the_record_s_run() -> None:
    hop = Hop(2, first_failure_ms=FIRST_FAILURE, origin=ORIGIN, run=4)
    emission = failure_emission(Attempt(REQUEST, hop, SOURCE, NOW), Failure(FailureLayer.BUSINESS, "internal_error",
                                "KeyError"), terminal=True, run=hop.run)
    assert (emission.event.run, emission.event.attempt, emission.event.first_failure_ms) == (4, 2, FIRST_FAILURE)
    assert read_hop(emission.headers).run == 4


def test_an_unadmitted_attempt_has_no_outcome_to_decide() -> None:
    with pytest.raises(ValueError, match="not admitted"):
        after_call(Attempt(REQUEST, Hop(origin=ORIGIN), SOURCE, NOW), ENDS["success"], Retries(POLICY))


def test_a_first_submission_s_origin_is_where_it_was_read() -> None:
    assert read_hop({}, here=ORIGIN).origin == ORIGIN
    assert read_hop({}).origin is None
    carried = Hop(origin=Origin("llm.requests", 0, 5)).headers("r", Failure(FailureLayer.SERVICE, "x", "y"))
    assert read_hop(carried, here=ORIGIN).origin == Origin("llm.requests", 0, 5)  # provenance is carried


def test_the_tier_a_retry_goes_to_is_the_policy_s() -> None:
    actions = decide(FailureLayer.TRANSPORT.value, 1, False, False, None).called
    assert actions is not None
    [retry] = [action for action in actions if isinstance(action, ScheduleRetry)]
    assert isinstance(retry.tier, Tier) and retry.tier in POLICY.tiers


def test_a_request_waiting_at_its_spend_cap_ends_budget_exceeded_when_its_batch_is_cancelled() -> None:
    parked_before = prior_state(2, False, True)
    assert parked_before is not None
    waiting = replace(parked_before, last_error_code=BUDGET_EXHAUSTED)
    record = Attempt(REQUEST, record_hop(2, False, True), SOURCE, NOW)
    for closed, code in (("batch_cancelled", BUDGET_EXCEEDED), ("batch_expired", "batch_expired")):
        actions = on_record(record, waiting, closed)
        [event] = [action.event for action in actions if isinstance(action, EmitFailure)]
        assert (event.layer, event.error_code, event.terminal) == (FailureLayer.BUSINESS, code, True)
    parked = after_call(Attempt(REQUEST, record_hop(1, False, False), SOURCE, NOW, prior_state(2, False, True)),
                        Parked(5_000, Failure(FailureLayer.BUSINESS, BUDGET_EXHAUSTED, "at the cap")),
                        Retries(POLICY, random.Random(1)))
    assert [type(action) for action in parked] == [Defer, EndAttempt]  # waits: no attempt spent, no failure event
    assert parked[-1].state.last_error_code == BUDGET_EXHAUSTED  # type: ignore[union-attr]


@pytest.mark.parametrize(("attempt", "replay", "deferred"),
                         list(itertools.product((1, 2, 4), (False, True), (False, True))))
def test_a_request_of_a_forgotten_batch_is_refused_without_a_state(attempt: int, replay: bool, deferred: bool) -> None:
    """Replays and retries too: any state written would bring a piece of the forgotten batch back (design §8)."""
    for prior in (None, prior_state(attempt, replay, deferred)):
        record = Attempt(REQUEST, record_hop(attempt, replay, deferred), SOURCE, NOW)
        actions = on_record(record, prior, BATCH_FORGOTTEN)
        assert [type(action) for action in actions] == [EmitFailure], actions
        [refused] = actions
        assert isinstance(refused, EmitFailure)
        event = refused.event
        assert (event.layer, event.error_code, event.terminal) == (FailureLayer.BUSINESS, BATCH_FORGOTTEN, True)
        assert "'batch-1' was forgotten" in event.message and REQUEST.request_id in event.message
