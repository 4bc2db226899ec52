"""A batch's OpenAI status and ``*_at`` times, from its counts and its manifest's times."""

from __future__ import annotations

from streamproc.core.batch_lifecycle import lifecycle
from streamproc.core.batch_status import StatusFold
from streamproc.core.events import RequestState
from streamproc.core.vocabulary import FailureLayer, RequestStatus

CREATED = 1_700_000_000_000


def fold(*ends: tuple[RequestStatus, int, int]) -> StatusFold:
    """One state per (status, created_ms, updated_ms)."""
    states = StatusFold("b")
    states.apply([RequestState(f"b/{i}", status, "h", batch_id="b", created_ms=created, updated_ms=updated,
                               last_layer=FailureLayer.BUSINESS if status is RequestStatus.FAILED else None)
                  for i, (status, created, updated) in enumerate(ends)])
    return states


def test_a_batch_nobody_took_yet_is_in_progress_with_only_its_creation_time() -> None:
    steps = lifecycle(fold().status(2, CREATED), CREATED)
    assert steps.as_json() == {"status": "in_progress", "created_at": 1_700_000_000, "in_progress_at": None,
                               "expires_at": None, "completed_at": None, "cancelling_at": None,
                               "cancelled_at": None, "expired_at": None, "forgotten_at": None}


def test_in_progress_from_the_first_request_taken_and_completed_when_the_last_one_ended() -> None:
    running = fold((RequestStatus.SUCCEEDED, CREATED + 2_000, CREATED + 3_000),
                   (RequestStatus.IN_FLIGHT, CREATED + 1_500, CREATED + 1_500))
    steps = lifecycle(running.status(2, CREATED), CREATED, expires_ms=CREATED + 60_000)
    assert (steps.status, steps.in_progress_ms, steps.completed_ms) == ("in_progress", CREATED + 1_500, None)
    running.apply([RequestState("b/1", RequestStatus.FAILED, "h", batch_id="b", created_ms=CREATED + 1_500,
                                updated_ms=CREATED + 9_000, last_layer=FailureLayer.SERVICE)])
    done = lifecycle(running.status(2, CREATED), CREATED, expires_ms=CREATED + 60_000).as_json()
    assert {key: done[key] for key in ("status", "in_progress_at", "completed_at", "expires_at", "expired_at")} == {
        "status": "completed", "in_progress_at": 1_700_000_001, "completed_at": 1_700_000_009,
        "expires_at": 1_700_000_060, "expired_at": None}


def test_a_cancelled_batch_is_cancelling_then_cancelled_when_its_calls_in_flight_ended() -> None:
    states = fold((RequestStatus.SUCCEEDED, CREATED, CREATED + 1_000), (RequestStatus.IN_FLIGHT, CREATED, CREATED))
    cancelling = lifecycle(states.status(2, CREATED), CREATED, cancelled_ms=CREATED + 2_000)
    assert (cancelling.status, cancelling.cancelling_ms, cancelling.cancelled_ms) == (
        "cancelling", CREATED + 2_000, None)
    states.apply([RequestState("b/1", RequestStatus.SUCCEEDED, "h", batch_id="b", created_ms=CREATED,
                               updated_ms=CREATED + 4_000)])
    cancelled = lifecycle(states.status(2, CREATED), CREATED, cancelled_ms=CREATED + 2_000)
    assert (cancelled.status, cancelled.cancelled_ms, cancelled.completed_ms) == ("cancelled", CREATED + 4_000, None)


def test_a_batch_that_ended_past_its_window_expired_then() -> None:
    states = fold((RequestStatus.SUCCEEDED, CREATED, CREATED + 1_000), (RequestStatus.FAILED, CREATED, CREATED + 7_000))
    expired = lifecycle(states.status(2, CREATED), CREATED, expires_ms=CREATED + 5_000)
    assert (expired.status, expired.expired_ms, expired.completed_ms) == ("expired", CREATED + 7_000, None)
    on_time = lifecycle(states.status(2, CREATED), CREATED, expires_ms=CREATED + 8_000)
    assert (on_time.status, on_time.completed_ms) == ("completed", CREATED + 7_000)


def test_a_forgotten_batch_says_so_and_keeps_how_it_ended() -> None:
    states = fold((RequestStatus.SUCCEEDED, CREATED, CREATED + 1_000), (RequestStatus.FAILED, CREATED, CREATED + 7_000))
    forgotten = lifecycle(states.status(2, CREATED), CREATED, cancelled_ms=CREATED + 2_000,
                          forgotten_ms=CREATED + 90_000).as_json()
    assert {key: forgotten[key] for key in ("status", "cancelled_at", "forgotten_at")} == {
        "status": "forgotten", "cancelled_at": 1_700_000_007, "forgotten_at": 1_700_000_090}
