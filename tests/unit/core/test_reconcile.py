"""Stranded requests: a waiting or running state whose record was already handled is re-driven, once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from streamproc.core import headers
from streamproc.core.events import RequestState
from streamproc.core.reconcile import Committed, Redrive, StrandedBy, redrive_headers, stranded
from streamproc.core.request_state import RecordRef, on_deferred, on_retry_scheduled
from streamproc.core.vocabulary import FailureLayer, RequestStatus

GRACE = 60_000
NOW = 1_000_000
IN_FLIGHT = RequestState("r1", RequestStatus.IN_FLIGHT, "h", attempts=2, updated_ms=NOW - GRACE,
                         source_topic="llm.retry.5s", source_offset=40)
RETRYING = on_retry_scheduled(IN_FLIGHT, FailureLayer.SERVICE, "server_error", NOW - GRACE,
                              RecordRef("llm.retry.30s", 7))


def committed(offsets: dict[str, int]) -> Committed:
    return lambda topic: offsets.get(topic)


def test_a_retrying_request_whose_retry_record_was_handled_is_stranded_and_gets_that_record_again() -> None:
    assert stranded(RETRYING, committed({"llm.retry.30s": 8}), NOW, GRACE) == Redrive(
        "r1", RecordRef("llm.retry.30s", 7), StrandedBy.WAITING_RECORD_CONSUMED, None)


@pytest.mark.parametrize("offset", [None, 5, 7])
def test_a_retry_record_not_yet_handled_will_still_move_the_request(offset: int | None) -> None:
    offsets = {} if offset is None else {"llm.retry.30s": offset}
    assert stranded(RETRYING, committed(offsets), NOW, GRACE) is None


def test_a_deferred_record_is_remembered_like_a_retry_record() -> None:
    parked = on_deferred(IN_FLIGHT, NOW - GRACE, next_record=RecordRef("llm.retry.5s", 90))
    assert parked.next_topic == "llm.retry.5s" and parked.next_offset == 90
    assert stranded(parked, committed({"llm.retry.5s": 91}), NOW, GRACE) is not None


def test_an_attempt_whose_record_was_handled_but_whose_state_stayed_in_flight_is_redriven_as_the_next() -> None:
    redrive = stranded(IN_FLIGHT, committed({"llm.retry.5s": 41}), NOW, GRACE)
    assert redrive == Redrive("r1", RecordRef("llm.retry.5s", 40), StrandedBy.ATTEMPT_OUTCOME_LOST, 3)


def test_an_attempt_still_running_or_redelivered_is_left_alone() -> None:
    assert stranded(IN_FLIGHT, committed({"llm.retry.5s": 40}), NOW, GRACE) is None
    assert stranded(IN_FLIGHT, committed({}), NOW, GRACE) is None


def test_nothing_is_redriven_within_the_grace_period() -> None:
    fresh = replace(RETRYING, updated_ms=NOW - GRACE + 1)
    assert stranded(fresh, committed({"llm.retry.30s": 100}), NOW, GRACE) is None


@pytest.mark.parametrize("status", [RequestStatus.SUCCEEDED, RequestStatus.FAILED])
def test_finished_requests_are_never_redriven(status: RequestStatus) -> None:
    done = replace(RETRYING, status=status)
    assert stranded(done, committed({"llm.retry.30s": 100, "llm.retry.5s": 100}), NOW, GRACE) is None


def test_a_reservation_is_redriven_only_through_the_parked_copy_it_names() -> None:
    """A ``pending`` state reserves the id of a request parked before admission (core.reservation): it names no
    attempt (never a stale in flight), only the backlog copy that continues it."""
    reserved = RequestState("r1", RequestStatus.PENDING, "h", updated_ms=NOW - GRACE)
    assert stranded(reserved, committed({"llm.retry.5s": 100, "llm.requests": 100}), NOW, GRACE) is None
    parked = replace(reserved, next_topic="llm.backlog", next_offset=4)
    assert stranded(parked, committed({"llm.backlog": 5}), NOW, GRACE) == Redrive(
        "r1", RecordRef("llm.backlog", 4), StrandedBy.WAITING_RECORD_CONSUMED, None)


def test_a_state_from_before_next_records_were_remembered_is_left_alone() -> None:
    old = replace(RETRYING, next_topic=None, next_offset=None)
    assert stranded(old, committed({"llm.retry.30s": 100}), NOW, GRACE) is None


def test_the_copy_of_a_waiting_record_keeps_its_attempt_and_marks_but_is_due_now() -> None:
    original = {headers.ATTEMPT: b"3", headers.DUE_TS: b"99", headers.DEFERRED: b"1", headers.ORIG_TOPIC: b"req",
                headers.ORIG_PARTITION: b"2", headers.ORIG_OFFSET: b"5"}
    redrive = Redrive("r1", RecordRef("llm.retry.5s", 7), StrandedBy.WAITING_RECORD_CONSUMED, None)
    copy = redrive_headers(original, redrive, 2)
    assert copy == {**{k: v for k, v in original.items() if k != headers.DUE_TS},
                    headers.REDRIVEN: b"waiting_record_consumed"}


def test_the_copy_continues_the_state_s_run_even_when_the_original_is_a_replay_without_one() -> None:
    redrive = Redrive("r1", RecordRef("llm.requests", 12), StrandedBy.ATTEMPT_OUTCOME_LOST, 2, run=3)
    assert headers.read_hop(redrive_headers({headers.REPLAY: b"1"}, redrive, 4)).run == 3
    assert stranded(replace(RETRYING, run=3), committed({"llm.retry.30s": 100}), NOW, GRACE) == Redrive(
        RETRYING.request_id, RecordRef("llm.retry.30s", 7), StrandedBy.WAITING_RECORD_CONSUMED, None, 3)


def test_the_copy_of_a_lost_first_attempt_is_the_second_attempt_with_its_origin() -> None:
    redrive = Redrive("r1", RecordRef("llm.requests", 12), StrandedBy.ATTEMPT_OUTCOME_LOST, 2)
    copy = redrive_headers({headers.REPLAY: b"1"}, redrive, 4)
    hop = headers.read_hop(copy)
    assert (hop.attempt, hop.replay, hop.deferred, hop.due_ms) == (2, False, False, None)
    assert hop.origin == headers.Origin("llm.requests", 4, 12)
