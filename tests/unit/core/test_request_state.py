"""The per-request state machine: dedupe, crash redelivery, retries, replays and conflicts (design §4)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from streamproc.core.events import InferenceRequest, RepairContext, RequestState
from streamproc.core.outcome import Success
from streamproc.core.request_state import (
    Admission,
    Conflict,
    RecordRef,
    Skip,
    SkipReason,
    Start,
    admit,
    input_hash,
    on_retry_scheduled,
    on_success,
    on_terminal_failure,
    redelivers,
)
from streamproc.core.vocabulary import FailureLayer, RequestStatus

BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Label: Buy now!!!"}], "temperature": 0}
REQUEST = InferenceRequest("req-1", json.dumps(BODY), batch_id="batch-1")
OTHER_BODY = InferenceRequest("req-1", json.dumps({**BODY, "temperature": 1}), batch_id="batch-1")
SUBMITTED = RecordRef("llm.requests", 100)
RESUBMITTED = RecordRef("llm.requests", 250)
RETRY_2 = RecordRef("llm.retry.5s", 7)
REPLAYED = RecordRef("llm.requests", 900)

IN_FLIGHT, RETRYING, SUCCEEDED, FAILED, PENDING = (
    RequestStatus.IN_FLIGHT,
    RequestStatus.RETRYING,
    RequestStatus.SUCCEEDED,
    RequestStatus.FAILED,
    RequestStatus.PENDING,
)


def started(admission: Admission) -> RequestState:
    assert isinstance(admission, Start), admission
    return admission.state


def state(status: RequestStatus, attempts: int = 1, source: RecordRef = SUBMITTED) -> RequestState:
    """A table entry; only an entry in flight names the record that started it."""
    running = status is IN_FLIGHT
    return RequestState(
        request_id="req-1",
        status=status,
        input_hash=input_hash(REQUEST),
        attempts=attempts,
        batch_id="batch-1",
        created_ms=1_000,
        updated_ms=2_000,
        source_topic=source.topic if running else None,
        source_offset=source.offset if running else None,
    )


# --- input hash ------------------------------------------------------------------------------------------


def test_input_hash_ignores_key_order_and_spacing() -> None:
    reordered = InferenceRequest("x", json.dumps(dict(reversed(list(BODY.items()))), indent=4))
    assert input_hash(reordered) == input_hash(REQUEST)


def test_input_hash_is_32_hex_chars_and_stable() -> None:
    digest = input_hash(REQUEST)
    assert len(digest) == 32
    assert int(digest, 16) >= 0
    assert digest == input_hash(InferenceRequest("req-1", json.dumps(BODY)))


def test_input_hash_changes_with_the_body_or_the_url() -> None:
    assert input_hash(OTHER_BODY) != input_hash(REQUEST)
    assert input_hash(replace(REQUEST, url="/v1/completions")) != input_hash(REQUEST)


def test_input_hash_ignores_what_is_not_the_input() -> None:
    repaired = replace(REQUEST, repair=RepairContext(bad_output="bad", reason="invalid_json"))
    annotated = replace(REQUEST, batch_id="other", metadata={"k": "v"}, submitted_ms=5)
    assert input_hash(repaired) == input_hash(annotated) == input_hash(REQUEST)


def test_input_hash_of_a_body_that_is_not_json() -> None:
    broken = InferenceRequest("x", "{not json")
    assert input_hash(broken) != input_hash(InferenceRequest("x", "{not json!"))


# --- admission -------------------------------------------------------------------------------------------


def test_first_sight_starts() -> None:
    new = started(admit(None, REQUEST, 1, 5_000, source=SUBMITTED))
    assert new == RequestState(
        request_id="req-1",
        status=IN_FLIGHT,
        input_hash=input_hash(REQUEST),
        attempts=1,
        batch_id="batch-1",
        created_ms=5_000,
        updated_ms=5_000,
        source_topic="llm.requests",
        source_offset=100,
        run=1,
    )


def test_a_retry_record_with_no_state_still_starts() -> None:
    # The table lost the id (wiped, restored from an old changelog): losing the request is worse.
    assert started(admit(None, REQUEST, 3, 5_000, source=RETRY_2)).attempts == 3


@pytest.mark.parametrize(
    ("current", "attempt", "source", "replay", "expected"),
    [
        # succeeded: never called again
        pytest.param(SUCCEEDED, 1, RESUBMITTED, False, SkipReason.ALREADY_SUCCEEDED, id="succeeded+resubmission"),
        pytest.param(SUCCEEDED, 2, RETRY_2, False, SkipReason.ALREADY_SUCCEEDED, id="succeeded+stale-retry"),
        pytest.param(SUCCEEDED, 1, REPLAYED, True, SkipReason.ALREADY_SUCCEEDED, id="succeeded+replay"),
        pytest.param(SUCCEEDED, 1, SUBMITTED, False, SkipReason.ALREADY_SUCCEEDED, id="succeeded+redelivery"),
        # in flight: not started twice
        pytest.param(IN_FLIGHT, 1, RESUBMITTED, False, SkipReason.IN_FLIGHT, id="in-flight+duplicate"),
        pytest.param(IN_FLIGHT, 1, REPLAYED, True, SkipReason.IN_FLIGHT, id="in-flight+replay"),
        # retrying: only the retry record itself starts
        pytest.param(RETRYING, 1, RESUBMITTED, False, SkipReason.RETRYING, id="retrying+resubmission"),
        pytest.param(RETRYING, 1, SUBMITTED, False, SkipReason.RETRYING, id="retrying+redelivered-original"),
        pytest.param(RETRYING, 1, REPLAYED, True, SkipReason.RETRYING, id="retrying+replay"),
        # failed: only a replay restarts it
        pytest.param(FAILED, 1, RESUBMITTED, False, SkipReason.ALREADY_FAILED, id="failed+resubmission"),
        pytest.param(FAILED, 2, RETRY_2, False, SkipReason.ALREADY_FAILED, id="failed+stale-retry"),
    ],
)
def test_skips(current: RequestStatus, attempt: int, source: RecordRef, replay: bool, expected: SkipReason) -> None:
    assert admit(state(current), REQUEST, attempt, 9_000, source=source, replay=replay) == Skip(expected)


def test_crash_redelivery_of_the_record_in_flight_starts_again() -> None:
    current = state(IN_FLIGHT, attempts=1, source=SUBMITTED)
    again = started(admit(current, REQUEST, 1, 9_000, source=SUBMITTED))
    assert (again.status, again.attempts, again.updated_ms, again.created_ms) == (IN_FLIGHT, 1, 9_000, 1_000)
    assert (again.source_topic, again.source_offset) == ("llm.requests", 100)


def test_crash_redelivery_of_a_retry_record_starts_again() -> None:
    current = state(IN_FLIGHT, attempts=2, source=RETRY_2)
    assert started(admit(current, REQUEST, 2, 9_000, source=RETRY_2)).attempts == 2


def test_same_offset_on_another_topic_is_not_a_redelivery() -> None:
    current = state(IN_FLIGHT, attempts=2, source=SUBMITTED)
    other_topic = RecordRef("llm.retry.5s", SUBMITTED.offset)
    assert admit(current, REQUEST, 2, 9_000, source=other_topic) == Skip(SkipReason.IN_FLIGHT)


def test_only_the_record_that_started_the_attempt_in_flight_redelivers_it() -> None:
    in_flight = state(IN_FLIGHT, attempts=1, source=SUBMITTED)
    assert redelivers(in_flight, SUBMITTED)
    assert not redelivers(in_flight, RecordRef("llm.backlog", SUBMITTED.offset))  # its parked copy, say
    assert not redelivers(in_flight, RESUBMITTED)
    assert not redelivers(state(RETRYING, attempts=1, source=SUBMITTED), SUBMITTED)
    assert not redelivers(None, SUBMITTED)


def test_a_retry_record_newer_than_a_stale_in_flight_state_starts() -> None:
    # After a SIGKILL the table can come back older than the committed offsets: it still says attempt 1 is
    # in flight although attempt 1 ended and wrote the attempt-2 retry record. Skipping would lose the request.
    current = state(IN_FLIGHT, attempts=1, source=SUBMITTED)
    new = started(admit(current, REQUEST, 2, 9_000, source=RETRY_2))
    assert (new.status, new.attempts, new.source_topic, new.source_offset) == (IN_FLIGHT, 2, "llm.retry.5s", 7)


def test_a_copy_of_the_retry_record_in_flight_is_skipped() -> None:
    current = state(IN_FLIGHT, attempts=2, source=RETRY_2)
    copy = RecordRef(RETRY_2.topic, RETRY_2.offset + 1)
    assert admit(current, REQUEST, 2, 9_000, source=copy) == Skip(SkipReason.IN_FLIGHT)


def test_retry_record_starts_the_next_attempt() -> None:
    current = state(RETRYING, attempts=1)
    new = started(admit(current, REQUEST, 2, 9_000, source=RETRY_2))
    assert (new.status, new.attempts, new.source_topic, new.source_offset) == (IN_FLIGHT, 2, "llm.retry.5s", 7)
    assert new.created_ms == 1_000


def test_a_stale_copy_of_a_retry_record_is_skipped() -> None:
    # Attempt 2 already ran and failed again; a second copy of the attempt-2 record must not run.
    current = state(RETRYING, attempts=2)
    assert admit(current, REQUEST, 2, 9_000, source=RecordRef("llm.retry.5s", 8)) == Skip(SkipReason.RETRYING)


def test_replay_of_a_failed_request_starts() -> None:
    current = replace(state(FAILED, attempts=3), last_layer=FailureLayer.SEMANTIC, last_error_code="invalid_json")
    new = started(admit(current, REQUEST, 1, 9_000, source=REPLAYED, replay=True))
    assert (new.status, new.attempts, new.created_ms) == (IN_FLIGHT, 1, 1_000)
    assert (new.last_layer, new.last_error_code) == (FailureLayer.SEMANTIC, "invalid_json")  # history kept


def test_a_replay_record_read_again_after_its_run_failed_does_not_start_another_run() -> None:
    replayed = started(admit(replace(state(FAILED), run=1), REQUEST, 1, 9_000, source=REPLAYED, replay=True))
    assert (replayed.run, replayed.replay_topic, replayed.replay_offset) == (2, "llm.requests", 900)
    failed_again = on_terminal_failure(replayed, FailureLayer.BUSINESS, "content_filter", 9_500)
    for older_or_same in (REPLAYED, RecordRef("llm.requests", 899)):  # a rebalance reads it again
        assert admit(failed_again, REQUEST, 1, 9_600, source=older_or_same, replay=True) == Skip(
            SkipReason.ALREADY_REPLAYED)
    run_3 = started(admit(failed_again, REQUEST, 1, 9_700, source=RecordRef("llm.requests", 901), replay=True))
    assert (run_3.run, run_3.replay_offset) == (3, 901)  # a newer replay is a new decision
    assert started(admit(run_3, REQUEST, 1, 9_800, source=RecordRef("llm.requests", 901), replay=True)) == replace(
        run_3, updated_ms=9_800)  # its crash redelivery still runs it again (rule 2)


def test_replay_with_a_fixed_body_starts_and_takes_the_new_hash() -> None:
    new = started(admit(state(FAILED), OTHER_BODY, 1, 9_000, source=REPLAYED, replay=True))
    assert new.input_hash == input_hash(OTHER_BODY) != input_hash(REQUEST)


def test_replay_never_conflicts() -> None:
    for status in (SUCCEEDED, IN_FLIGHT, RETRYING):
        admission = admit(state(status, source=SUBMITTED), OTHER_BODY, 1, 9_000, source=REPLAYED, replay=True)
        assert isinstance(admission, Skip), status


@pytest.mark.parametrize("status", [SUCCEEDED, IN_FLIGHT, RETRYING, FAILED, PENDING])
def test_same_id_with_another_body_is_a_conflict(status: RequestStatus) -> None:
    admission = admit(state(status), OTHER_BODY, 1, 9_000, source=RESUBMITTED)
    assert isinstance(admission, Conflict)
    failure = admission.failure
    assert (failure.layer, failure.code) == (FailureLayer.BUSINESS, "conflicting_duplicate")
    assert "req-1" in failure.message
    assert input_hash(REQUEST) in failure.message


def test_pending_starts_and_keeps_its_creation_time() -> None:
    new = started(admit(state(PENDING, attempts=0), REQUEST, 1, 9_000, source=SUBMITTED))
    assert (new.status, new.attempts, new.created_ms, new.updated_ms) == (IN_FLIGHT, 1, 1_000, 9_000)


def test_a_replay_of_another_body_never_takes_a_reserved_id_but_the_reserved_body_starts() -> None:
    """``pending`` is a reservation (core.reservation): the record that owns the id waits parked."""
    reserved = state(PENDING, attempts=0)
    assert admit(reserved, OTHER_BODY, 1, 9_000, source=REPLAYED, replay=True) == Skip(SkipReason.RESERVED)
    assert started(admit(reserved, REQUEST, 1, 9_000, source=REPLAYED, replay=True)).status is IN_FLIGHT


def test_attempt_numbers_start_at_one() -> None:
    with pytest.raises(ValueError):
        admit(None, REQUEST, 0, 1, source=SUBMITTED)


# --- transitions -----------------------------------------------------------------------------------------


def test_transitions() -> None:
    running = state(IN_FLIGHT, attempts=2, source=RETRY_2)
    assert on_success(running, 10) == replace(
        running, status=SUCCEEDED, updated_ms=10, source_topic=None, source_offset=None
    )
    retrying = on_retry_scheduled(running, FailureLayer.SERVICE, "rate_limit_exceeded", 11)
    assert (retrying.status, retrying.last_layer, retrying.last_error_code, retrying.updated_ms) == (
        RETRYING,
        FailureLayer.SERVICE,
        "rate_limit_exceeded",
        11,
    )
    failed = on_terminal_failure(running, FailureLayer.BUSINESS, "context_length_exceeded", 12)
    assert (failed.status, failed.last_layer, failed.last_error_code) == (
        FAILED,
        FailureLayer.BUSINESS,
        "context_length_exceeded",
    )
    for after in (retrying, failed):
        assert (after.source_topic, after.source_offset, after.attempts) == (None, None, 2)
    assert (failed.model, failed.prompt_tokens, failed.completion_tokens) == (None, 0, 0)


def test_a_terminal_failure_after_a_paid_answer_keeps_its_model_and_usage() -> None:
    running = state(IN_FLIGHT)
    failed = on_terminal_failure(running, FailureLayer.BUSINESS, "response_too_large", 12,
                                 Success("...", "mock-small", 12, 524_288))
    assert (failed.status, failed.last_error_code, failed.model, failed.prompt_tokens, failed.completion_tokens) == (
        FAILED, "response_too_large", "mock-small", 12, 524_288)


# --- whole histories -------------------------------------------------------------------------------------


def test_sigkill_mid_call_loses_nothing_and_duplicates_are_called_once() -> None:
    table = started(admit(None, REQUEST, 1, 1, source=SUBMITTED))
    # SIGKILL during the call: offset 100 was never committed, so it comes again, then the duplicate at 250.
    table = started(admit(table, REQUEST, 1, 2, source=SUBMITTED))
    assert admit(table, REQUEST, 1, 3, source=RESUBMITTED) == Skip(SkipReason.IN_FLIGHT)
    table = on_success(table, 4)
    # Killed again after the result and the state were written but before the commit: no second call.
    assert admit(table, REQUEST, 1, 5, source=SUBMITTED) == Skip(SkipReason.ALREADY_SUCCEEDED)
    assert admit(table, REQUEST, 1, 6, source=RESUBMITTED) == Skip(SkipReason.ALREADY_SUCCEEDED)


def test_retries_then_terminal_then_replay() -> None:
    table = started(admit(None, REQUEST, 1, 1, source=SUBMITTED))
    table = on_retry_scheduled(table, FailureLayer.SERVICE, "rate_limit_exceeded", 2)
    assert admit(table, REQUEST, 1, 3, source=RESUBMITTED) == Skip(SkipReason.RETRYING)
    table = started(admit(table, REQUEST, 2, 4, source=RETRY_2))
    table = on_retry_scheduled(table, FailureLayer.SEMANTIC, "invalid_json", 5)
    table = started(admit(table, REQUEST, 3, 6, source=RecordRef("llm.retry.5s", 19)))
    table = on_terminal_failure(table, FailureLayer.SEMANTIC, "invalid_json", 7)
    assert admit(table, REQUEST, 1, 8, source=RESUBMITTED) == Skip(SkipReason.ALREADY_FAILED)
    table = started(admit(table, REQUEST, 1, 9, source=REPLAYED, replay=True))
    table = on_success(table, 10)
    assert admit(table, REQUEST, 1, 11, source=RecordRef("llm.requests", 901), replay=True) == Skip(
        SkipReason.ALREADY_SUCCEEDED
    )
    assert (table.status, table.created_ms, table.updated_ms) == (SUCCEEDED, 1, 10)
