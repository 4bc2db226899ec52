"""What happens to one record: admit it against the state table, call the LLM, emit exactly one outcome.

The handler never raises. Every record ends as a result, a retry record, a failure event or a dead letter (a
request record whose key names no id is first written again under its id, design §3),
and every send is awaited before the handler returns, so the dispatcher may ack the record afterwards.
The only exception is a configuration problem of the account (bad key, no quota, a wrong endpoint): that
record is held unacked and the worker is told to stop, so the batch is not burnt into failure records. A
problem of one model (unknown to the endpoint, not allowed) fails that request as a business failure, and
the guards pause the model after its first few calls failed alike (design §5), so other models go on.

What to do with a record and its outcome is decided by the pure core (core.decision); the handler reads the record,
the state table and the LLM, and carries the decided actions out in one place (design §5.2).
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

from streamproc import codec
from streamproc.app.observe import LlmCall, Observer, guarded, outcome_label
from streamproc.app.spend import HeldByCap, SpendGate
from streamproc.core import headers
from streamproc.core.decision import (
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
    ended_before,
    failure_emission,
    on_record,
    reused,
    terminal_failure,
)
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RequestState
from streamproc.core.outcome import ConfigurationProblem, Failure, Success
from streamproc.core.provider_batch_deadline import Way, past_deadline, routed, way_of
from streamproc.core.record_size import CARRIED_BYTES, response_too_large, result_record_bytes
from streamproc.core.request_line import LineLimits
from streamproc.core.request_state import RecordRef, Skip, input_hash, on_terminal_failure, redelivers, superseded
from streamproc.core.reservation import parked_at, reservation
from streamproc.core.retry_policy import CompletionBudget, Tier
from streamproc.core.spend_cap import Charge
from streamproc.core.tenancy import InvalidTenancy, Tenancy, with_headers
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.core.written_outcome import WrittenOutcome
from streamproc.kafka.schema_registry import NO_REGISTRY, SchemaReader
from streamproc.llm.client import Caller, CallResult, UnsupportedUrl, answer_content, request_body
from streamproc.llm.completion import billed_tokens
from streamproc.llm.guarded import Guards
from streamproc.llm.provider_answer import kept_body, provider_request_id
from streamproc.llm.repair import build_repair_request, completion_budget, with_max_tokens
from streamproc.llm.routed import Deferred

log = logging.getLogger(__name__)


class Disposition(Enum):
    """What the dispatcher does with the record once the handler returns."""

    ACK = "ack"  # its outcome is safely on Kafka
    HOLD = "hold"  # never ack: the worker stops and the record is read again after the fix


@dataclass(frozen=True)
class Record:
    """A consumed Kafka record, independent of the client library."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Mapping[str, bytes]


@dataclass(frozen=True)
class _Unreadable:
    """A record that holds no request: the id it still names (None: none can be known), the failure code and why,
    and the batch it names."""

    request_id: str | None
    code: str
    reason: str
    batch_id: str | None = None


INVALID_JSON_REQUEST = "invalid_json_request"  # a JSON record that is no valid request (submit's reasons)
INVALID_TENANCY = "invalid_tenancy"  # an Avro request whose tenant or priority (value or x- headers) is invalid


class Sink(Protocol):
    """Where outcomes go; each method returns once the broker has the record."""

    async def result(self, result: InferenceResult) -> None: ...
    async def failure(self, event: FailureEvent, headers: headers.Headers) -> None: ...
    async def retry(self, tier: Tier, request: InferenceRequest, headers: headers.Headers) -> RecordRef | None:
        """Returns where the record was written (the state remembers it for the reconciler), if known."""
    async def dead_letter(self, record: Record, headers: headers.Headers) -> None: ...
    async def rekey(self, record: Record, request_id: str, headers: headers.Headers) -> None:
        """Write the record again, unchanged, to its own topic under the key ``request_id`` (design §3)."""


class Reuse(Protocol):
    """Earlier answers to the same input, for batches that opted in (``--reuse-results``, app.result_index)."""

    async def answer(self, request: InferenceRequest, record_headers: Mapping[str, bytes], digest: str,
                     now_ms: int) -> InferenceResult | None: ...


class BatchRoute(Protocol):
    """The provider-batch route (``app.provider_batch_route``): answers a routed model's requests by batches."""

    def routes(self, model: object) -> bool: ...
    async def held(self, request_id: str, attempt: int, partition: int) -> bool: ...
    async def call(self, request: InferenceRequest, body: dict[str, Any], attempt: int, partition: int,
                   ) -> CallResult | WrittenOutcome | Deferred:
        """The line of this attempt of the request (a taken-over batch's line answers only the attempt it was
        gathered for), the outcome the batch's killed owner wrote for it already, or a deferral when a rebalance
        began while it waited."""
    def written(self, request_id: str) -> None:
        """The outcome of a request it answered is written (or its record given up)."""


class StateWriteFailed(Exception):
    """A state write that did not reach the changelog. The record is held, not failed: its outcome may already be
    on Kafka, and a failure event beside it would end the request twice (a result and a terminal failure)."""


class StateStore(Protocol):
    """The request_state table, seen through the partition of the record being handled; ``put`` raises
    :class:`StateWriteFailed` when the write could not be sent on."""

    def get(self, request_id: str) -> RequestState | None: ...
    async def put(self, state: RequestState) -> None: ...


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _never(batch_id: str | None) -> str | None:
    return None


def _no_deadline(batch_id: str | None) -> int | None:
    return None


@dataclass(frozen=True)
class HandlerOptions:
    """What a handler may be given besides its seams, each with a default: the clock, the metrics, why a batch no
    longer has its requests called (``closed``: batch id -> ``batch_cancelled``, ``batch_expired``,
    ``batch_forgotten``, or None), the earlier answers for the batches that reuse them, the spend caps (none: no call
    is capped), what a JSON request on the request topic may hold (the limits ``submit`` checks a line with), and how
    the sink encodes a result (whose size decides whether it can be carried)."""

    clock_ms: Callable[[], int] = _now_ms
    observer: Observer | None = None
    closed: Callable[[str | None], str | None] = _never
    reuse: Reuse | None = None
    spend: SpendGate | None = None
    json_limits: LineLimits = field(default_factory=LineLimits)
    encode_result: Callable[[InferenceResult], bytes] = codec.encode  # how the sink writes a result: its size
    schemas: SchemaReader = NO_REGISTRY  # the registry's, for Confluent-framed requests
    route: BatchRoute | None = None  # the provider-batch route of the models it names (design §8)
    deadline: Callable[[str | None], int | None] = _no_deadline  # batch id -> when ``submit --deadline`` passes


class Handler:
    """The per-record logic shared by the requests dispatcher and every retry tier: it reads the record, the state
    table and the LLM, asks the core what to do (core.decision), and carries the actions out in one place."""

    def __init__(self, caller: Caller | Guards, sink: Sink, store: StateStore, retries: Retries,
                 on_configuration_problem: Callable[[ConfigurationProblem], None],
                 options: HandlerOptions | None = None) -> None:
        options = options or HandlerOptions()
        self._guards = caller if isinstance(caller, Guards) else Guards(caller)  # a bare caller: no guards
        self._sink = sink
        self._store = store
        self._retries = retries
        self._on_configuration_problem = on_configuration_problem
        self._clock_ms = options.clock_ms
        self._observer = guarded(options.observer)  # metrics; never raises into the handler
        self._closed = options.closed
        self._reuse = options.reuse
        self._spend = options.spend
        self._json_limits = options.json_limits
        self._schemas = options.schemas
        self._encode_result = options.encode_result
        self._route = options.route
        self._deadline = options.deadline

    async def handle(self, record: Record) -> Disposition:
        """Handle one record; never raises (an unexpected error becomes a terminal failure event)."""
        try:
            return await self._handle(record)
        except StateWriteFailed:
            log.exception("holding %s[%d]@%d: its state could not be written", record.topic, record.partition,
                          record.offset)
            return Disposition.HOLD
        except Exception as exc:
            log.exception("unexpected error handling %s[%d]@%d", record.topic, record.partition, record.offset)
            return await self._internal_error(record, exc)

    def redelivered(self, record: Record) -> bool:
        """Whether ``record`` started its request's attempt still in flight: a worker that died admitted it, and
        only this record continues the attempt (a parked copy of it would be skipped as a duplicate)."""
        request_id = _text(record.key)
        return request_id is not None and redelivers(self._store.get(request_id), RecordRef(record.topic,
                                                                                            record.offset))

    async def reserve(self, record: Record) -> str | None:
        """Hold the id of a record about to wait or be parked before admission (core.reservation): its ``pending``
        state, unless the id has a state already. Returns the request's input hash, which names the parked copy
        (:meth:`name_parked`); None when the record holds no request of its key (its handling ends it as it must).
        Raises :class:`StateWriteFailed` only: anything else is logged, and the record goes on unreserved."""
        try:
            request = await self._read(record)
            if not isinstance(request, InferenceRequest) or _text(record.key) != request.request_id:
                return None
            reserved = reservation(self._store.get(request.request_id), request, self._clock_ms(),
                                   self._closed(request.batch_id))
            if reserved is not None:
                await self._store.put(reserved)
            return input_hash(request)
        except StateWriteFailed:
            raise
        except Exception:
            log.exception("could not reserve the id of %s[%d]@%d; it waits without a reservation", record.topic,
                          record.partition, record.offset)
            return None

    async def name_parked(self, request_id: str, digest: str, parked: RecordRef) -> None:
        """Name the backlog copy of a reserved request in its reservation, for the reconciler (core.reservation.
        parked_at); never raises: the copy is on the backlog already, and the name is only the reconciler's clue."""
        try:
            named = parked_at(self._store.get(request_id), digest, parked)
            if named is not None:
                await self._store.put(named)
        except Exception:
            log.exception("request %s: parked at %s@%d, but its reservation does not name the copy", request_id,
                          parked.topic, parked.offset)

    async def _handle(self, record: Record) -> Disposition:
        hop = headers.read_hop(record.headers, here=_place(record))
        source = RecordRef(record.topic, record.offset)
        request = await self._decode(record, hop, source)
        if request is None:
            return Disposition.ACK
        attempt = Attempt(request, hop, source, self._clock_ms())
        decision = on_record(attempt, self._store.get(request.request_id), self._closed(request.batch_id))
        return await self._carry_out(record, attempt, decision)

    async def _carry_out(self, record: Record, attempt: Attempt, actions: Iterable[Action],
                         made: CallResult | None = None) -> Disposition:
        """Carry out a decision's actions in their order: the one place where the handler sends and writes.
        ``made``: what came back from the call the decision followed, if one was made."""
        sent: RecordRef | None = None  # where this decision's retry or deferred record went
        for action in actions:
            match action:
                case WriteState(state):
                    await self._store.put(state)
                case EndAttempt(started):
                    await self._put_unless_superseded(started, action.naming(sent))
                case WriteIfAbsent(state):
                    if self._store.get(state.request_id) is None:
                        await self._store.put(state)
                case EmitResult(result):
                    await self._sink.result(result)
                    self._observer.on_result()
                    self._observer.on_ended(result.tenant, result.priority, "succeeded")
                case EmitFailure():
                    await self._emit_failure(action, made)
                case ScheduleRetry():
                    sent = await self._schedule_retry(action, made)
                case Defer(tier, request, hdrs):
                    sent = await self._sink.retry(tier, request, hdrs)
                    self._observer.on_deferred(tier.name)
                case Hold(problem):
                    self._on_configuration_problem(problem)
                    return Disposition.HOLD
                case Skip(reason):
                    log.debug("skip %s: %s (%s[%d]@%d, attempt %d)", attempt.request.request_id, reason,
                              record.topic, record.partition, record.offset, attempt.hop.attempt)
                    self._observer.on_skip(reason.value)
                case Call(admitted):
                    return await self._call(record, admitted)
        return Disposition.ACK

    async def _call(self, record: Record, attempt: Attempt) -> Disposition:
        """An earlier answer, a body the pre-check refuses, or the call; each then decided and carried out."""
        request = attempt.request
        if self._reuse is not None and (earlier := await self._reuse.answer(
                request, record.headers, attempt.started.input_hash, attempt.now_ms)) is not None:
            return await self._carry_out(record, attempt, reused(attempt.at(self._clock_ms()), earlier))
        body = self._precheck(attempt)
        if isinstance(body, Failure):  # malformed, or over the model's context window: no call
            return await self._carry_out(record, attempt, terminal_failure(attempt, body))
        way = await self._way(request, body, attempt.hop, record.partition)
        charge = (None if self._spend is None
                  else self._spend.begin(request, body, record.headers, attempt.now_ms, way))
        if isinstance(charge, HeldByCap):  # at its batch's or the day's spend cap: it waits, parked like a breaker's
            held = Parked(charge.delay_ms, charge.reason)
            return await self._carry_out(record, attempt, after_call(attempt, held, self._retries))
        if self._route is None or way is Way.CALL:
            return await self._called(record, attempt, body, charge, Way.CALL)
        try:  # by the provider-batch route: its batch ends once the outcome of each member is written
            return await self._called(record, attempt, body, charge, way)
        finally:
            self._route.written(request.request_id)

    async def _way(self, request: InferenceRequest, body: dict[str, Any], hop: headers.Hop, partition: int) -> Way:
        """A call, or the provider-batch route (as the record asks, else as its model is routed): a routed request
        is called once its batch's deadline passed, unless a provider batch already holds it
        (core.provider_batch_deadline)."""
        if self._route is None or not routed(hop.route, self._route.routes(body.get("model"))):
            return Way.CALL
        past = past_deadline(self._deadline(request.batch_id), self._clock_ms())
        return way_of(True, past, past and await self._route.held(request.request_id, hop.attempt, partition))

    async def _called(self, record: Record, attempt: Attempt, body: dict[str, Any], charge: Charge | None,
                      way: Way) -> Disposition:
        """The call (or the provider batch's line), decided and carried out."""
        request = attempt.request
        called = await self._charged_call(request, body, attempt.hop.attempt, charge, way, record.partition)
        attempt = attempt.at(self._clock_ms())
        if isinstance(called, WrittenOutcome):  # its outcome is on Kafka already: only its state is written
            log.info("request %s: attempt %d ended already in a provider batch taken over; its state follows",
                     request.request_id, called.attempt)
            return await self._carry_out(record, attempt, ended_before(attempt, called))
        budget = self._guards.budget_stop(request.batch_id)
        if isinstance(called, Deferred):
            parked = Parked(round(called.delay_s * 1000), Failure(FailureLayer.SERVICE, called.code, called.reason))
            return await self._carry_out(record, attempt, after_call(attempt, parked, self._retries, budget))
        self._observer.on_llm_call(LlmCall(called.model, outcome_label(called.outcome), called.latency_ms / 1000,
                                           *billed_tokens(called.outcome, called.response_body), called.deployment,
                                           way))
        end = self._call_end(attempt, called, way)
        completion = self._completion(request, body) if isinstance(end, Failure) else None  # only a failure escalates
        return await self._carry_out(record, attempt, after_call(attempt, end, self._retries, budget, completion),
                                     called)

    async def _charged_call(self, request: InferenceRequest, body: dict[str, Any], attempt: int,
                            charge: Charge | None, way: Way, partition: int,
                            ) -> CallResult | Deferred | WrittenOutcome:
        """The guarded call (or the provider batch's line, outside the guards, which pace calls), its spend settled
        against its caps from what the provider counted."""
        call: Awaitable[CallResult | Deferred | WrittenOutcome]
        if way is Way.CALL or self._route is None:
            call = self._guards.call(request, body, attempt)
        else:
            self._guards.on_batched(request, attempt)
            call = self._route.call(request, body, attempt, partition)
        if charge is None or self._spend is None:
            return await call
        try:
            called = await call
        except BaseException:
            self._spend.abandon(charge)
            raise
        if isinstance(called, Deferred | WrittenOutcome):  # no call, or one charged by the worker that made it
            self._spend.release(charge)
        else:
            model = called.model or str(body.get("model", ""))  # the model routed to, which prices the call
            self._spend.settle(charge, model, *billed_tokens(called.outcome, called.response_body), way)
        return called

    def _precheck(self, attempt: Attempt) -> dict[str, Any] | Failure:
        """The body to send, or why it is never sent. After admission, so that its failure also ends the state (a
        repair hop can fail here)."""
        request = attempt.request
        try:
            return self._guards.precheck(with_max_tokens(request_body(request), attempt.hop.max_tokens))
        except UnsupportedUrl as exc:  # a url outside the endpoint table (core.endpoints): never sent
            return exc.failure
        except ValueError as exc:
            return Failure(FailureLayer.BUSINESS, "malformed_body", f"request {request.request_id!r}: {exc}")

    def _completion(self, request: InferenceRequest, sent: dict[str, Any]) -> CompletionBudget:
        """The completion budget of the call: the request's own, the one ``sent``, and the room its model's context
        window leaves beside the prompt, so that an escalation never asks for more than the pre-check lets through."""
        model = sent.get("model")
        room = (self._guards.routes.completion_room(model, self._guards.estimator.prompt_tokens(sent))
                if isinstance(model, str) else None)
        return CompletionBudget(completion_budget(request_body(request)), completion_budget(sent), room)

    def _call_end(self, attempt: Attempt, called: CallResult, way: Way) -> CallEnd:
        """The call's outcome, a success with the result event it makes (and whether that event can be sent)."""
        outcome = called.outcome
        if not isinstance(outcome, Success):
            return outcome
        request = attempt.request
        result = InferenceResult(
            request_id=request.request_id, batch_id=request.batch_id, model=outcome.model,
            response_json=called.response_body.decode("utf-8", "replace"), content=outcome.content,
            attempts=attempt.hop.attempt, latency_ms=called.latency_ms, completed_ms=attempt.now_ms,
            input_hash=attempt.started.input_hash, provider_request_id=provider_request_id(called.headers),
            deployment=called.deployment or None, tenant=request.tenant, priority=request.priority,
        )
        too_large = response_too_large(request.request_id, len(called.response_body),
                                       result_record_bytes(result, self._encode_result), outcome)
        if too_large is not None:  # the producer would refuse the result: keep what a failure event can
            log.warning("request %s: %s", request.request_id, too_large.message)
        return Answered(outcome, result, too_large, way)

    async def _schedule_retry(self, retry: ScheduleRetry, made: CallResult | None) -> RecordRef | None:
        """Send the retry record, with the repair turns from the call's answer when it is a repair request."""
        request = retry.request
        if made is not None and retry.repair:
            request = build_repair_request(request, answer_content(made.response_body), retry.failure.message)
        sent = await self._sink.retry(retry.tier, request, retry.hop.headers(request.request_id, retry.failure))
        self._observer.on_retry(retry.tier.name)
        return sent

    async def _emit_failure(self, emission: EmitFailure, made: CallResult | None = None) -> None:
        """Send a failure event, with the deployment the call was made to, and what the provider answered when the
        call got an HTTP answer (not an exception)."""
        event = emission.event
        if made is not None:
            event = replace(event, deployment=made.deployment or None)
        if made is not None and event.http_status is not None:
            event = replace(event, response_body=kept_body(made.response_body),
                            provider_request_id=provider_request_id(made.headers))
        await self._sink.failure(event, emission.headers)
        self._observer.on_failure(event.layer.value, event.error_code, event.terminal)
        if event.terminal:
            self._observer.on_ended(event.request.tenant, event.request.priority, "failed")

    async def _put_unless_superseded(self, started: RequestState, after: RequestState) -> None:
        """Write the state after a failure or deferral, unless a newer attempt (or an end) has taken the request
        over since this one was admitted (see :func:`streamproc.core.request_state.superseded`)."""
        current = self._store.get(started.request_id)
        if superseded(current, started):
            log.info("request %s: attempt %d ended (%s) after the table moved on (%s, attempt %s); its state is "
                     "left as it is", started.request_id, started.attempts, after.last_error_code,
                     current.status if current else None, current.attempts if current else None)
            return
        await self._store.put(after)

    async def _decode(self, record: Record, hop: headers.Hop, source: RecordRef) -> InferenceRequest | None:
        """The record's request, or None once a poison record has been turned into its failure."""
        key = _text(record.key)
        first = headers.Hop(origin=hop.origin)  # a record that is no request of its own: its first attempt
        request = await self._read(record)
        if key is None and isinstance(request, InferenceRequest) and request.request_id:
            await self._rekey(record, request.request_id, hop)  # an unreadable one ends at once, where it is
            return None
        if isinstance(request, _Unreadable):
            request_id = key or request.request_id
            reason = f"record {record.topic}[{record.partition}]@{record.offset}: {request.reason}"
            if request_id is None:
                failure = Failure(FailureLayer.BUSINESS, "unreadable_record", f"{reason}; no request id")
                if record.value is not None and len(record.value) > CARRIED_BYTES:  # it stays at its origin
                    reason += f"; its {len(record.value)} bytes are not copied (too large), read them at the origin"
                    record = replace(record, value=None)
                dead = headers.Hop(first_failure_ms=self._clock_ms(), origin=hop.origin).headers("", failure)
                await self._sink.dead_letter(record, dead | {headers.ERROR_MESSAGE: reason.encode()[:1000]})
                self._observer.on_failure(failure.layer.value, failure.code, True)
                return None
            placeholder = InferenceRequest(request_id=request_id, body_json="", batch_id=request.batch_id,
                                           metadata=_raw_value(record.value))
            failure = Failure(FailureLayer.BUSINESS, request.code, reason)
            unreadable = Attempt(placeholder, first, source, self._clock_ms())
            await self._carry_out(record, unreadable, terminal_failure(unreadable, failure))
            return None
        if key is not None and key != request.request_id:
            failure = Failure(FailureLayer.BUSINESS, "key_mismatch",
                              f"record key {key!r} differs from the request id {request.request_id!r}: "
                              "topics are keyed by request id so that its state stays on one partition")
            mismatched = Attempt(replace(request, request_id=key), first, source, self._clock_ms())
            await self._carry_out(record, mismatched, terminal_failure(mismatched, failure))
            return None
        return request

    async def _rekey(self, record: Record, request_id: str, hop: headers.Hop) -> None:
        """A record whose key names no id sits on the partition its producer chose, not on its id's: handled
        there, its state would be written on that partition while its retries go to the id's, and dedupe between
        the two would be lost (design §3). So it is written again, keyed by its id, with its origin, and the
        keyed copy is the one handled. A crash before this record is acked writes a second copy, which the
        state on the id's partition skips as a duplicate, as it skips a producer's retried send."""
        assert hop.origin is not None  # read_hop was given the record's own place
        await self._sink.rekey(record, request_id, dict(record.headers) | hop.origin.headers())
        log.debug("%s[%d]@%d had no key: written again under its id %s", record.topic, record.partition,
                  record.offset, request_id)

    async def _read(self, record: Record) -> InferenceRequest | _Unreadable:
        """The request a record's value holds, an Avro frame or a JSON request (design §3), or why it holds none.
        The schema a Confluent frame names is fetched first, off the event loop."""
        if codec.is_json(record.value):
            assert record.value is not None
            read = codec.read_json_request(record.value, record.headers, self._json_limits, self._clock_ms())
            if isinstance(read, codec.InvalidJsonRequest):
                return _Unreadable(read.request_id, INVALID_JSON_REQUEST, read.reason, read.batch_id)
            return read
        await self._schemas.fetch_ahead(record.value)
        try:
            request = codec.decode(record.value, InferenceRequest, schema_lookup=self._schemas.lookup)
        except codec.CodecError as exc:
            return _Unreadable(codec.peek_request_id(record.value, schema_lookup=self._schemas.lookup),
                               "undecodable_record", str(exc))
        try:  # a producer of its own may name them in headers; a hostile one may write any string in the value
            tenancy = with_headers(Tenancy(request.tenant, request.priority), record.headers)
        except InvalidTenancy as invalid:
            return _Unreadable(request.request_id, INVALID_TENANCY, str(invalid), request.batch_id)
        if (tenancy.tenant, tenancy.priority) == (request.tenant, request.priority):
            return request
        return replace(request, tenant=tenancy.tenant, priority=tenancy.priority)

    async def _internal_error(self, record: Record, exc: Exception) -> Disposition:
        """Last resort for a bug: a terminal business failure that backfill can replay once it is fixed."""
        request_id = _text(record.key) or ""
        request = await self._read(record)
        if isinstance(request, _Unreadable):
            request = InferenceRequest(request_id=request_id, body_json="", metadata=_raw_value(record.value))
        failure = Failure(FailureLayer.BUSINESS, "internal_error", f"{type(exc).__name__}: {exc}"[:1000])
        hop = headers.read_hop(record.headers, here=_place(record))  # provenance is carried, never rewritten (§3)
        attempt = Attempt(request, hop, RecordRef(record.topic, record.offset), self._clock_ms())
        try:  # in the record's run: which state admitted it is unknown
            await self._emit_failure(failure_emission(attempt, failure, terminal=True, run=hop.run))
        except Exception:
            log.exception("could not record the internal error of %s; holding the record", request_id)
            return Disposition.HOLD
        failed_for_good = await self._fail_own_attempt(request.request_id, record, failure)
        return Disposition.ACK if failed_for_good else Disposition.HOLD

    async def _fail_own_attempt(self, request_id: str, record: Record, failure: Failure) -> bool:
        """Mark ``failed`` an attempt this record left ``in_flight``, so a replay (backfill) may start it again;
        False when that write could not be sent on (the record is then held and read again).

        Left ``in_flight``, every later record for the id, replays included, would be skipped as a duplicate.
        Any other state (another record's attempt, a success) is not this record's to change.
        """
        try:
            state = self._store.get(request_id)
            if (state is not None and state.status is RequestStatus.IN_FLIGHT
                    and (state.source_topic, state.source_offset) == (record.topic, record.offset)):
                await self._store.put(on_terminal_failure(state, failure.layer, failure.code, self._clock_ms()))
        except StateWriteFailed:
            log.exception("could not write %s failed after its internal error; holding the record", request_id)
            return False
        except Exception:
            log.exception("could not mark %s failed after its internal error", request_id)
        return True


def _place(record: Record) -> headers.Origin:
    """Where the record itself was read: the origin of a first submission."""
    return headers.Origin(record.topic, record.partition, record.offset)


def _text(data: bytes | None) -> str | None:
    if not data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _raw_value(value: bytes | None) -> dict[str, str]:
    """Keep an undecodable value with its failure (base64), so nothing is lost."""
    return {"raw_value_base64": base64.b64encode(value or b"").decode()}
