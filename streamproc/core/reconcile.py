"""Which waiting requests have nothing left to move them, and which record would (design §4, the reconciler).

A request that waits (``retrying``) has one record that continues it: its retry or deferred record, whose
place the state remembers (``next_topic``/``next_offset``); so has a request parked on the backlog before
admission (``pending``, its id reserved: core.reservation), its parked copy. A request ``in_flight`` has the record that
started the attempt (``source_topic``/``source_offset``). Once the consumer group has committed past that
record, it was handled, so the state should have moved on. If it did not (a table write lost in a crash, a
record dropped by the consumer), nothing will ever move the request again: it is *stranded*.

The cure is to send that record again. It is idempotent because the state machine decides: a retry or
deferred record of the waiting attempt is admitted once, and any later copy is skipped. An ``in_flight``
attempt whose outcome was lost is re-driven as the next attempt (its record, one attempt later), since a
copy of the same attempt would be skipped as a duplicate of the running one.

A grace period covers the moment between a commit and the state write that the reconciler's reading of the
table may not see yet (a rebalance moves both, in separate topics).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from streamproc.core import headers
from streamproc.core.events import RequestState
from streamproc.core.request_state import RecordRef
from streamproc.core.vocabulary import RequestStatus

_WAITING = (RequestStatus.RETRYING, RequestStatus.PENDING)  # states a record of ``next_*`` continues


class StrandedBy(StrEnum):
    """Why a request has nothing left to move it (the label of ``streamproc_requests_redriven_total``)."""

    WAITING_RECORD_CONSUMED = "waiting_record_consumed"  # retrying (or parked), yet its waiting record was handled
    ATTEMPT_OUTCOME_LOST = "attempt_outcome_lost"  # in flight, yet the record of its attempt was handled


@dataclass(frozen=True)
class Redrive:
    """Send ``record`` again; as attempt ``attempt`` (its own number when None), in the request's ``run``."""

    request_id: str
    record: RecordRef
    why: StrandedBy
    attempt: int | None
    run: int = 0


Committed = Callable[[str], int | None]
"""The consumer group's committed offset of a topic on the request's partition (None: nothing committed)."""


def stranded(state: RequestState, committed: Committed, now_ms: int, grace_ms: int) -> Redrive | None:
    """The re-drive a stranded request needs, or None when something will still move it (or it is done)."""
    if now_ms - state.updated_ms < grace_ms:
        return None
    if (state.status in _WAITING and state.next_topic is not None and state.next_offset is not None
            and _handled(committed(state.next_topic), state.next_offset)):
        return Redrive(state.request_id, RecordRef(state.next_topic, state.next_offset),
                       StrandedBy.WAITING_RECORD_CONSUMED, None, state.run)
    if (state.status is RequestStatus.IN_FLIGHT and state.source_topic is not None
            and state.source_offset is not None and _handled(committed(state.source_topic), state.source_offset)):
        return Redrive(state.request_id, RecordRef(state.source_topic, state.source_offset),
                       StrandedBy.ATTEMPT_OUTCOME_LOST, state.attempts + 1, state.run)
    return None


def _handled(committed_offset: int | None, offset: int) -> bool:
    """A committed offset is the next one to read: everything below it was handled."""
    return committed_offset is not None and committed_offset > offset


def redrive_headers(original: Mapping[str, bytes], redrive: Redrive, partition: int) -> headers.Headers:
    """The headers of the copy: due now, in the state's run, and for a lost attempt the next attempt number, as
    a plain retry.

    The replay and deferred marks go: the next attempt of an attempt in flight is neither (a replay mark
    would make the state machine skip it as "in flight"). The origin is kept, or set to the record itself
    when it was the first submission.
    """
    copy = dict(original)
    copy.pop(headers.DUE_TS, None)
    if redrive.attempt is not None:
        copy[headers.ATTEMPT] = str(redrive.attempt).encode()
        copy.pop(headers.REPLAY, None)
        copy.pop(headers.DEFERRED, None)
        if headers.read_hop(original).origin is None:
            copy |= headers.Origin(redrive.record.topic, partition, redrive.record.offset).headers()
    if redrive.run > 0:  # a replay record (no run of its own) continues the run it started
        copy[headers.RUN] = str(redrive.run).encode()
    copy[headers.REDRIVEN] = redrive.why.value.encode()
    return copy
