"""The ``x-*`` headers on retry and failure records (design §3): UTF-8 text, replaced on every hop.

Headers are rebuilt from scratch at each hop rather than appended to, so they never grow with the number
of attempts; provenance (``x-orig-*``) is written once, from the first record, and then carried.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

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
MAX_TOKENS = "x-max-tokens"  # the completion budget of the next attempt, raised by escalations after cut answers
RUN = "x-run"  # the run of the request the record continues (core.request_state: a replay starts the next)
REDRIVEN = "x-redriven"  # sent again by the reconciler, and why (core.reconcile.StrandedBy)
ROUTE = "x-route"  # ``submit --route``: how the request is answered whatever its model's route (ROUTES)
ROUTES = ("provider-batch", "call")

Headers = dict[str, bytes]


@dataclass(frozen=True)
class Origin:
    """Where a request was first read: the requests topic's partition and offset."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def headers(self) -> Headers:
        """The headers that carry this origin on to the records a request's journey writes."""
        return {ORIG_TOPIC: self.topic.encode(), ORIG_PARTITION: str(self.partition).encode(),
                ORIG_OFFSET: str(self.offset).encode()}


@dataclass(frozen=True)
class Hop:
    """What the headers of a record say about its journey so far, and what the next record's headers say."""

    attempt: int = 1
    due_ms: int | None = None
    first_failure_ms: int | None = None
    origin: Origin | None = None
    replay: bool = False
    deferred: bool = False
    max_tokens: int | None = None
    run: int = 0  # 0: not written by the handler (a submission, a backfill replay) or before runs existed
    route: str | None = None  # one of ROUTES, carried from the submission; None: the model's route decides

    def retried(self, due_ms: int, first_failure_ms: int, run: int, max_tokens: int | None = None) -> Hop:
        """The hop of the retry record: the next attempt, due at ``due_ms``. A retry is neither a replay nor
        deferred; the completion budget is carried on, or raised to ``max_tokens`` (an escalation)."""
        budget = self.max_tokens if max_tokens is None else max_tokens
        return Hop(self.attempt + 1, due_ms, first_failure_ms, self.origin, max_tokens=budget, run=run,
                   route=self.route)

    def parked(self, due_ms: int, run: int) -> Hop:
        """The hop of the deferred record: this attempt, not made yet, due at ``due_ms``; the rest carried on."""
        return replace(self, due_ms=due_ms, deferred=True, run=run)

    def failed(self, first_failure_ms: int, run: int) -> Hop:
        """The hop a failure event of this attempt carries: no due time, nothing for a next attempt."""
        return Hop(self.attempt, first_failure_ms=first_failure_ms, origin=self.origin, run=run, route=self.route)

    def headers(self, request_id: str, failure: Failure) -> Headers:
        """This hop as the headers of a record about ``request_id``, with why it was written (``failure``): a
        retry record (the attempt it will make, due at ``due_ms``), a deferred record (the attempt not made
        yet) or a failure record (the attempt that failed, no due time). :func:`read_hop` reads them back."""
        headers: Headers = {
            REQUEST_ID: request_id.encode(),
            ATTEMPT: str(self.attempt).encode(),
            FAILURE_LAYER: failure.layer.value.encode(),
            ERROR_CODE: failure.code.encode(),
        }
        if self.origin is not None:
            headers |= self.origin.headers()
        if self.first_failure_ms is not None:
            headers[FIRST_FAILURE_TS] = str(self.first_failure_ms).encode()
        if self.due_ms is not None:
            headers[DUE_TS] = str(self.due_ms).encode()
        if failure.retry_after_ms is not None:
            headers[RETRY_AFTER_MS] = str(failure.retry_after_ms).encode()
        if self.replay:
            headers[REPLAY] = b"1"
        if self.deferred:
            headers[DEFERRED] = b"1"
        if self.max_tokens is not None:
            headers[MAX_TOKENS] = str(self.max_tokens).encode()
        if self.run > 0:
            headers[RUN] = str(self.run).encode()
        if self.route is not None:
            headers[ROUTE] = self.route.encode()
        return headers


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


def read_hop(headers: Mapping[str, bytes], here: Origin | None = None) -> Hop:
    """Parse our headers; anything missing or unreadable takes the value of a first submission, whose origin is
    ``here``, where the record itself was read (None: the headers' origin or none)."""
    topic = headers.get(ORIG_TOPIC)
    partition, offset = _int(headers, ORIG_PARTITION), _int(headers, ORIG_OFFSET)
    origin = (Origin(topic.decode("utf-8", "replace"), partition, offset)
              if topic is not None and partition is not None and offset is not None else here)
    return Hop(
        attempt=max(1, _int(headers, ATTEMPT, _INT_MAX) or 1),
        due_ms=_int(headers, DUE_TS),
        first_failure_ms=_int(headers, FIRST_FAILURE_TS),
        origin=origin,
        replay=headers.get(REPLAY) == b"1",
        deferred=headers.get(DEFERRED) == b"1",
        max_tokens=max_tokens if (max_tokens := _int(headers, MAX_TOKENS)) is not None and max_tokens > 0 else None,
        run=max(0, _int(headers, RUN, _INT_MAX) or 0),
        route=_route(headers),
    )


def _route(headers: Mapping[str, bytes]) -> str | None:
    """The route a record asks for; any other value (a producer's typo, a hostile one) is no route: the model's
    route decides."""
    value = headers.get(ROUTE, b"").decode("utf-8", "replace")
    return value if value in ROUTES else None
