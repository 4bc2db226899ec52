"""``submit --deadline``: whether a routed model's request goes into a provider batch or by a synchronous call."""

from __future__ import annotations

import pytest

from streamproc.core.provider_batch_deadline import Way, deadline_problem, past_deadline, way_of


@pytest.mark.parametrize(("deadline_ms", "now_ms", "past"), [(None, 10**13, False), (1_000, 999, False),
                                                              (1_000, 1_000, True), (1_000, 5_000, True)])
def test_the_deadline_passes_at_its_time_and_no_deadline_never_does(deadline_ms: int | None, now_ms: int,
                                                                     past: bool) -> None:
    assert past_deadline(deadline_ms, now_ms) is past


@pytest.mark.parametrize(("routed", "past", "held", "way"), [
    (True, False, False, Way.PROVIDER_BATCH),  # before the deadline: gathered (a first attempt or a retried line)
    (True, True, False, Way.CALL),  # after it: called, whether a first attempt or a retried line
    (True, True, True, Way.PROVIDER_BATCH),  # already in an open provider batch: it waits for its line
    (True, False, True, Way.PROVIDER_BATCH),
    (False, False, False, Way.CALL),  # a model not routed is always called
    (False, True, False, Way.CALL),
])
def test_a_routed_request_is_called_past_its_deadline_unless_a_provider_batch_holds_it(
        routed: bool, past: bool, held: bool, way: Way) -> None:
    assert way_of(routed, past, held) is way


def test_a_deadline_must_end_before_the_completion_window() -> None:
    assert deadline_problem(3_600, None) is None
    assert deadline_problem(3_599, 3_600) is None
    for deadline in (3_600, 7_200):
        problem = deadline_problem(deadline, 3_600)
        assert problem is not None and "shorter than the completion window" in problem
