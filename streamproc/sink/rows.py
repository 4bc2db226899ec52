"""Records -> the rows the sink writes: pure, so what lands in the database is decided (and tested) here.

A request's identity is (batch, custom_id) (:mod:`streamproc.core.identity`); ids without a batch scope
have the batch ``''``, because a primary key has no NULLs. Timestamps are ISO 8601 text in UTC with
milliseconds: PostgreSQL casts it to ``timestamptz`` and SQLite keeps it as text that sorts in time order
and that its date functions read.

:class:`RowBatch` collects one poll's records and settles duplicates inside it the way the database does
across transactions: the first result of a request wins (as in the export), the latest failure of an
attempt (of a run) wins, a dead letter is kept once per position.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any, NamedTuple, Protocol

from streamproc import codec
from streamproc.core import headers
from streamproc.core.events import FailureEvent, InferenceResult
from streamproc.core.identity import custom_id_of
from streamproc.sink.text import storable, storable_row

REASON_CHARS = 1000  # a rejected row's reason is cut here: an exception's text can quote the whole record


class Kind(Enum):
    """What a topic carries, as far as the sink is concerned."""

    RESULT = "result"
    FAILURE = "failure"
    DEAD_LETTER = "dead letter"


class Record(Protocol):
    """The parts of a Kafka record the sink reads (aiokafka's ``ConsumerRecord`` has them)."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]


def iso_ms(epoch_ms: int) -> str:
    """``2026-11-03T10:00:00.123+00:00``: one format, so text order is time order."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


class ResultRow(NamedTuple):
    batch: str
    custom_id: str
    request_id: str
    model: str
    content: str
    response: str
    usage: str | None  # the response's usage object as JSON text
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None
    attempt: int
    latency_ms: int
    finished_at: str
    input_hash: str
    provider_request_id: str | None  # the provider's id for the call, when it sent one
    reused_from: str | None  # the request whose answer this reuses (no call made)
    deployment: str | None  # the deployment of the model list that answered (migration 5)
    tenant: str  # the request's (migration 7)
    priority: str

    @property
    def key(self) -> tuple[str, str]:
        return self.batch, self.custom_id


class FailureRow(NamedTuple):
    batch: str
    custom_id: str
    run: int  # the request's run (a replay starts the next, and attempts restart at 1); 0: unknown
    attempt: int
    request_id: str
    layer: str
    code: str
    message: str
    http_status: int | None
    retry_after_ms: int | None
    terminal: bool
    model: str | None  # the model the request asked for
    first_failed_at: str
    failed_at: str
    url: str
    body: str  # the request body, so the failure can be read and replayed from the database alone
    metadata: str  # JSON object
    provider_body: str | None  # what the provider answered (bounded), when an HTTP answer came
    provider_request_id: str | None
    submitted_ms: int  # the request's own, so a replay from the database is the record a topic replay sends
    repair: str | None  # the request's repair context as JSON ({"bad_output", "reason"}), when it carried one
    deployment: str | None  # the deployment of the model list the failed call was made to (migration 6)
    tenant: str  # the request's (migration 7)
    priority: str

    @property
    def key(self) -> tuple[str, str, int, int]:
        return self.batch, self.custom_id, self.run, self.attempt


class DeadLetterRow(NamedTuple):
    kafka_partition: int
    kafka_offset: int
    request_id: str | None
    record_key: bytes | None
    record_value: bytes | None  # None when it was too large to copy: it stays at its origin
    layer: str | None
    code: str | None
    message: str | None
    origin_topic: str | None
    origin_partition: int | None
    origin_offset: int | None
    dead_at: str

    @property
    def key(self) -> tuple[int, int]:
        return self.kafka_partition, self.kafka_offset


def result_row(result: InferenceResult) -> ResultRow:
    usage = _usage(result.response_json)

    def tokens(name: str) -> int | None:
        value = None if usage is None else usage.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return ResultRow(
        batch=result.batch_id or "", custom_id=custom_id_of(result.request_id, result.batch_id),
        request_id=result.request_id, model=result.model, content=result.content, response=result.response_json,
        usage=None if usage is None else json.dumps(usage), prompt_tokens=tokens("prompt_tokens"),
        completion_tokens=tokens("completion_tokens"), total_tokens=tokens("total_tokens"),
        attempt=result.attempts, latency_ms=result.latency_ms, finished_at=iso_ms(result.completed_ms),
        input_hash=result.input_hash, provider_request_id=result.provider_request_id,
        reused_from=result.reused_from, deployment=result.deployment, tenant=result.tenant,
        priority=result.priority)


def failure_row(failure: FailureEvent) -> FailureRow:
    request = failure.request
    return FailureRow(
        batch=request.batch_id or "", custom_id=custom_id_of(request.request_id, request.batch_id),
        run=failure.run, attempt=failure.attempt, request_id=request.request_id, layer=failure.layer.value,
        code=failure.error_code, message=failure.message, http_status=failure.http_status,
        retry_after_ms=failure.retry_after_ms, terminal=failure.terminal, model=_requested_model(request.body_json),
        first_failed_at=iso_ms(failure.first_failure_ms), failed_at=iso_ms(failure.last_failure_ms),
        url=request.url, body=request.body_json, metadata=json.dumps(request.metadata, sort_keys=True),
        provider_body=failure.response_body, provider_request_id=failure.provider_request_id,
        submitted_ms=request.submitted_ms,
        repair=None if request.repair is None else json.dumps(asdict(request.repair), sort_keys=True),
        deployment=failure.deployment, tenant=request.tenant, priority=request.priority)


def dead_letter_row(record: Record) -> DeadLetterRow:
    """A dead letter's reason and origin come from its headers (design §3); its bytes are kept as they were."""
    hdrs = headers.as_mapping(record.headers)

    def text(name: str) -> str | None:
        value = hdrs.get(name)
        return None if value is None else value.decode("utf-8", "replace")

    def number(name: str) -> int | None:
        value = text(name)
        return int(value) if value is not None and value.lstrip("-").isdigit() else None

    return DeadLetterRow(
        kafka_partition=record.partition, kafka_offset=record.offset,
        request_id=text(headers.REQUEST_ID) or None, record_key=record.key, record_value=record.value,
        layer=text(headers.FAILURE_LAYER), code=text(headers.ERROR_CODE), message=text(headers.ERROR_MESSAGE),
        origin_topic=text(headers.ORIG_TOPIC), origin_partition=number(headers.ORIG_PARTITION),
        origin_offset=number(headers.ORIG_OFFSET), dead_at=iso_ms(record.timestamp))


def _usage(response_json: str) -> dict[str, Any] | None:
    try:
        body = json.loads(response_json)
    except ValueError:
        return None
    usage = body.get("usage") if isinstance(body, dict) else None
    return usage if isinstance(usage, dict) else None


def _requested_model(body_json: str) -> str | None:
    try:
        body = json.loads(body_json)
    except ValueError:  # an undecodable record's placeholder has no body
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


class Origin(NamedTuple):
    """Where a row's record sits: what a rejected row names."""

    topic: str
    partition: int
    offset: int


class RejectedRow(NamedTuple):
    """A record whose row could not be made or written: set aside, so the sink goes on past it."""

    topic: str
    kafka_partition: int
    kafka_offset: int
    request_id: str | None
    reason: str

    @property
    def key(self) -> tuple[str, int, int]:
        return self.topic, self.kafka_partition, self.kafka_offset


def rejected_row(origin: Origin, request_id: str | None, reason: str) -> RejectedRow:
    """The row that sets ``origin`` aside, its reason bounded and storable (``request_id`` is already)."""
    if len(reason) > REASON_CHARS:
        reason = reason[:REASON_CHARS] + f"... ({len(reason)} characters)"
    return RejectedRow(origin.topic, origin.partition, origin.offset, request_id, storable(reason))


def _header_request_id(record: Record) -> str | None:
    value = headers.as_mapping(record.headers).get(headers.REQUEST_ID)
    return storable(value.decode("utf-8", "replace")) if value else None


@dataclass
class RowBatch:
    """The rows of one poll, each key once; ``skipped`` counts records that are no event of ours,
    ``rejected`` the records set aside (no row could be made of them), ``origins`` where each row came from."""

    results: dict[tuple[str, str], ResultRow] = field(default_factory=dict)
    failures: dict[tuple[str, str, int, int], FailureRow] = field(default_factory=dict)
    dead_letters: dict[tuple[int, int], DeadLetterRow] = field(default_factory=dict)
    skipped: int = 0
    rejected: dict[tuple[str, int, int], RejectedRow] = field(default_factory=dict)
    origins: dict[tuple[object, ...], Origin] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.results) + len(self.failures) + len(self.dead_letters)

    def add(self, kind: Kind, record: Record, topic: str = "", schema_lookup: codec.SchemaLookup | None = None,
            ) -> None:
        """The record's row (a Confluent-framed one read with ``schema_lookup``, the registry's); one that is no
        event of ours is skipped, one that makes no row (deeply nested JSON: ``RecursionError``, or any other
        error) is rejected. Never raises."""
        origin = Origin(topic, record.partition, record.offset)
        try:
            self._add(kind, record, origin, schema_lookup)
        except codec.CodecError:
            self.skipped += 1  # a foreign record on our topic: part of no request's outcome
        except Exception as exc:  # any error: one record never stops the sink
            reason = f"unreadable: {type(exc).__name__}: {exc}"
            self.reject(rejected_row(origin, _header_request_id(record), reason))

    def _add(self, kind: Kind, record: Record, origin: Origin, schema_lookup: codec.SchemaLookup | None) -> None:
        if kind is Kind.DEAD_LETTER:
            row = storable_row(dead_letter_row(record))
            if row.key not in self.dead_letters:
                self.dead_letters[row.key] = row
                self.origins[row.key] = origin
            return
        if kind is Kind.RESULT:
            result = storable_row(result_row(codec.decode(record.value, InferenceResult, schema_lookup=schema_lookup)))
            if result.key not in self.results:
                self.results[result.key] = result
                self.origins[result.key] = origin
            return
        failure = storable_row(failure_row(codec.decode(record.value, FailureEvent, schema_lookup=schema_lookup)))
        held = self.failures.get(failure.key)
        if held is None or held.failed_at <= failure.failed_at:
            self.failures[failure.key] = failure
            self.origins[failure.key] = origin

    def reject(self, row: RejectedRow) -> None:
        self.rejected.setdefault(row.key, row)

    def touched(self) -> set[tuple[str, str]]:
        """The requests this batch wrote about: their failure rows may have become resolved."""
        return set(self.results) | {(batch, custom_id) for batch, custom_id, _, _ in self.failures}

    def singles(self) -> Iterator[tuple[Origin, str | None, RowBatch]]:
        """Each row alone, with its origin and request id: what is written one by one when the batch
        as a whole could not be."""
        for key, result in self.results.items():
            yield self.origins[key], result.request_id, RowBatch(results={key: result})
        for failure_key, failure in self.failures.items():
            yield self.origins[failure_key], failure.request_id, RowBatch(failures={failure_key: failure})
        for letter_key, letter in self.dead_letters.items():
            yield self.origins[letter_key], letter.request_id, RowBatch(dead_letters={letter_key: letter})
