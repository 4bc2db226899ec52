"""The ``x-*`` headers on retry and failure records (design §3): UTF-8 text, replaced on every hop.

Headers are rebuilt from scratch at each hop rather than appended to, so they never grow with the number
of attempts; provenance (``x-orig-*``) is written once, from the first record, and then carried.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from streamproc.core.outcome import Failure

REQUEST_ID = "x-request-id"
ATTEMPT = "x-attempt"
DUE_TS = "x-due-ts"
FIRST_FAILURE_TS = "x-first-failure-ts"
FAILURE_LAYER = "x-failure-layer"
ERROR_CODE = "x-error-code"
ERROR_MESSAGE = "x-error-message"
RETRY_AFTER_MS = "x-retry-after-ms"
ORIG_TOPIC = "x-orig-topic"
ORIG_PARTITION = "x-orig-partition"
ORIG_OFFSET = "x-orig-offset"
REPLAY = "x-replay"
DEFERRED = "x-deferred"  # parked by an open circuit breaker: the attempt it carries has not been made yet
MAX_TOKENS = "x-max-tokens"  # the completion budget of the next attempt, raised after a truncated answer
RUN = "x-run"  # the run of the request the record continues (core.request_state: a replay starts the next)
REDRIVEN = "x-redriven"  # sent again by the reconciler, and why (core.reconcile.StrandedBy)

Headers = dict[str, bytes]


@dataclass(frozen=True)
class Origin:
    """Where a request was first read: the requests topic's partition and offset."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class Hop:
    """What the headers of an incoming record say about its journey so far."""

    attempt: int = 1
    due_ms: int | None = None
    first_failure_ms: int | None = None
    origin: Origin | None = None
    replay: bool = False
    deferred: bool = False
    max_tokens: int | None = None
    run: int = 0  # 0: not written by the handler (a submission, a backfill replay) or before runs existed


def as_mapping(raw: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None) -> dict[str, bytes]:
    """Kafka clients give headers as a list of pairs or a dict; the last value of a name wins."""
    if raw is None:
        return {}
    pairs = raw.items() if isinstance(raw, Mapping) else raw
    return {name: bytes(value) for name, value in pairs if value is not None}


# What the events these numbers go into can carry (Avro): an attempt is an int, a timestamp a long. A value
# beyond is unreadable, not an event that can never be written (a record whose failure event cannot be sent
# is held, and stops the worker).
_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1


def _int(headers: Mapping[str, bytes], name: str, limit: int = _LONG_MAX) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = int(value.decode("utf-8", "replace"))
    except ValueError:
        return None
    return number if -limit - 1 <= number <= limit else None


def read_hop(headers: Mapping[str, bytes]) -> Hop:
    """Parse our headers; anything missing or unreadable takes the value of a first submission."""
    topic = headers.get(ORIG_TOPIC)
    partition, offset = _int(headers, ORIG_PARTITION), _int(headers, ORIG_OFFSET)
    origin = (Origin(topic.decode("utf-8", "replace"), partition, offset)
              if topic is not None and partition is not None and offset is not None else None)
    return Hop(
        attempt=max(1, _int(headers, ATTEMPT, _INT_MAX) or 1),
        due_ms=_int(headers, DUE_TS),
        first_failure_ms=_int(headers, FIRST_FAILURE_TS),
        origin=origin,
        replay=headers.get(REPLAY) == b"1",
        deferred=headers.get(DEFERRED) == b"1",
        max_tokens=max_tokens if (max_tokens := _int(headers, MAX_TOKENS)) is not None and max_tokens > 0 else None,
        run=max(0, _int(headers, RUN, _INT_MAX) or 0),
    )


def hop_headers(request_id: str, attempt: int, origin: Origin, failure: Failure, first_failure_ms: int | None,
                due_ms: int | None = None, replay: bool = False, deferred: bool = False,
                max_tokens: int | None = None, run: int = 0) -> Headers:
    """Headers of a retry record (``attempt`` is the attempt it will make, with ``due_ms``), of a deferred
    record (``attempt`` not made yet; ``failure`` says why it waits) or of a failure record (``attempt`` is
    the attempt that failed, no due time)."""
    headers: Headers = {
        REQUEST_ID: request_id.encode(),
        ATTEMPT: str(attempt).encode(),
        FAILURE_LAYER: failure.layer.value.encode(),
        ERROR_CODE: failure.code.encode(),
        ORIG_TOPIC: origin.topic.encode(),
        ORIG_PARTITION: str(origin.partition).encode(),
        ORIG_OFFSET: str(origin.offset).encode(),
    }
    if first_failure_ms is not None:
        headers[FIRST_FAILURE_TS] = str(first_failure_ms).encode()
    if due_ms is not None:
        headers[DUE_TS] = str(due_ms).encode()
    if failure.retry_after_ms is not None:
        headers[RETRY_AFTER_MS] = str(failure.retry_after_ms).encode()
    if replay:
        headers[REPLAY] = b"1"
    if deferred:
        headers[DEFERRED] = b"1"
    if max_tokens is not None:
        headers[MAX_TOKENS] = str(max_tokens).encode()
    if run > 0:
        headers[RUN] = str(run).encode()
    return headers
