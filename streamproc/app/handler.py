"""What happens to one record: admit it against the state table, call the LLM, emit exactly one outcome.

The handler never raises. Every record ends as a result, a retry record, a failure event or a dead letter,
and every send is awaited before the handler returns, so the dispatcher may ack the record afterwards.
The only exception is a configuration problem of the account (bad key, no quota, a wrong endpoint): that
record is held unacked and the worker is told to stop, so the batch is not burnt into failure records. A
problem of one model (unknown to the endpoint, not allowed) fails that request as a business failure, and
the guards pause the model after its first few calls failed alike (design §5), so other models go on.
"""

from __future__ import annotations

import base64
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol

from streamproc import codec
from streamproc.app.observe import LlmCall, Observer, guarded, outcome_label
from streamproc.core import headers
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RequestState
from streamproc.core.guards.pauses import MODEL_SCOPED_PROBLEMS
from streamproc.core.outcome import ConfigurationProblem, Failure, Success
from streamproc.core.record_size import (
    CARRIED_BYTES,
    REQUEST_TOO_LARGE,
    request_bytes,
    response_too_large,
    result_record_bytes,
    too_large_to_carry,
    without_body,
)
from streamproc.core.request_state import (
    Conflict,
    RecordRef,
    Skip,
    SkipReason,
    Start,
    admit,
    input_hash,
    on_deferred,
    on_retry_scheduled,
    on_success,
    on_terminal_failure,
    superseded,
)
from streamproc.core.retry_policy import Retry, RetryPolicy, Tier, spends_budget
from streamproc.core.reuse import on_reused
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.llm.client import Caller, CallResult, UnsupportedUrl, answer_content, request_body
from streamproc.llm.completion import billed_tokens
from streamproc.llm.guarded import Guards
from streamproc.llm.provider_answer import kept_body, provider_request_id
from streamproc.llm.repair import TRUNCATED, build_repair_request, grown_max_tokens, with_max_tokens
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


class Sink(Protocol):
    """Where outcomes go; each method returns once the broker has the record."""

    async def result(self, result: InferenceResult) -> None: ...
    async def failure(self, event: FailureEvent, headers: headers.Headers) -> None: ...
    async def retry(self, tier: Tier, request: InferenceRequest, headers: headers.Headers) -> RecordRef | None:
        """Returns where the record was written (the state remembers it for the reconciler), if known."""
    async def dead_letter(self, record: Record, headers: headers.Headers) -> None: ...


class Reuse(Protocol):
    """Earlier answers to the same input, for batches that opted in (``--reuse-results``, app.result_index)."""

    async def answer(self, request: InferenceRequest, record_headers: Mapping[str, bytes], digest: str,
                     now_ms: int) -> InferenceResult | None: ...


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


class Handler:
    """The per-record logic shared by the requests dispatcher and every retry tier."""

    def __init__(self, caller: Caller | Guards, sink: Sink, store: StateStore, policy: RetryPolicy,
                 on_configuration_problem: Callable[[ConfigurationProblem], None],
                 clock_ms: Callable[[], int] = _now_ms, rng: random.Random | None = None,
                 observer: Observer | None = None, closed: Callable[[str | None], str | None] | None = None,
                 reuse: Reuse | None = None) -> None:
        self._guards = caller if isinstance(caller, Guards) else Guards(caller)  # a bare caller: no guards
        self._sink = sink
        self._store = store
        self._policy = policy
        self._on_configuration_problem = on_configuration_problem
        self._clock_ms = clock_ms
        self._rng = rng or random.Random()
        self._observer = guarded(observer)  # metrics; never raises into the handler
        self._closed = closed or _never  # batch id -> why its requests are not called any more, or None
        self._reuse = reuse

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

    async def _handle(self, record: Record) -> Disposition:
        hop = headers.read_hop(record.headers)
        origin = hop.origin or headers.Origin(record.topic, record.partition, record.offset)
        request = await self._decode(record, origin)
        if request is None:
            return Disposition.ACK
        now = self._clock_ms()
        current = self._store.get(request.request_id)
        admission = admit(current, request, hop.attempt, now,
                          source=RecordRef(record.topic, record.offset), replay=hop.replay, deferred=hop.deferred,
                          run=hop.run)
        if isinstance(admission, Skip):
            log.debug("skip %s: %s (%s[%d]@%d, attempt %d)", request.request_id, admission.reason, record.topic,
                      record.partition, record.offset, hop.attempt)
            if current is not None and admission.reason in _ENDED:
                # An ended request read again is most often a redelivery after a crash, and a crash between the
                # local table write and its changelog send leaves the changelog (what status reads and a new
                # owner restores) one write behind: stuck in_flight although the result exists (the chaos run
                # found it). Writing the same state again sends it to the changelog once more.
                await self._store.put(current)
            self._observer.on_skip(admission.reason.value)
            return Disposition.ACK
        if isinstance(admission, Conflict):
            await self._emit_failure(request, admission.failure, hop.attempt, True, now, origin, run=0)  # not admitted
            return Disposition.ACK
        assert isinstance(admission, Start)
        state = admission.state
        await self._store.put(state)

        if (closed := self._closed(request.batch_id)) is not None and not hop.replay:  # a replay is a new decision
            why = "was cancelled" if closed == "batch_cancelled" else "passed its completion window"
            await self._terminal(request, Failure(
                FailureLayer.BUSINESS, closed, f"batch {request.batch_id!r} {why} before request "
                f"{request.request_id!r} was called"), hop.attempt, hop.first_failure_ms or now, origin, state)
            return Disposition.ACK
        if self._reuse is not None and (reused := await self._reuse.answer(
                request, record.headers, state.input_hash, now)) is not None:
            await self._sink.result(reused)  # a normal result event that names its origin; no call is made
            self._observer.on_result()
            await self._store.put(on_reused(state, reused, self._clock_ms()))  # result first, then state (design §4)
            return Disposition.ACK

        try:  # after admission, so that the terminal failure below also ends the state (a repair hop can fail here)
            body = self._guards.precheck(with_max_tokens(request_body(request), hop.max_tokens))
        except UnsupportedUrl as exc:  # a url outside the endpoint table (core.endpoints): never sent
            body = exc.failure
        except ValueError as exc:
            body = Failure(FailureLayer.BUSINESS, "malformed_body", f"request {request.request_id!r}: {exc}")
        if isinstance(body, Failure):  # malformed, or over the model's context window: no call
            await self._terminal(request, body, hop.attempt, hop.first_failure_ms or now, origin, state)
            return Disposition.ACK

        called = await self._guards.call(request, body, hop.attempt)
        if isinstance(called, Deferred):
            await self._defer(request, called, hop, origin, state)
            return Disposition.ACK
        outcome = called.outcome
        self._observer.on_llm_call(LlmCall(called.model, outcome_label(outcome), called.latency_ms / 1000,
                                           *billed_tokens(outcome, called.response_body)))
        if isinstance(outcome, ConfigurationProblem) and outcome.code in MODEL_SCOPED_PROBLEMS:
            # one model's problem (unknown to the endpoint, not allowed): that request fails, and the model is
            # paused once its first calls all failed alike, while the other models go on
            outcome = Failure(FailureLayer.BUSINESS, outcome.code, outcome.message, outcome.http_status)
        if isinstance(outcome, ConfigurationProblem):  # the account's (key, quota, endpoint): stop everything
            self._on_configuration_problem(outcome)
            return Disposition.HOLD
        if isinstance(outcome, Success):
            result = InferenceResult(
                request_id=request.request_id, batch_id=request.batch_id, model=outcome.model,
                response_json=called.response_body.decode("utf-8", "replace"), content=outcome.content,
                attempts=hop.attempt, latency_ms=called.latency_ms, completed_ms=self._clock_ms(),
                input_hash=state.input_hash, provider_request_id=provider_request_id(called.headers),
            )
            too_large = response_too_large(request.request_id, len(called.response_body),
                                           result_record_bytes(result, codec.encode), outcome)
            if too_large is not None:  # the producer would refuse the result: keep what a failure event can
                log.warning("request %s: %s", request.request_id, too_large.message)
                await self._terminal(request, too_large, hop.attempt, hop.first_failure_ms or now, origin, state,
                                     called, paid=outcome)
                return Disposition.ACK
            await self._sink.result(result)
            self._observer.on_result()
            await self._store.put(on_success(state, self._clock_ms(), outcome))  # result first, then state (design §4)
            return Disposition.ACK
        await self._after_failure(request, outcome, called, body, hop, origin, state)
        return Disposition.ACK

    async def _after_failure(self, request: InferenceRequest, failure: Failure, called: CallResult,
                             sent: dict[str, Any], hop: headers.Hop, origin: headers.Origin,
                             state: RequestState) -> None:
        now = self._clock_ms()
        first_failure = hop.first_failure_ms or now
        decision = self._policy.decide(failure, hop.attempt, self._rng, self._guards.budget_stop(request.batch_id))
        if isinstance(decision, Retry) and too_large_to_carry(request):  # its retry record would be refused
            failure = Failure(failure.layer, REQUEST_TOO_LARGE, f"{failure.code}, not retried: the request's "
                              f"{request_bytes(request)} bytes are more than a retry record carries "
                              f"({CARRIED_BYTES}): {failure.message}"[:1000], failure.http_status)
            await self._terminal(request, failure, hop.attempt, first_failure, origin, state, called)
            return
        if isinstance(decision, Retry):
            next_request = (build_repair_request(request, answer_content(called.response_body), failure.message)
                            if decision.repair else request)
            due = now + decision.due_in_ms
            max_tokens = hop.max_tokens
            if failure.code == TRUNCATED:  # the same budget would be cut again: the next attempt gets more room
                max_tokens = grown_max_tokens(request_body(request), sent) or max_tokens
            written = await self._sink.retry(decision.tier, next_request, headers.hop_headers(
                request.request_id, hop.attempt + 1, origin, failure, first_failure, due_ms=due,
                max_tokens=max_tokens, run=state.run))
            self._observer.on_retry(decision.tier.name)
            await self._emit_failure(request, failure, hop.attempt, False, first_failure, origin, called, run=state.run)
            await self._put_unless_superseded(
                state, on_retry_scheduled(state, failure.layer, failure.code, now, written,
                                          spent_budget=spends_budget(failure)))
            return
        failure = decision.failure or failure  # a spent retry budget restates it as retry_budget_exhausted
        await self._terminal(request, failure, hop.attempt, first_failure, origin, state, called)

    async def _defer(self, request: InferenceRequest, deferred: Deferred, hop: headers.Hop, origin: headers.Origin,
                     state: RequestState) -> None:
        """Park the record, attempt not made, in the shortest retry tier, due when the breaker may probe
        (design §5); a jitter of up to a second spreads the parked records."""
        now = self._clock_ms()
        tier = self._policy.tiers[0]  # never longer: a closed breaker must find its backlog soon
        wanted = round(deferred.delay_s * 1000) + self._rng.randrange(1000)
        reason = Failure(FailureLayer.SERVICE, deferred.code, deferred.reason)
        due = now + min(wanted, tier.delay_ms)
        written = await self._sink.retry(tier, request, headers.hop_headers(
            request.request_id, hop.attempt, origin, reason, hop.first_failure_ms, due_ms=due, replay=hop.replay,
            deferred=True, max_tokens=hop.max_tokens, run=state.run))
        await self._put_unless_superseded(state, on_deferred(state, now, deferred.code, written))
        self._observer.on_deferred(tier.name)

    async def _terminal(self, request: InferenceRequest, failure: Failure, attempt: int, first_failure_ms: int,
                        origin: headers.Origin, state: RequestState | None, called: CallResult | None = None,
                        paid: Success | None = None) -> None:
        await self._emit_failure(request, failure, attempt, True, first_failure_ms, origin, called,
                                 run=0 if state is None else state.run)
        now = self._clock_ms()
        if state is not None:
            await self._put_unless_superseded(state, on_terminal_failure(state, failure.layer, failure.code, now, paid))
        elif self._store.get(request.request_id) is None:  # a record rejected before admission
            await self._store.put(RequestState(request.request_id, RequestStatus.FAILED, input_hash(request),
                                         attempts=attempt, batch_id=request.batch_id, last_layer=failure.layer,
                                         last_error_code=failure.code, created_ms=now, updated_ms=now))

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

    async def _emit_failure(self, request: InferenceRequest, failure: Failure, attempt: int, terminal: bool,
                            first_failure_ms: int, origin: headers.Origin, called: CallResult | None = None, *,
                            run: int) -> None:
        """Write the failure event of an attempt, with what the provider answered when ``called`` got an answer.

        ``run`` is the run of the state the attempt was admitted with (0 when none was): attempt numbers restart
        with each replay, so the sink keys a failure by run and attempt (design §4 "Runs")."""
        if too_large_to_carry(request):  # the event would be refused; the full request stays at its origin
            request = without_body(request, f"{origin.topic}[{origin.partition}]@{origin.offset}")
        answer = called if failure.http_status is not None else None  # an HTTP answer came (not an exception)
        event = FailureEvent(
            request=request, layer=failure.layer, error_code=failure.code, message=failure.message,
            attempt=attempt, terminal=terminal, first_failure_ms=first_failure_ms,
            last_failure_ms=self._clock_ms(), http_status=failure.http_status,
            retry_after_ms=failure.retry_after_ms,
            response_body=None if answer is None else kept_body(answer.response_body),
            provider_request_id=None if answer is None else provider_request_id(answer.headers), run=run,
        )
        await self._sink.failure(event, headers.hop_headers(request.request_id, attempt, origin, failure,
                                                            first_failure_ms, run=run))
        self._observer.on_failure(failure.layer.value, failure.code, terminal)

    async def _decode(self, record: Record, origin: headers.Origin) -> InferenceRequest | None:
        """The record's request, or None once a poison record has been turned into its failure."""
        key = _text(record.key)
        try:
            request = codec.decode(record.value, InferenceRequest)
        except codec.CodecError as exc:
            request_id = key or codec.peek_request_id(record.value)
            reason = f"record {record.topic}[{record.partition}]@{record.offset}: {exc}"
            if request_id is None:
                failure = Failure(FailureLayer.BUSINESS, "unreadable_record", f"{reason}; no request id")
                if record.value is not None and len(record.value) > CARRIED_BYTES:  # it stays at its origin
                    reason += f"; its {len(record.value)} bytes are not copied (too large), read them at the origin"
                    record = replace(record, value=None)
                await self._sink.dead_letter(record, headers.hop_headers(
                    "", 1, origin, failure, self._clock_ms()) | {headers.ERROR_MESSAGE: reason.encode()[:1000]})
                self._observer.on_failure(failure.layer.value, failure.code, True)
                return None
            placeholder = InferenceRequest(request_id=request_id, body_json="", metadata=_raw_value(record.value))
            failure = Failure(FailureLayer.BUSINESS, "undecodable_record", reason)
            await self._terminal(placeholder, failure, 1, self._clock_ms(), origin, None)
            return None
        if key is not None and key != request.request_id:
            failure = Failure(FailureLayer.BUSINESS, "key_mismatch",
                              f"record key {key!r} differs from the request id {request.request_id!r}: "
                              "topics are keyed by request id so that its state stays on one partition")
            await self._terminal(replace(request, request_id=key), failure, 1, self._clock_ms(), origin, None)
            return None
        return request

    async def _internal_error(self, record: Record, exc: Exception) -> Disposition:
        """Last resort for a bug: a terminal business failure that backfill can replay once it is fixed."""
        request_id = _text(record.key) or ""
        try:
            request = codec.decode(record.value, InferenceRequest)
        except codec.CodecError:
            request = InferenceRequest(request_id=request_id, body_json="", metadata=_raw_value(record.value))
        failure = Failure(FailureLayer.BUSINESS, "internal_error", f"{type(exc).__name__}: {exc}"[:1000])
        hop = headers.read_hop(record.headers)  # provenance is carried, never rewritten (design §3)
        origin = hop.origin or headers.Origin(record.topic, record.partition, record.offset)
        try:
            await self._emit_failure(request, failure, hop.attempt, True, hop.first_failure_ms or self._clock_ms(),
                                     origin, run=hop.run)  # the record's run: which state admitted it is unknown
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


_ENDED = frozenset({SkipReason.ALREADY_SUCCEEDED, SkipReason.ALREADY_FAILED})


def _never(batch_id: str | None) -> str | None:
    return None


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
