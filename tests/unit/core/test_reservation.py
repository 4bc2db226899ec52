"""A request that waits or is parked before admission holds its id: the first record read owns it (design §4)."""

from __future__ import annotations

import json

from streamproc.core.events import InferenceRequest, RequestState
from streamproc.core.request_state import Conflict, RecordRef, Skip, SkipReason, Start, admit, input_hash
from streamproc.core.reservation import parked_at, reservation
from streamproc.core.retention import BATCH_FORGOTTEN
from streamproc.core.vocabulary import RequestStatus

BODY = {"model": "m", "messages": [{"role": "user", "content": "Ticket 407"}]}
ORIGINAL = InferenceRequest("b/ticket-407", json.dumps(BODY), batch_id="b", tenant="team-a", priority="low")
HOSTILE = InferenceRequest("b/ticket-407", json.dumps({**BODY, "temperature": 1}), batch_id="poison")
READ = RecordRef("llm.requests", 10)  # the original, read from the requests topic and parked
LATER = RecordRef("llm.requests", 11)  # the hostile duplicate, read after it and taken into a free hand
PARKED = RecordRef("llm.backlog", 3)  # the original's copy on the backlog
NOW = 1_000_000


def reserved() -> RequestState:
    state = reservation(None, ORIGINAL, NOW, None)
    assert state is not None
    return state


def test_a_reservation_is_a_pending_state_with_the_request_s_hash_and_no_attempt() -> None:
    state = reserved()
    assert (state.status, state.input_hash, state.attempts, state.run) == (
        RequestStatus.PENDING, input_hash(ORIGINAL), 0, 0)
    assert (state.batch_id, state.tenant, state.priority, state.created_ms) == ("b", "team-a", "low", NOW)
    assert (state.source_topic, state.next_topic) == (None, None)  # nothing for the reconciler yet


def test_an_id_with_a_state_is_not_reserved_again_and_a_forgotten_batch_is_never_reserved() -> None:
    started = admit(None, ORIGINAL, 1, NOW, source=READ)
    assert isinstance(started, Start)
    assert reservation(started.state, ORIGINAL, NOW, None) is None
    assert reservation(reserved(), ORIGINAL, NOW, None) is None
    assert reservation(None, ORIGINAL, NOW, BATCH_FORGOTTEN) is None
    assert reservation(None, ORIGINAL, NOW, "batch_cancelled") is not None  # handled (and ended) when it comes back


def test_a_later_record_with_another_body_conflicts_with_the_reservation_and_the_parked_original_starts() -> None:
    held = reserved()
    assert isinstance(admit(held, HOSTILE, 1, NOW + 1, source=LATER), Conflict)  # the table is left as it is
    back = admit(held, ORIGINAL, 1, NOW + 2, source=PARKED)
    assert isinstance(back, Start)
    assert (back.state.status, back.state.run, back.state.created_ms) == (RequestStatus.IN_FLIGHT, 1, NOW)


def test_a_redelivery_of_the_reserved_original_after_a_crash_is_handled_not_refused() -> None:
    """A crash after the reservation, before the parked copy was acked: the original is read again."""
    held = reserved()
    again = admit(held, ORIGINAL, 1, NOW + 5, source=READ)
    assert isinstance(again, Start)
    parked_copy = admit(again.state, ORIGINAL, 1, NOW + 6, source=PARKED)  # its first copy, parked before the crash
    assert parked_copy == Skip(SkipReason.IN_FLIGHT)


def test_the_reservation_names_its_parked_copy_once_and_never_overwrites_a_state_that_moved_on() -> None:
    held = reserved()
    named = parked_at(held, input_hash(ORIGINAL), PARKED)
    assert named is not None and (named.next_topic, named.next_offset) == ("llm.backlog", 3)
    assert parked_at(named, input_hash(ORIGINAL), PARKED) is None
    assert parked_at(named, input_hash(ORIGINAL), RecordRef("llm.backlog", 2)) is None  # an older copy
    later = parked_at(named, input_hash(ORIGINAL), RecordRef("llm.backlog", 9))  # parked again at a rebalance
    assert later is not None and later.next_offset == 9
    started = admit(held, ORIGINAL, 1, NOW, source=PARKED)
    assert isinstance(started, Start)
    assert parked_at(started.state, input_hash(ORIGINAL), PARKED) is None
    assert parked_at(held, input_hash(HOSTILE), PARKED) is None
    assert parked_at(None, input_hash(ORIGINAL), PARKED) is None

