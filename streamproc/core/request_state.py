"""The per-request state machine, as a fold over the request's events (design §4).

``admit`` decides whether a record read from ``requests``, a retry tier or a replay may call the LLM;
``on_success``, ``on_retry_scheduled`` and ``on_terminal_failure`` give the state after the outcome. All
are pure: the worker reads and writes the table, these only compute.

The crash case: the worker writes ``in_flight`` before the call and acks the record only after the
outcome is sent, so after a SIGKILL the record is delivered again while the table still says
``in_flight``. Skipping it would lose the request. The state therefore remembers the record that started
the attempt (``source_topic``, ``source_offset``; the partition is the same for every co-partitioned
topic): the same record again is a redelivery and is admitted; any other record for an id in flight is a
duplicate and is skipped.

``attempts`` is the attempt number (``x-attempt``) of the latest attempt started. A retry record is
admitted only if it is newer than that, so a stale copy of a retry record (left by a crash between its
send and the state write) cannot start a second concurrent call.

A *deferred* record (parked in a retry tier by an open circuit breaker, design §5) carries an attempt that
was never made: the state says ``retrying`` with ``last_error_code`` ``circuit_open`` and that same attempt
number, and only a deferred record of exactly that attempt is admitted. A resubmission, or a stale copy
of the deferred record once the attempt has been made, is skipped.

A retry record newer than an ``in_flight`` attempt is admitted too: it is written only after that
attempt's call ended, so the ``in_flight`` state is stale. This happens after a SIGKILL, when the table
comes back older than the offsets already committed (faust's table recovery can replay a changelog that
lacks the last writes); skipping the retry record then would lose the request.

A *run* is one life of the request: the first submission starts run 1, and each replay (backfill) that
starts a failed request again starts the next. Every record the handler writes carries its run
(``x-run``), and a record of an earlier run is skipped. Attempt numbers restart at 1 with a replay, so
without the run a retry record left from before the replay (a crash's stale copy, or one read again after
a rebalance) would count as newer than the replay's attempt and start a second call beside it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from enum import StrEnum

from streamproc.core.events import InferenceRequest, RequestState
from streamproc.core.outcome import Failure, Success
from streamproc.core.provider_batch_deadline import Way
from streamproc.core.vocabulary import FailureLayer, RequestStatus

CIRCUIT_OPEN = "circuit_open"
MODEL_PAUSED = "model_paused"  # parked: the model's first calls all failed alike (core.guards.pauses)
TENANT_PAUSED = "tenant_paused"  # parked: its tenant's calls of the model failed alike (core.guards.tenant_pauses)
BUDGET_EXHAUSTED = "budget_exhausted"  # parked: its batch or the day reached its spend cap (core.spend_cap)
REBALANCING = "rebalancing"  # parked: a rebalance began while its call waited its turn (design §5.7)
# parked records: their attempt is still to be made
DEFERRAL_CODES = frozenset({CIRCUIT_OPEN, MODEL_PAUSED, TENANT_PAUSED, BUDGET_EXHAUSTED, REBALANCING})


@dataclass(frozen=True)
class RecordRef:
    """Where a record was read; a redelivery after a crash has the same ref, a resubmission does not."""

    topic: str
    offset: int


class SkipReason(StrEnum):
    """Why a record does not call the LLM; the record is acked with no other effect."""

    ALREADY_SUCCEEDED = "already_succeeded"
    IN_FLIGHT = "in_flight"
    RETRYING = "retrying"
    ALREADY_FAILED = "already_failed"
    EARLIER_RUN = "earlier_run"  # written before a replay started the request again
    ALREADY_REPLAYED = "already_replayed"  # a backfill replay record read again after its run ended
    RESERVED = "reserved"  # a replay of another body: the id is reserved by a record waiting to be handled


@dataclass(frozen=True)
class Start:
    """Call the LLM; write ``state`` (``in_flight``) to the table first."""

    state: RequestState


@dataclass(frozen=True)
class Skip:
    """Do not call the LLM."""

    reason: SkipReason


@dataclass(frozen=True)
class Conflict:
    """Same id, different body: write ``failure`` (business, terminal); the table entry stays as it is."""

    failure: Failure


Admission = Start | Skip | Conflict


_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"))  # built once, not per record


def input_hash(request: InferenceRequest) -> str:
    """A stable fingerprint of what is asked: url plus canonical body JSON (key order and spacing ignored).

    A body that is not JSON (or nests deeper than the parser follows) is hashed as sent, so the hash is defined
    for every record.
    """
    try:
        canonical = _CANONICAL_JSON.encode(json.loads(request.body_json))
    except (ValueError, RecursionError):
        canonical = request.body_json
    return hashlib.sha256(f"{request.url}\n{canonical}".encode()).hexdigest()[:32]


def admit(
    current: RequestState | None,
    request: InferenceRequest,
    attempt: int,
    now_ms: int,
    *,
    source: RecordRef,
    replay: bool = False,
    deferred: bool = False,
    run: int = 0,
) -> Admission:
    """Decide what a record may do given the table's state for its id.

    ``attempt`` is the record's ``x-attempt`` (1 for a submission); ``source`` is where it was read; ``run`` its
    ``x-run`` (0 when it has none: a submission, a backfill replay, or a record written before runs existed).
    In order: no state → start; a record of an earlier run → skip; in flight and ``source`` is the record that
    started it → start again (crash redelivery); the deferred record of a parked attempt → start; a replay
    (backfill) starts a ``failed`` request, even with a fixed, different body, and a ``pending`` one (a
    reservation) with its own body, and is skipped otherwise, never a conflict (a replay's own deferred copy starts
    only a run the table has lost); another body → conflict; then by status: ``pending`` starts, ``succeeded`` /
    ``failed`` / ``in_flight`` skip, ``retrying`` starts only a retry record newer than the latest attempt started.
    """
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    digest = input_hash(request)
    if current is None:
        return Start(_in_flight(None, request, digest, attempt, now_ms, source, run))
    if 0 < run < current.run:
        return Skip(SkipReason.EARLIER_RUN)
    status = current.status
    if redelivers(current, source):
        return Start(_in_flight(current, request, digest, attempt, now_ms, source, run))  # crash redelivery
    if (deferred and status is RequestStatus.RETRYING and current.last_error_code in DEFERRAL_CODES
            and attempt == current.attempts and digest == current.input_hash):
        return Start(_in_flight(current, request, digest, attempt, now_ms, source, run))  # its parked attempt, at last
    if replay:
        match status:
            case RequestStatus.PENDING if digest != current.input_hash:
                return Skip(SkipReason.RESERVED)  # its owner waits parked (core.reservation): never taken from it
            case RequestStatus.FAILED | RequestStatus.PENDING if run == 0 and _replayed(current, source):
                return Skip(SkipReason.ALREADY_REPLAYED)  # read again (a rebalance before its commit)
            case RequestStatus.FAILED | RequestStatus.PENDING if run == 0:  # a backfill replay: the next run
                return Start(replace(_in_flight(current, request, digest, attempt, now_ms, source, run),
                                     replay_topic=source.topic, replay_offset=source.offset))
            case RequestStatus.FAILED | RequestStatus.PENDING if run > current.run:
                # a replay's deferred copy whose run the table has lost (a write lost in recovery); a copy of
                # the table's own run that meets its end is stale
                return Start(_in_flight(current, request, digest, attempt, now_ms, source, run))
            case RequestStatus.FAILED | RequestStatus.PENDING:
                return Skip(SkipReason.ALREADY_FAILED)
            case RequestStatus.SUCCEEDED:
                return Skip(SkipReason.ALREADY_SUCCEEDED)
            case RequestStatus.IN_FLIGHT:
                return Skip(SkipReason.IN_FLIGHT)
            case RequestStatus.RETRYING:
                return Skip(SkipReason.RETRYING)
    if digest != current.input_hash:
        return Conflict(
            Failure(
                FailureLayer.BUSINESS,
                "conflicting_duplicate",
                f"request id {request.request_id!r} was already submitted with a different body "
                f"(input hash {current.input_hash}, now {digest}; its status is {status})",
            )
        )
    match status:
        case RequestStatus.PENDING:
            return Start(_in_flight(current, request, digest, attempt, now_ms, source, run))
        case RequestStatus.SUCCEEDED:
            return Skip(SkipReason.ALREADY_SUCCEEDED)
        case RequestStatus.FAILED:
            return Skip(SkipReason.ALREADY_FAILED)
        case RequestStatus.IN_FLIGHT:
            if attempt > current.attempts:  # see the module docstring: a successor proves the attempt ended
                return Start(_in_flight(current, request, digest, attempt, now_ms, source, run))
            return Skip(SkipReason.IN_FLIGHT)
        case RequestStatus.RETRYING:
            if attempt > current.attempts:
                return Start(_in_flight(current, request, digest, attempt, now_ms, source, run))
            return Skip(SkipReason.RETRYING)


def _replayed(current: RequestState, source: RecordRef) -> bool:
    """Whether ``source`` is the replay record that started the current run, or an older one on its topic
    (replays of one id share a partition, so offsets order them)."""
    return (current.replay_topic == source.topic and current.replay_offset is not None
            and source.offset <= current.replay_offset)


def redelivers(current: RequestState | None, source: RecordRef) -> bool:
    """Whether ``source`` is the record that started ``current``'s attempt, still ``in_flight``: read again after
    a crash, it continues an attempt admitted already, and only that record does (any copy of it is skipped)."""
    return (current is not None and current.status is RequestStatus.IN_FLIGHT
            and (current.source_topic, current.source_offset) == (source.topic, source.offset))


def _in_flight(
    current: RequestState | None,
    request: InferenceRequest,
    digest: str,
    attempt: int,
    now_ms: int,
    source: RecordRef,
    run: int,
) -> RequestState:
    """The state of a started attempt; starting a ``failed`` (or ``pending``) request begins its next run."""
    if current is None:
        return RequestState(
            request_id=request.request_id,
            status=RequestStatus.IN_FLIGHT,
            input_hash=digest,
            attempts=attempt,
            batch_id=request.batch_id,
            created_ms=now_ms,
            updated_ms=now_ms,
            source_topic=source.topic,
            source_offset=source.offset,
            run=max(run, 1),
            tenant=request.tenant,
            priority=request.priority,
        )
    restarted = current.status in (RequestStatus.FAILED, RequestStatus.PENDING)
    return replace(
        current,
        status=RequestStatus.IN_FLIGHT,
        input_hash=digest,
        attempts=attempt,
        batch_id=request.batch_id if request.batch_id is not None else current.batch_id,
        updated_ms=now_ms,
        source_topic=source.topic,
        source_offset=source.offset,
        next_topic=None,
        next_offset=None,
        run=max(current.run + 1 if restarted else current.run, run),
        tenant=request.tenant,  # the request's: a state written before tenants existed learns it
        priority=request.priority,
    )


def superseded(current: RequestState | None, started: RequestState) -> bool:
    """Whether the attempt admitted as ``started`` no longer owns the request: the table now shows another
    attempt, or an end. Then only a success may still write its state (a result is a result); a failure,
    deferral or terminal failure of a superseded attempt must not overwrite the newer state. This happens after
    a crash, when the redelivered record reruns attempt n beside its own retry record's attempt n+1 (``admit``
    starts both: a crash redelivery, and a retry record newer than the ``in_flight`` attempt): without the
    check, the rerun's late failure would turn a success back into ``retrying`` and the request would be
    called again."""
    if current is None:
        return False
    return not (current.status is RequestStatus.IN_FLIGHT and current.attempts == started.attempts
                and current.run == started.run
                and (current.source_topic, current.source_offset) == (started.source_topic, started.source_offset))


def first_attempt_made(state: RequestState) -> bool:
    """Whether the request's first attempt is behind it (what the worker counts for the retry budget when it sends
    the call; an ended one counts even if it ended uncalled, since no call of it is to come). Not yet for a first
    attempt still ``in_flight`` (its call may be waiting for a breaker, the gate or
    its tokens) or parked unmade (a deferral): the worker counts those when they are sent, so a table sweep that
    counted them too would count them twice (design §5.5)."""
    if state.attempts >= 2:
        return True
    if state.attempts < 1 or state.status in (RequestStatus.IN_FLIGHT, RequestStatus.PENDING):
        return False
    return not (state.status is RequestStatus.RETRYING and state.last_error_code in DEFERRAL_CODES)


def on_success(state: RequestState, now_ms: int, answer: Success | None = None,
               way: Way = Way.CALL) -> RequestState:
    """The result was sent (result first, then state: design §4); ``answer``'s model and usage are kept for the
    batch's token counts, with the ``way`` it was asked for, which prices them."""
    done = replace(state, status=RequestStatus.SUCCEEDED, updated_ms=now_ms, source_topic=None, source_offset=None)
    return done if answer is None else _with_usage(done, answer, way)


def _with_usage(state: RequestState, answer: Success, way: Way) -> RequestState:
    return replace(state, model=answer.model, prompt_tokens=max(0, answer.prompt_tokens),
                   completion_tokens=max(0, answer.completion_tokens), provider_batch=way is Way.PROVIDER_BATCH)


def on_retry_scheduled(state: RequestState, layer: FailureLayer, code: str, now_ms: int,
                       next_record: RecordRef | None = None, spent_budget: bool = False) -> RequestState:
    """The failure and the retry record (written at ``next_record``) were sent; the request waits in a tier.
    ``spent_budget``: the retry took one from the batch's retry budget (counted, so a restart remembers it)."""
    waiting = _after_failure(state, RequestStatus.RETRYING, layer, code, now_ms, next_record)
    return replace(waiting, retries_spent=state.retries_spent + 1) if spent_budget else waiting


def on_deferred(state: RequestState, now_ms: int, code: str = CIRCUIT_OPEN,
                next_record: RecordRef | None = None) -> RequestState:
    """The record was parked unanswered at ``next_record`` (its model's breaker is open, or the model is
    paused: ``code``); its attempt is still to be made."""
    return _after_failure(state, RequestStatus.RETRYING, FailureLayer.SERVICE, code, now_ms, next_record)


def on_terminal_failure(state: RequestState, layer: FailureLayer, code: str, now_ms: int,
                        paid: Success | None = None, way: Way = Way.CALL) -> RequestState:
    """The terminal failure was sent; only a replay starts the request again. ``paid``: the answer it ended with
    although it was paid for (``response_too_large``): its model and usage count in the batch's tokens."""
    failed = _after_failure(state, RequestStatus.FAILED, layer, code, now_ms, None)
    return failed if paid is None else _with_usage(failed, paid, way)


def _after_failure(state: RequestState, status: RequestStatus, layer: FailureLayer, code: str, now_ms: int,
                   next_record: RecordRef | None) -> RequestState:
    return replace(
        state,
        status=status,
        last_layer=layer,
        last_error_code=code,
        updated_ms=now_ms,
        source_topic=None,
        source_offset=None,
        next_topic=None if next_record is None else next_record.topic,
        next_offset=None if next_record is None else next_record.offset,
    )
