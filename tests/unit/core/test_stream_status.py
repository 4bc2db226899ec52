"""The stream view's fold: requests without a batch only, latest state wins, counts per outcome, per-hour rows."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from streamproc.core.batch_summary import BatchCounts, LatestState
from streamproc.core.events import RequestState
from streamproc.core.stream_status import HOUR_MS, MAX_CODES, MAX_HOURS, StreamFold, stream_status
from streamproc.core.vocabulary import FailureLayer, RequestStatus

NOW = 1_790_000_000_000 // HOUR_MS * HOUR_MS + 20 * 60_000  # 20 minutes into an hour
THIS_HOUR = NOW // HOUR_MS * HOUR_MS


def state(request_id: str, status: RequestStatus, created_ms: int = NOW, updated_ms: int = NOW,
          layer: FailureLayer | None = None, code: str | None = None, batch_id: str | None = None) -> RequestState:
    return RequestState(request_id, status, "h", batch_id=batch_id, last_layer=layer, last_error_code=code,
                        created_ms=created_ms, updated_ms=updated_ms)


def test_counts_only_requests_without_a_batch_and_the_latest_state_of_each() -> None:
    fold = StreamFold()
    fold.apply([state("a", RequestStatus.IN_FLIGHT), state("b", RequestStatus.IN_FLIGHT),
                state("c", RequestStatus.IN_FLIGHT), state("d", RequestStatus.PENDING),
                state("x", RequestStatus.SUCCEEDED, batch_id="batch-1")])
    fold.apply([state("a", RequestStatus.SUCCEEDED),
                state("b", RequestStatus.FAILED, layer=FailureLayer.BUSINESS, code="invalid_json_request"),
                state("c", RequestStatus.RETRYING, layer=FailureLayer.SERVICE, code="rate_limited")])
    status = fold.status(NOW, hours=2)
    assert (status.requests, status.succeeded, status.retrying, status.in_flight, status.pending) == (4, 1, 1, 0, 1)
    assert status.failed == {"transport": 0, "service": 0, "semantic": 0, "business": 1}
    assert status.failed_codes == {"invalid_json_request": 1}  # a retrying request has not failed
    assert status.last_ended_ms == NOW
    assert status.requests == (status.succeeded + status.terminal_failures + status.retrying + status.in_flight
                               + status.pending)


def test_each_hour_counts_what_arrived_and_what_ended_in_it_and_older_hours_are_left_out() -> None:
    fold = StreamFold()
    two_hours_ago = THIS_HOUR - 2 * HOUR_MS + 1
    fold.apply([
        state("old", RequestStatus.SUCCEEDED, created_ms=THIS_HOUR - 5 * HOUR_MS, updated_ms=THIS_HOUR - 5 * HOUR_MS),
        state("across", RequestStatus.SUCCEEDED, created_ms=two_hours_ago, updated_ms=THIS_HOUR + 1),
        state("early", RequestStatus.FAILED, created_ms=two_hours_ago, updated_ms=two_hours_ago + 10,
              layer=FailureLayer.SEMANTIC, code="schema_mismatch"),
        state("now", RequestStatus.IN_FLIGHT, created_ms=NOW - 1, updated_ms=NOW - 1),
    ])
    status = fold.status(NOW, hours=3)
    assert [hour.as_json() for hour in status.hours] == [
        {"hour": hour, "start_ms": start, "arrived": arrived, "succeeded": succeeded, "failed": failed}
        for hour, start, arrived, succeeded, failed in (
            (_hour_text(-2), THIS_HOUR - 2 * HOUR_MS, 2, 0, 1),
            (_hour_text(-1), THIS_HOUR - HOUR_MS, 0, 0, 0),
            (_hour_text(0), THIS_HOUR, 1, 1, 0))]
    assert status.requests == 4 and status.succeeded == 2  # the totals keep what is older than the hours shown
    text = status.format()
    assert "last 3h    2 ended, 0.7/h" in text
    assert f"{_hour_text(0)}         1          1       0" in text
    assert "failed     1 (transport 0, service 0, semantic 1, business 0); schema_mismatch 1" in text


def test_the_codes_named_are_the_most_frequent_and_the_rest_are_summed() -> None:
    fold = StreamFold()
    failed = state("", RequestStatus.FAILED, layer=FailureLayer.SERVICE)
    fold.apply(replace(failed, request_id=f"{code}-{i}", last_error_code=f"code-{code:02}")
               for code in range(MAX_CODES + 2) for i in range(code + 1))
    codes = fold.status(NOW, hours=1).failed_codes
    assert len(codes) == MAX_CODES + 1 and codes["other"] == 1 + 2 and codes["code-11"] == 12
    assert "code-00" not in codes and sum(codes.values()) == fold.status(NOW, hours=1).terminal_failures


def test_the_hours_are_bounded() -> None:
    assert len(StreamFold().status(NOW, hours=MAX_HOURS).hours) == MAX_HOURS
    for hours in (0, MAX_HOURS + 1):
        with pytest.raises(ValueError, match="hours must be 1 to"):
            StreamFold().status(NOW, hours=hours)


def test_an_empty_stream_says_nothing_ended() -> None:
    status = StreamFold().status(NOW, hours=1)
    assert status.as_json()["last_ended_ms"] is None and status.requests == 0
    assert "last ended never" in status.format()


def _hour_text(offset: int) -> str:
    return datetime.fromtimestamp((THIS_HOUR + offset * HOUR_MS) / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def test_the_workers_summed_counts_say_what_the_fold_says() -> None:
    """Counted per partition as the workers do (each replaced state's share out, the new one's in), summed over
    the partitions, the stream's status is the fold's."""
    first = [state("a", RequestStatus.IN_FLIGHT, created_ms=NOW - 3 * HOUR_MS),
             state("b", RequestStatus.PENDING), state("c", RequestStatus.IN_FLIGHT, created_ms=NOW - HOUR_MS)]
    then = [state("a", RequestStatus.SUCCEEDED, created_ms=NOW - 3 * HOUR_MS, updated_ms=NOW - 2 * HOUR_MS),
            state("c", RequestStatus.FAILED, created_ms=NOW - HOUR_MS, layer=FailureLayer.SEMANTIC, code="schema")]
    fold = StreamFold()
    fold.apply(first + then)
    partitions = {"a": BatchCounts(), "b": BatchCounts(), "c": BatchCounts()}  # one partition per request here
    for before in first:
        partitions[before.request_id].add(LatestState.of(before))
    for after in then:
        replaced = next(s for s in first if s.request_id == after.request_id)
        partitions[after.request_id].add(LatestState.of(replaced), -1)
        partitions[after.request_id].add(LatestState.of(after))
    summed = BatchCounts()
    for counts in partitions.values():
        summed.merge(counts)
    assert stream_status(summed, NOW, 4) == fold.status(NOW, 4)
    assert [hour.arrived for hour in fold.status(NOW, 4).hours] == [1, 0, 1, 1]
