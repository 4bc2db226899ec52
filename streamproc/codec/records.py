"""The events on streamproc's topics as Avro records, and back: the pure half of the codec.

An Avro record here is what fastavro writes and reads: a plain dict, enums as their symbols, a nested record
as a nested dict. No schema and no bytes: which schema a record is written with, and how the bytes are
framed, are the business of ``writer_schemas`` and ``framing``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias, TypeVar, cast

from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RepairContext, RequestState
from streamproc.core.vocabulary import FailureLayer, RequestStatus

__all__ = ["EVENT_TYPES", "AvroRecord", "E", "Event", "from_avro", "not_an_event_type", "to_avro"]

Event: TypeAlias = InferenceRequest | InferenceResult | FailureEvent | RequestState
E = TypeVar("E", bound=Event)
AvroRecord: TypeAlias = dict[str, Any]


def _repair_to_avro(repair: RepairContext | None) -> AvroRecord | None:
    if repair is None:
        return None
    return {"bad_output": repair.bad_output, "reason": repair.reason}


def _request_to_avro(request: InferenceRequest) -> AvroRecord:
    return {
        "request_id": request.request_id,
        "body_json": request.body_json,
        "url": request.url,
        "batch_id": request.batch_id,
        "submitted_ms": request.submitted_ms,
        "repair": _repair_to_avro(request.repair),
        "metadata": request.metadata,
        "tenant": request.tenant,
        "priority": request.priority,
    }


def _request_from_avro(datum: AvroRecord) -> InferenceRequest:
    repair = datum["repair"]
    return InferenceRequest(
        request_id=datum["request_id"],
        body_json=datum["body_json"],
        url=datum["url"],
        batch_id=datum["batch_id"],
        submitted_ms=datum["submitted_ms"],
        repair=None if repair is None else RepairContext(repair["bad_output"], repair["reason"]),
        metadata=datum["metadata"],
        tenant=datum["tenant"],
        priority=datum["priority"],
    )


def _result_to_avro(result: InferenceResult) -> AvroRecord:
    return {
        "request_id": result.request_id,
        "batch_id": result.batch_id,
        "model": result.model,
        "response_json": result.response_json,
        "content": result.content,
        "attempts": result.attempts,
        "latency_ms": result.latency_ms,
        "completed_ms": result.completed_ms,
        "input_hash": result.input_hash,
        "provider_request_id": result.provider_request_id,
        "reused_from": result.reused_from,
        "deployment": result.deployment,
        "tenant": result.tenant,
        "priority": result.priority,
    }


def _result_from_avro(datum: AvroRecord) -> InferenceResult:
    return InferenceResult(
        request_id=datum["request_id"],
        batch_id=datum["batch_id"],
        model=datum["model"],
        response_json=datum["response_json"],
        content=datum["content"],
        attempts=datum["attempts"],
        latency_ms=datum["latency_ms"],
        completed_ms=datum["completed_ms"],
        input_hash=datum["input_hash"],
        provider_request_id=datum["provider_request_id"],
        reused_from=datum["reused_from"],
        deployment=datum["deployment"],
        tenant=datum["tenant"],
        priority=datum["priority"],
    )


def _failure_to_avro(failure: FailureEvent) -> AvroRecord:
    return {
        "request": _request_to_avro(failure.request),
        "layer": failure.layer.value,
        "error_code": failure.error_code,
        "message": failure.message,
        "attempt": failure.attempt,
        "terminal": failure.terminal,
        "first_failure_ms": failure.first_failure_ms,
        "last_failure_ms": failure.last_failure_ms,
        "http_status": failure.http_status,
        "retry_after_ms": failure.retry_after_ms,
        "response_body": failure.response_body,
        "provider_request_id": failure.provider_request_id,
        "run": failure.run,
        "deployment": failure.deployment,
    }


def _failure_from_avro(datum: AvroRecord) -> FailureEvent:
    return FailureEvent(
        request=_request_from_avro(datum["request"]),
        layer=FailureLayer(datum["layer"]),
        error_code=datum["error_code"],
        message=datum["message"],
        attempt=datum["attempt"],
        terminal=datum["terminal"],
        first_failure_ms=datum["first_failure_ms"],
        last_failure_ms=datum["last_failure_ms"],
        http_status=datum["http_status"],
        retry_after_ms=datum["retry_after_ms"],
        response_body=datum["response_body"],
        provider_request_id=datum["provider_request_id"],
        run=datum["run"],
        deployment=datum["deployment"],
    )


def _state_to_avro(state: RequestState) -> AvroRecord:
    return {
        "request_id": state.request_id,
        "status": state.status.value,
        "input_hash": state.input_hash,
        "attempts": state.attempts,
        "batch_id": state.batch_id,
        "last_layer": None if state.last_layer is None else state.last_layer.value,
        "last_error_code": state.last_error_code,
        "created_ms": state.created_ms,
        "updated_ms": state.updated_ms,
        "source_topic": state.source_topic,
        "source_offset": state.source_offset,
        "next_topic": state.next_topic,
        "next_offset": state.next_offset,
        "retries_spent": state.retries_spent,
        "model": state.model,
        "prompt_tokens": state.prompt_tokens,
        "completion_tokens": state.completion_tokens,
        "reused": state.reused,
        "run": state.run,
        "replay_topic": state.replay_topic,
        "replay_offset": state.replay_offset,
        "tenant": state.tenant,
        "priority": state.priority,
        "provider_batch": state.provider_batch,
    }


def _state_from_avro(datum: AvroRecord) -> RequestState:
    last_layer = datum["last_layer"]
    return RequestState(
        request_id=datum["request_id"],
        status=RequestStatus(datum["status"]),
        input_hash=datum["input_hash"],
        attempts=datum["attempts"],
        batch_id=datum["batch_id"],
        last_layer=None if last_layer is None else FailureLayer(last_layer),
        last_error_code=datum["last_error_code"],
        created_ms=datum["created_ms"],
        updated_ms=datum["updated_ms"],
        source_topic=datum["source_topic"],
        source_offset=datum["source_offset"],
        next_topic=datum["next_topic"],
        next_offset=datum["next_offset"],
        retries_spent=datum["retries_spent"],
        model=datum["model"],
        prompt_tokens=datum["prompt_tokens"],
        completion_tokens=datum["completion_tokens"],
        reused=datum["reused"],
        run=datum["run"],
        replay_topic=datum["replay_topic"],
        replay_offset=datum["replay_offset"],
        tenant=datum["tenant"],
        priority=datum["priority"],
        provider_batch=datum["provider_batch"],
    )



class _Conversion(NamedTuple):
    to_avro: Callable[[Any], AvroRecord]
    from_avro: Callable[[AvroRecord], Any]


_CONVERSIONS: dict[type[Any], _Conversion] = {
    InferenceRequest: _Conversion(_request_to_avro, _request_from_avro),
    InferenceResult: _Conversion(_result_to_avro, _result_from_avro),
    FailureEvent: _Conversion(_failure_to_avro, _failure_from_avro),
    RequestState: _Conversion(_state_to_avro, _state_from_avro),
}
EVENT_TYPES: tuple[type[Any], ...] = tuple(_CONVERSIONS)
"""The event types, each with an Avro record (and a schema ``<class name>.avsc``)."""


def not_an_event_type(cls: type[Any]) -> TypeError:
    """The error for a class that is none of :data:`EVENT_TYPES`: a programming error, not a bad payload."""
    known = ", ".join(sorted(c.__name__ for c in EVENT_TYPES))
    return TypeError(f"{cls.__name__} is not a streamproc event type (known: {known})")


def _conversion_of(cls: type[Any]) -> _Conversion:
    try:
        return _CONVERSIONS[cls]
    except KeyError:
        raise not_an_event_type(cls) from None


def to_avro(record: Event) -> AvroRecord:
    """The Avro record (a plain dict, enums as their symbols) that fastavro writes for an event."""
    return _conversion_of(type(record)).to_avro(record)


def from_avro(datum: AvroRecord, record_type: type[E]) -> E:
    """The event for an Avro record read with the current schema of ``record_type`` (all fields present)."""
    return cast(E, _conversion_of(record_type).from_avro(datum))
