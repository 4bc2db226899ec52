"""Forgetting finished batches (core.retention): which may go, what their manifest keeps, the retention setting."""

from __future__ import annotations

import pytest

from streamproc.core.batch_status import BatchStatus, StatusFold
from streamproc.core.batch_summary import BatchCounts, LatestState
from streamproc.core.events import RequestState
from streamproc.core.retention import (
    Forgotten,
    Submitted,
    finished_before,
    finished_by_counts,
    forgotten_at,
    parse_retention_ms,
    refusal,
)
from streamproc.core.vocabulary import FailureLayer, RequestStatus


def _status(*ended: RequestStatus, submitted: int = 3) -> BatchStatus:
    fold = StatusFold("b")
    fold.apply(RequestState(f"b/{index}", status, "h", batch_id="b", created_ms=10, updated_ms=100 + index,
                            last_layer=FailureLayer.SERVICE if status is RequestStatus.FAILED else None,
                            model="m" if status is RequestStatus.SUCCEEDED else None, prompt_tokens=10,
                            completion_tokens=3)
               for index, status in enumerate(ended))
    return fold.status(submitted, 5)


def test_only_a_finished_batch_may_be_forgotten_unless_forced() -> None:
    running = _status(RequestStatus.SUCCEEDED, RequestStatus.IN_FLIGHT)
    assert refusal(running, force=False) == ("batch 'b' has not finished (1 of 3 requests ended): only a finished "
                                             "batch is forgotten, unless --force")
    assert refusal(running, force=True) is None
    assert refusal(_status(RequestStatus.SUCCEEDED, RequestStatus.FAILED, RequestStatus.SUCCEEDED), False) is None


def test_finished_before_compares_the_last_end_with_the_cutoff() -> None:
    finished = _status(RequestStatus.SUCCEEDED, RequestStatus.FAILED, RequestStatus.SUCCEEDED)  # last end at 102
    assert finished_before(finished, 103) and not finished_before(finished, 102)
    assert not finished_before(_status(RequestStatus.SUCCEEDED), 10**15)  # not finished: never


def test_a_forgotten_batch_keeps_its_counts_and_reports_them_as_ended() -> None:
    status = _status(RequestStatus.SUCCEEDED, RequestStatus.FAILED, RequestStatus.SUCCEEDED)
    kept = forgotten_at(status, 9_000)
    assert kept == Forgotten(9_000, 102, 2, {"service": 1}, {"m": (20, 6)})
    again = kept.status("b")
    assert (again.submitted, again.succeeded, again.failed, again.converged, again.last_progress_ms, again.usage) == (
        3, 2, {"service": 1}, True, 102, {"m": (20, 6)})


@pytest.mark.parametrize(("text", "ms"), [("30d", 30 * 86_400_000), ("1.5d", 129_600_000), ("12h", 43_200_000),
                                          ("90m", 5_400_000), ("45", 45_000), (" 2d ", 172_800_000)])
def test_retention_in_days_hours_minutes_or_seconds(text: str, ms: int) -> None:
    assert parse_retention_ms(text) == ms


@pytest.mark.parametrize("text", ["", "d", "30 days", "-3d", "3w"])
def test_anything_else_is_no_retention(text: str) -> None:
    assert parse_retention_ms(text) is None


def test_retention_looks_every_tenth_of_it_between_10_s_and_an_hour() -> None:
    from streamproc.core.retention import check_interval_s

    assert [check_interval_s(ms) for ms in (30 * 86_400_000, 5 * 60_000, 20_000, 1_000)] == [3600.0, 30.0, 10.0, 10.0]


def test_results_and_failures_outlive_automatic_retention_by_a_week() -> None:
    from streamproc.core.retention import outcomes_retention_ms

    assert outcomes_retention_ms(None) is None
    assert outcomes_retention_ms(30 * 86_400_000) == 37 * 86_400_000


def _counts(batch_id: str, *ends: tuple[RequestStatus, int]) -> BatchCounts:
    return BatchCounts.of(LatestState.of(RequestState(f"{batch_id}/{index}", status, "h", batch_id=batch_id,
                                                      created_ms=10, updated_ms=updated_ms))
                          for index, (status, updated_ms) in enumerate(ends))


def test_retention_chooses_from_the_summed_counts_the_batches_that_finished_before_the_cutoff() -> None:
    done, late = (RequestStatus.SUCCEEDED, 100), (RequestStatus.FAILED, 900)
    counts = {"old": _counts("old", done, done), "late": _counts("late", done, late),
              "short": _counts("short", done),  # its manifest says 2: one not seen by a worker yet
              "moving": _counts("moving", done, (RequestStatus.RETRYING, 50)),
              "gone": _counts("gone", done),  # a forgotten batch's summary not tombstoned yet
              "foreign": _counts("foreign", done)}  # produced without submit: no manifest
    manifests = {"old": Submitted(2, 5), "late": Submitted(2, 5), "short": Submitted(2, 5),
                 "moving": Submitted(2, 5), "gone": Submitted(1, 5, forgotten=True),
                 "unseen": Submitted(3, 5)}  # submitted, no worker has counted any of it
    due = finished_by_counts(counts, manifests, cutoff_ms=500)
    assert [(status.batch_id, status.submitted, status.last_progress_ms) for status in due] == [
        ("foreign", 1, 100), ("old", 2, 100)]
    assert [status.batch_id for status in finished_by_counts(counts, manifests, cutoff_ms=901)] == [
        "foreign", "late", "old"]
    assert finished_by_counts(counts, manifests, cutoff_ms=100) == []  # ended at 100: not before it
    assert forgotten_at(due[1], 1_000) == Forgotten(1_000, 100, 2)
