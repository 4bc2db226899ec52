"""When an open provider batch is polled again, and what each member of an ended batch comes to (issue 31)."""

from __future__ import annotations

import pytest

from streamproc.core.outcome import Failure
from streamproc.core.provider_batch_objects import BatchPhase, ProviderBatchView
from streamproc.core.provider_batch_polling import (
    BATCH_FAILED,
    LINE_MISSING,
    PollPolicy,
    after_answer,
    after_failure,
    first_poll,
    missing_outcomes,
)
from streamproc.core.vocabulary import FailureLayer

POLICY = PollPolicy(first_s=5, max_s=40, factor=2)


def view(phase: BatchPhase, finished: int, errors: tuple[str, ...] = ()) -> ProviderBatchView:
    return ProviderBatchView("openai", "batch_1", phase, 10, finished, errors=errors)


def test_polls_back_off_while_nothing_changes_up_to_the_ceiling() -> None:
    state = after_answer(POLICY, first_poll(POLICY), view(BatchPhase.VALIDATING, 0))
    delays = [state.delay_s]
    for _ in range(5):
        state = after_answer(POLICY, state, view(BatchPhase.VALIDATING, 0))
        delays.append(state.delay_s)
    assert delays == [5, 10, 20, 40, 40, 40]


def test_progress_or_a_new_phase_brings_the_next_poll_back_to_the_first_delay() -> None:
    state = first_poll(POLICY)
    for _ in range(4):
        state = after_answer(POLICY, state, view(BatchPhase.IN_PROGRESS, 2))
    assert state.delay_s == 40
    assert after_answer(POLICY, state, view(BatchPhase.IN_PROGRESS, 3)).delay_s == 5
    assert after_answer(POLICY, state, view(BatchPhase.FINALIZING, 2)).delay_s == 5


def test_a_failed_poll_backs_off_and_honours_retry_after() -> None:
    state = after_answer(POLICY, first_poll(POLICY), view(BatchPhase.IN_PROGRESS, 2))
    failed = after_failure(POLICY, state)
    assert failed.delay_s == 10 and failed.seen == state.seen  # what was seen stays: no progress is invented
    assert after_failure(POLICY, state, retry_after_ms=90_000).delay_s == 90
    assert after_failure(POLICY, state, retry_after_ms=1_000).delay_s == 10


@pytest.mark.parametrize(("first_s", "max_s", "factor"), [(0, 10, 2), (20, 10, 2), (5, 10, 0.5)])
def test_a_policy_that_cannot_poll_is_refused(first_s: float, max_s: float, factor: float) -> None:
    with pytest.raises(ValueError, match="poll policy"):
        PollPolicy(first_s, max_s, factor)


def test_members_no_line_named_are_service_failures_in_their_order() -> None:
    outcomes = missing_outcomes(view(BatchPhase.COMPLETED, 10), ["a", "b", "c", "d"], {"b", "d"})
    assert [o.custom_id for o in outcomes] == ["a", "c"]
    for outcome in outcomes:
        assert isinstance(outcome.verdict, Failure)
        assert (outcome.verdict.layer, outcome.verdict.code) == (FailureLayer.SERVICE, LINE_MISSING)
        assert "batch_1" in outcome.verdict.message and "completed" in outcome.verdict.message


def test_every_member_of_a_batch_that_failed_validation_carries_its_errors() -> None:
    failed = view(BatchPhase.FAILED, 0, errors=("invalid_json_line: Line 2 is not JSON.",))
    outcomes = missing_outcomes(failed, ["a", "b"], set())
    assert [o.custom_id for o in outcomes] == ["a", "b"]
    verdict = outcomes[0].verdict
    assert isinstance(verdict, Failure) and verdict.code == BATCH_FAILED and "Line 2 is not JSON" in verdict.message
