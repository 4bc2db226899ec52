"""What the handler does with a record and with its call's outcome, decided before anything is done (design §5.2).

The handler reads the record, the state table and the LLM's answer; this module turns those facts into a list of
actions in the order they must happen, and the handler carries them out in one place. The order is what makes an
outcome safe: every send comes before the state write that records it (result first, then state: design §4), and
the failure event of an attempt comes before the retry record that follows it. Each record ends in exactly one
outcome: a result, a retry record with its failure event, a terminal failure event, a deferral, a skip, or a hold.

Two questions are asked of each record: :func:`on_record` before any call (skip it, fail a conflict, or start
it), and :func:`after_call` with what the call came to. Between the two the handler may find an earlier answer
(:func:`reused`) or a body the pre-check refuses (:func:`terminal_failure`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RequestState
from streamproc.core.guards.pauses import MODEL_SCOPED_PROBLEMS
from streamproc.core.headers import Headers, Hop
from streamproc.core.outcome import ConfigurationProblem, Failure, Success
from streamproc.core.provider_batch_deadline import Way
from streamproc.core.record_size import (
    CARRIED_BYTES,
    REQUEST_TOO_LARGE,
    request_bytes,
    too_large_to_carry,
    without_body,
)
from streamproc.core.request_state import (
    BUDGET_EXHAUSTED,
    Conflict,
    RecordRef,
    Skip,
    SkipReason,
    admit,
    input_hash,
    on_deferred,
    on_retry_scheduled,
    on_success,
    on_terminal_failure,
)
from streamproc.core.retention import BATCH_FORGOTTEN
from streamproc.core.retry_policy import CompletionBudget, RetryPolicy, Stop, Terminal, Tier
from streamproc.core.reuse import on_reused
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.core.written_outcome import WrittenOutcome


@dataclass(frozen=True)
class Attempt:
    """One record's attempt at a request: what every decision about it reads."""

    request: InferenceRequest
    hop: Hop  # as the record's headers say; its origin is the record itself on a first submission
    source: RecordRef  # where the record was read
    now_ms: int  # the clock reading the decision is made at
    state: RequestState | None = None  # the state the attempt was admitted with; None before (or without) admission

    def at(self, now_ms: int) -> Attempt:
        """The same attempt, decided at a later clock reading (after its call)."""
        return replace(self, now_ms=now_ms)

    @property
    def started(self) -> RequestState:
        """The admitted state; only an admitted attempt is called."""
        if self.state is None:
            raise ValueError(f"request {self.request.request_id!r} was not admitted: it has no call to decide on")
        return self.state

    @property
    def first_failure_ms(self) -> int:
        """When the request first failed: carried from an earlier attempt, else now."""
        return self.hop.first_failure_ms or self.now_ms

    @property
    def run(self) -> int:
        """The run of the admitted state (0 when none): attempt numbers restart with each replay, so the sink keys
        a failure by run and attempt (design §4 "Runs")."""
        return 0 if self.state is None else self.state.run


# -- the actions, carried out in order by the handler ------------------------------------------------------------
@dataclass(frozen=True)
class WriteState:
    """Put ``state`` in the table."""

    state: RequestState


@dataclass(frozen=True)
class EndAttempt:
    """Put ``state``, how the attempt admitted as ``started`` ended, unless a newer attempt or an end has taken the
    request over since (:func:`streamproc.core.request_state.superseded`)."""

    started: RequestState
    state: RequestState

    def naming(self, sent: RecordRef | None) -> RequestState:
        """The state to write: a request left waiting names the record that continues it (``sent``: where the
        broker put this decision's retry or deferred record), for the reconciler."""
        return self.state if sent is None else replace(self.state, next_topic=sent.topic, next_offset=sent.offset)


@dataclass(frozen=True)
class WriteIfAbsent:
    """Put ``state`` only when the table has none for its id: the end of a record rejected before admission must
    not overwrite the state of a request that has one."""

    state: RequestState


@dataclass(frozen=True)
class EmitResult:
    """Send the result event."""

    result: InferenceResult


@dataclass(frozen=True)
class EmitFailure:
    """Send the failure event of an attempt; the handler adds what the provider answered when an HTTP answer came."""

    event: FailureEvent
    headers: Headers


@dataclass(frozen=True)
class ScheduleRetry:
    """Send ``request`` to ``tier`` for its next attempt (``hop``, with its completion budget) after ``failure``, as
    a repair request when ``repair``: the handler then adds the repair turns from the call's answer (llm.repair)."""

    tier: Tier
    request: InferenceRequest
    hop: Hop
    failure: Failure
    repair: bool


@dataclass(frozen=True)
class Defer:
    """Park ``request`` unanswered in ``tier``; its ``headers`` carry the attempt, not made yet, and its due time."""

    tier: Tier
    request: InferenceRequest
    headers: Headers


@dataclass(frozen=True)
class Hold:
    """Never ack the record: the account's configuration is refused and the worker stops (design §5.3)."""

    problem: ConfigurationProblem


@dataclass(frozen=True)
class Call:
    """Go on with the admitted ``attempt``: an earlier answer when its batch reuses them, the pre-check, the call."""

    attempt: Attempt


Action = WriteState | EndAttempt | WriteIfAbsent | EmitResult | EmitFailure | ScheduleRetry | Defer | Hold | Skip | Call
"""A :class:`~streamproc.core.request_state.Skip` is an action too: the record is counted as skipped, nothing else."""


# -- what a call came to ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Answered:
    """A success and its result event; ``too_large``: the failure that ends the request instead when the event is
    too large to send (:func:`streamproc.core.record_size.response_too_large`)."""

    answer: Success
    result: InferenceResult
    too_large: Failure | None = None
    way: Way = Way.CALL  # how the answer was asked for: it prices the usage the state keeps


@dataclass(frozen=True)
class Parked:
    """No call was made: the guards ask to try again in ``delay_ms`` (``reason``: the breaker is open, or the
    model is paused)."""

    delay_ms: int
    reason: Failure


CallEnd = Answered | Parked | Failure | ConfigurationProblem


@dataclass(frozen=True)
class Retries:
    """The retry policy and the random source of its jitter (and of a parked record's)."""

    policy: RetryPolicy = field(default_factory=RetryPolicy)
    rng: random.Random = field(default_factory=random.Random)


# -- the decisions ------------------------------------------------------------------------------------------------
_ENDED = frozenset({SkipReason.ALREADY_SUCCEEDED, SkipReason.ALREADY_FAILED})
_PARK_JITTER_MS = 1000  # spreads the records parked by one open breaker


def on_record(attempt: Attempt, current: RequestState | None, closed: str | None) -> list[Action]:
    """What a record does before any call, given the table's ``current`` state for its id and why its batch is
    ``closed`` (``batch_cancelled``, ``batch_expired``, ``batch_forgotten``; None while it is open).

    A skip; a conflict's terminal failure, the table left as it is; or a start: the ``in_flight`` state first,
    then the call, or a terminal failure at once when the batch is closed (a replay is a new decision: it is
    called). A request of a forgotten batch, replays included, is refused before admission: its terminal failure
    and no state, so the batch's states stay forgotten.
    """
    hop = attempt.hop
    if closed == BATCH_FORGOTTEN:
        request = attempt.request
        refused = Failure(FailureLayer.BUSINESS, BATCH_FORGOTTEN, f"batch {request.batch_id!r} was forgotten "
                          f"(streamproc forget): request {request.request_id!r} is refused, not started again")
        return [failure_emission(attempt, refused, terminal=True, first_failure_ms=attempt.now_ms)]
    admission = admit(current, attempt.request, hop.attempt, attempt.now_ms, source=attempt.source,
                      replay=hop.replay, deferred=hop.deferred, run=hop.run)
    if isinstance(admission, Skip):
        if current is not None and admission.reason in _ENDED:
            # An ended request read again is most often a redelivery after a crash, and a crash between the local
            # table write and its changelog send leaves the changelog (what status reads and a new owner restores)
            # one write behind: stuck in_flight although the result exists. Writing the same state again sends it
            # to the changelog once more.
            return [WriteState(current), admission]
        return [admission]
    if isinstance(admission, Conflict):  # not admitted: the failure is its own first, in no run
        return [failure_emission(attempt, admission.failure, terminal=True, first_failure_ms=attempt.now_ms)]
    started = replace(attempt, state=admission.state)
    if closed is not None and not hop.replay:
        ended = _closed_batch(attempt.request, closed, current)
        return [WriteState(admission.state), *terminal_failure(started, ended)]
    return [WriteState(admission.state), Call(started)]


def reused(attempt: Attempt, result: InferenceResult) -> list[Action]:
    """An earlier answer to the same input: its result event (no call made), then the state (design §4)."""
    return [EmitResult(result), WriteState(on_reused(attempt.started, result, attempt.now_ms))]


def ended_before(attempt: Attempt, written: WrittenOutcome) -> list[Action]:
    """The admitted ``attempt`` ended already: its outcome was written by the worker killed before its state write
    reached the changelog (a provider batch taken over, design §8). Only the state is written, from that outcome
    (as a line's answer, priced by the provider batch), so the request does not end twice."""
    ended = written.ended
    state, now = attempt.started, attempt.now_ms
    if isinstance(ended, Success):
        return [WriteState(on_success(state, now, ended, Way.PROVIDER_BATCH))]
    return [EndAttempt(state, on_terminal_failure(state, ended.layer, ended.code, now))]


def after_call(attempt: Attempt, end: CallEnd, retries: Retries, budget: Stop | None = None,
               completion: CompletionBudget | None = None) -> list[Action]:
    """What the admitted ``attempt`` does with what its call came to, decided at ``attempt.now_ms``; ``budget``:
    the batch's retry budget, asked last since asking spends a retry; ``completion``: the call's completion
    budget, which a cut answer's escalation raises (core.retry_policy)."""
    state = attempt.started
    if isinstance(end, Answered):
        if end.too_large is not None:  # the answer was paid for: its usage counts although it cannot be sent
            return terminal_failure(attempt, end.too_large, paid=end.answer, way=end.way)
        return [EmitResult(end.result), WriteState(on_success(state, attempt.now_ms, end.answer, end.way))]
    if isinstance(end, Parked):
        return _parked(attempt, end, retries)
    if isinstance(end, ConfigurationProblem) and end.code in MODEL_SCOPED_PROBLEMS:
        # one model's problem (unknown to the endpoint, not allowed): that request fails, and the model is paused
        # once its first calls all failed alike, while the other models go on
        end = Failure(FailureLayer.BUSINESS, end.code, end.message, end.http_status)
    if isinstance(end, ConfigurationProblem):  # the account's (key, quota, endpoint): stop everything
        return [Hold(end)]
    return _after_failure(attempt, end, retries, budget, completion)


def terminal_failure(attempt: Attempt, failure: Failure, paid: Success | None = None,
                     way: Way = Way.CALL) -> list[Action]:
    """The attempt ends the request: its terminal failure event, then the state ``failed`` (only a replay starts
    it again; ``paid``: the answer it ended with although it was paid for). A record rejected before admission has
    no state of its own: ``failed`` is written only for an id the table does not know."""
    emission = failure_emission(attempt, failure, terminal=True)
    if attempt.state is None:
        request, now = attempt.request, attempt.now_ms
        return [emission, WriteIfAbsent(RequestState(
            request.request_id, RequestStatus.FAILED, input_hash(request), attempts=attempt.hop.attempt,
            batch_id=request.batch_id, last_layer=failure.layer, last_error_code=failure.code, created_ms=now,
            updated_ms=now, tenant=request.tenant, priority=request.priority))]
    ended = on_terminal_failure(attempt.state, failure.layer, failure.code, attempt.now_ms, paid, way)
    return [emission, EndAttempt(attempt.state, ended)]


def failure_emission(attempt: Attempt, failure: Failure, *, terminal: bool, first_failure_ms: int | None = None,
                     run: int | None = None) -> EmitFailure:
    """The failure event of the attempt and its headers; ``first_failure_ms`` and ``run`` default to the
    attempt's. A request too large to carry goes without its body, which stays at its origin."""
    first = attempt.first_failure_ms if first_failure_ms is None else first_failure_ms
    hop = attempt.hop.failed(first, attempt.run if run is None else run)
    request = attempt.request
    if too_large_to_carry(request):  # the event would be refused
        request = without_body(request, str(hop.origin))
    event = FailureEvent(
        request=request, layer=failure.layer, error_code=failure.code, message=failure.message, attempt=hop.attempt,
        terminal=terminal, first_failure_ms=first, last_failure_ms=attempt.now_ms,
        http_status=failure.http_status, retry_after_ms=failure.retry_after_ms, run=hop.run,
    )
    return EmitFailure(event, hop.headers(request.request_id, failure))


def _after_failure(attempt: Attempt, failure: Failure, retries: Retries, budget: Stop | None,
                   completion: CompletionBudget | None) -> list[Action]:
    """The attempt's failure event, a retry record, then the state ``retrying``; or the end of the request. The
    failure event goes first: a crash between the two sends then leaves the event and no retry record, so the
    redelivered record (its state still ``in_flight``) runs the attempt again and writes the event a second time,
    keyed alike (run and attempt); the other order left a retry record whose attempt's failure event was never
    written, a gap in the request's history that no redelivery fills (seen after a SIGKILL in
    test_provider_batch_resubmission)."""
    request, state = attempt.request, attempt.started
    decision = retries.policy.decide(failure, attempt.hop.attempt, retries.rng, budget, completion)
    if isinstance(decision, Terminal):  # a spent retry budget restates the failure as retry_budget_exhausted
        return terminal_failure(attempt, decision.failure or failure)
    if too_large_to_carry(request):  # its retry record would be refused
        return terminal_failure(attempt, Failure(
            failure.layer, REQUEST_TOO_LARGE, f"{failure.code}, not retried: the request's {request_bytes(request)} "
            f"bytes are more than a retry record carries ({CARRIED_BYTES}): {failure.message}"[:1000],
            failure.http_status))
    hop = attempt.hop.retried(attempt.now_ms + decision.due_in_ms, attempt.first_failure_ms, attempt.run,
                              decision.max_tokens)
    waiting = on_retry_scheduled(state, failure.layer, failure.code, attempt.now_ms, spent_budget=decision.charged)
    return [failure_emission(attempt, failure, terminal=False),
            ScheduleRetry(decision.tier, request, hop, failure, decision.repair), EndAttempt(state, waiting)]


def _parked(attempt: Attempt, parked: Parked, retries: Retries) -> list[Action]:
    """Park the record, its attempt not made, in the shortest tier (never longer: a closed breaker must find its
    backlog soon), due when the guards may call (design §5), with a jitter that spreads the parked records."""
    tier = retries.policy.tiers[0]
    wanted = parked.delay_ms + retries.rng.randrange(_PARK_JITTER_MS)
    hop = attempt.hop.parked(attempt.now_ms + min(wanted, tier.delay_ms), attempt.run)
    state = attempt.started
    return [Defer(tier, attempt.request, hop.headers(attempt.request.request_id, parked.reason)),
            EndAttempt(state, on_deferred(state, attempt.now_ms, parked.reason.code))]


BUDGET_EXCEEDED = "budget_exceeded"  # a request that waited at its spend cap when its batch was cancelled


def _closed_batch(request: InferenceRequest, closed: str, waited: RequestState | None) -> Failure:
    if closed == "batch_cancelled" and waited is not None and waited.last_error_code == BUDGET_EXHAUSTED:
        return Failure(FailureLayer.BUSINESS, BUDGET_EXCEEDED, f"batch {request.batch_id!r} was cancelled while "
                       f"request {request.request_id!r} waited at its spend cap")
    why = "was cancelled" if closed == "batch_cancelled" else "passed its completion window"
    return Failure(FailureLayer.BUSINESS, closed, f"batch {request.batch_id!r} {why} before request "
                   f"{request.request_id!r} was called")
