"""A batch that stopped moving says how many of its requests wait and why, from its states and its group."""

from __future__ import annotations

from streamproc.core.batch_stall import GroupView, diagnose, needs_group
from streamproc.core.batch_status import StatusFold
from streamproc.core.events import RequestState
from streamproc.core.vocabulary import RequestStatus

MINUTE = 60_000
WORKING = GroupView("g", members=1, lag=5)


def state(request_id: str, status: RequestStatus, *, code: str | None = None, updated_ms: int = 0) -> RequestState:
    return RequestState(request_id, status, "h", batch_id="b", last_error_code=code, created_ms=0,
                        updated_ms=updated_ms)


def fold(*states: RequestState) -> StatusFold:
    folded = StatusFold("b")
    folded.apply(states)
    return folded


def test_progress_is_the_last_end_or_the_start() -> None:
    assert fold().status(3, started_ms=1_000).last_progress_ms == 1_000
    moving = fold(state("1", RequestStatus.SUCCEEDED, updated_ms=9_000), state("2", RequestStatus.RETRYING,
                                                                             updated_ms=20_000))
    assert moving.status(3, started_ms=1_000).last_progress_ms == 9_000  # a retry is no progress


def test_a_moving_or_ended_batch_is_not_stalled() -> None:
    status = fold(state("1", RequestStatus.SUCCEEDED, updated_ms=MINUTE)).status(2)
    assert diagnose(status, 2 * MINUTE, 2 * MINUTE, WORKING) is None
    assert not needs_group(status, 2 * MINUTE, 2 * MINUTE)
    done = fold(state("1", RequestStatus.SUCCEEDED)).status(1)
    assert diagnose(done, 60 * MINUTE, MINUTE, WORKING) is None


def test_no_member_in_the_group_explains_every_waiting_request() -> None:
    status = fold(state("1", RequestStatus.SUCCEEDED), state("2", RequestStatus.RETRYING)).status(5)
    stall = diagnose(status, 3 * MINUTE, 2 * MINUTE, GroupView("g", members=0, lag=None))
    assert stall is not None and stall.reasons == {"no_worker": 4} and stall.waiting == 4
    assert "no worker consuming (the consumer group 'g' has no member" in stall.describe()
    assert stall.as_json() == {"since_ms": 0, "idle_s": 180.0, "waiting": 4, "reasons": {"no_worker": 4},
                               "group": "g", "group_members": 0, "input_lag": None}


def test_parked_retrying_in_flight_and_queued_requests_are_told_apart() -> None:
    status = fold(state("1", RequestStatus.RETRYING, code="circuit_open"),
                  state("2", RequestStatus.RETRYING, code="model_paused"),
                  state("3", RequestStatus.RETRYING, code="model_paused"),
                  state("4", RequestStatus.RETRYING, code="rate_limit_exceeded"),
                  state("5", RequestStatus.IN_FLIGHT)).status(7)
    assert status.parked == {"circuit_open": 1, "model_paused": 2}
    stall = diagnose(status, 3 * MINUTE, 2 * MINUTE, WORKING)
    assert stall is not None
    assert stall.reasons == {"circuit_open": 1, "model_paused": 2, "queued": 2, "retry_wait": 1, "in_flight": 1}
    text = stall.describe()
    assert text.startswith("batch b: no request ended for 3m00s; 7 waiting: ")
    assert "1 waiting on an open circuit breaker" in text and "2 waiting on a paused model" in text
    assert "2 queued, not read yet (5 records wait on the input topics of 'g')" in text


def test_pending_requests_with_nothing_left_to_read_were_skipped_as_duplicates() -> None:
    status = fold(state("1", RequestStatus.SUCCEEDED)).status(4)
    stall = diagnose(status, 3 * MINUTE, 2 * MINUTE, GroupView("g", members=2, lag=0))
    assert stall is not None and stall.reasons == {"duplicate": 3}
    assert "3 skipped as duplicates" in stall.describe()


def test_without_the_group_the_state_still_explains_what_it_can() -> None:
    status = fold(state("1", RequestStatus.RETRYING, code="circuit_open")).status(2)
    stall = diagnose(status, 3 * MINUTE, 2 * MINUTE, None)
    assert stall is not None and stall.reasons == {"circuit_open": 1, "queued": 1}
    assert stall.as_json()["group"] is None
