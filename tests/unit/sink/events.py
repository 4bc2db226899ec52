"""Events and Kafka-like records for the sink's unit tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from streamproc import codec
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.identity import request_id_for
from streamproc.core.vocabulary import FailureLayer
from streamproc.sink.rows import Kind, RowBatch

BODY = json.dumps({"model": "mock-small", "messages": [{"role": "user", "content": "Label: Buy now!!!"}]})
RESPONSE = json.dumps({"id": "chatcmpl-1", "choices": [{"message": {"role": "assistant", "content": "spam"}}],
                       "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}})


def result(custom_id: str = "req-1", batch: str | None = "b1", *, completed_ms: int = 10_000, attempts: int = 1,
           content: str = "spam", response: str = RESPONSE, model: str = "mock-small",
           deployment: str | None = None) -> InferenceResult:
    request_id = custom_id if batch is None else request_id_for(batch, custom_id)
    return InferenceResult(request_id, batch, model, response, content, attempts=attempts, latency_ms=80,
                           completed_ms=completed_ms, input_hash="h", deployment=deployment)


def failure(custom_id: str = "req-1", batch: str | None = "b1", *, attempt: int = 1, run: int = 1,
            terminal: bool = False, failed_ms: int = 5_000, layer: FailureLayer = FailureLayer.SERVICE,
            code: str = "rate_limit_exceeded", status: int | None = 429,
            message: str = "HTTP 429 rate_limit_exceeded", deployment: str | None = None) -> FailureEvent:
    request_id = custom_id if batch is None else request_id_for(batch, custom_id)
    request = InferenceRequest(request_id, BODY, batch_id=batch, submitted_ms=1_000, metadata={"team": "x"})
    return FailureEvent(request, layer, code, message, attempt, terminal, first_failure_ms=4_000,
                        last_failure_ms=failed_ms, http_status=status, retry_after_ms=None,
                        response_body=None if status is None else '{"error": {"code": "rate_limit_exceeded"}}',
                        provider_request_id=None if status is None else "req_abc", run=run, deployment=deployment)


@dataclass
class FakeRecord:
    """The parts of an aiokafka ConsumerRecord the sink reads."""

    value: bytes | None
    partition: int = 0
    offset: int = 0
    timestamp: int = 7_000
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = field(default_factory=list)


def record(event: InferenceResult | FailureEvent, offset: int = 0) -> FakeRecord:
    return FakeRecord(codec.encode(event), offset=offset)


def rows_of(*events: InferenceResult | FailureEvent) -> RowBatch:
    """The rows one poll of these events gives, in this order."""
    rows = RowBatch()
    for event in events:
        rows.add(Kind.RESULT if isinstance(event, InferenceResult) else Kind.FAILURE, record(event))
    return rows
