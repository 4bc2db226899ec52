"""A request that waits or is parked before admission still holds its id (design §4, "Reservations"; §5.11).

A new request whose tenant has no room in the hand waits in memory or is parked on the backlog, and is admitted
(:func:`streamproc.core.request_state.admit`) only when it comes back. Without a state for its id, a later record
of the same id with another body that meets a free hand was admitted first and owned the id, and the original,
fed back, ended ``conflicting_duplicate``: the first record read no longer won. So before a record waits or is
parked, its id is *reserved*: a ``pending`` state with its input hash, written through the record's partition as
admission would write. ``admit`` then does the rest: the original, same hash, starts (``pending`` starts); another
body conflicts; a redelivery of the original after a crash finds its own reservation and is handled again.
"""

from __future__ import annotations

from dataclasses import replace

from streamproc.core.events import InferenceRequest, RequestState
from streamproc.core.request_state import RecordRef, input_hash
from streamproc.core.retention import BATCH_FORGOTTEN
from streamproc.core.vocabulary import RequestStatus


def reservation(current: RequestState | None, request: InferenceRequest, now_ms: int,
                closed: str | None) -> RequestState | None:
    """The ``pending`` state that holds ``request``'s id while it waits unadmitted, or None when none is written:
    the id has a state already (``admit`` decides against it when the record comes back), or the request's batch
    was forgotten (it is refused without a state, so the batch's states stay forgotten)."""
    if current is not None or closed == BATCH_FORGOTTEN:
        return None
    return RequestState(request_id=request.request_id, status=RequestStatus.PENDING, input_hash=input_hash(request),
                        batch_id=request.batch_id, created_ms=now_ms, updated_ms=now_ms, tenant=request.tenant,
                        priority=request.priority)


def parked_at(current: RequestState | None, digest: str, parked: RecordRef) -> RequestState | None:
    """The reservation naming its parked copy (``parked``: where the backlog holds it; ``digest``: the copy's input
    hash), so the reconciler sends that copy again if it is consumed while the id stays reserved; None when there
    is nothing to name: the table moved on (the copy was admitted already, or another body holds the id), or it
    names this copy or a later one already."""
    if current is None or current.status is not RequestStatus.PENDING or current.input_hash != digest:
        return None
    if current.next_topic == parked.topic and current.next_offset is not None and current.next_offset >= parked.offset:
        return None
    return replace(current, next_topic=parked.topic, next_offset=parked.offset)
