"""Batch counts kept per partition, moved state by state and summed, say what the changelog fold says."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.batch_status import StatusFold, counted_status
from streamproc.core.batch_summary import BatchCounts, LatestState, SummaryKey, SummaryView
from streamproc.core.events import RequestState
from streamproc.core.request_state import CIRCUIT_OPEN
from streamproc.core.spend_cap import spend_of
from streamproc.core.vocabulary import FailureLayer, RequestStatus

ENDED = (RequestStatus.SUCCEEDED, RequestStatus.FAILED)
PARTITIONS = 3


@dataclass(frozen=True)
class Write:
    request: int
    status: RequestStatus
    layer: FailureLayer | None
    code: str | None
    model: str | None
    tokens: int
    reused: bool
    provider_batch: bool = False


writes = st.lists(st.builds(
    Write, request=st.integers(0, 11), status=st.sampled_from(RequestStatus),
    layer=st.sampled_from([None, *FailureLayer]), code=st.sampled_from([None, CIRCUIT_OPEN, "rate_limited"]),
    model=st.sampled_from([None, "m1", "m2"]), tokens=st.integers(0, 50), reused=st.booleans(),
    provider_batch=st.booleans()), max_size=60)


def batch_of(request: int) -> str:
    return "a" if request < 7 else "b"


def states_of(history: list[Write]) -> list[RequestState]:
    """The writes as states in log order; an ended request is only written ended again (a record read twice)."""
    states, ended = [], set()
    for index, write in enumerate(history, 1):
        status = write.status
        if write.request in ended and status not in ENDED:
            status = RequestStatus.SUCCEEDED
        if status in ENDED:
            ended.add(write.request)
        states.append(RequestState(
            f"{batch_of(write.request)}/{write.request}", status, "h", batch_id=batch_of(write.request),
            last_layer=write.layer, last_error_code=write.code, created_ms=1000 + write.request,
            updated_ms=2000 + index,
            model=write.model, prompt_tokens=write.tokens, completion_tokens=2 * write.tokens, reused=write.reused,
            provider_batch=write.provider_batch))
    return states


@given(writes, st.integers(0, 15))
def test_the_summed_summaries_equal_the_fold_of_every_state(history: list[Write], submitted: int) -> None:
    states = states_of(history)
    latest: dict[str, RequestState] = {}
    kept: dict[SummaryKey, BatchCounts] = {}  # what each partition's owner keeps, moved write by write
    for state in states:
        assert state.batch_id is not None
        counts = kept.setdefault(SummaryKey(state.batch_id, int(state.request_id.split("/")[1]) % PARTITIONS),
                                 BatchCounts())
        if state.request_id in latest:
            counts.add(LatestState.of(latest[state.request_id]), -1)
        counts.add(LatestState.of(state))
        latest[state.request_id] = state
    view = SummaryView()
    for key, counts in kept.items():  # each partition's latest summary, as a reader gets them
        view.put(key, counts, at_ms=5)
    for batch_id in ("a", "b"):
        fold = StatusFold(batch_id)
        fold.apply(states)
        for started_ms in (0, 1500):
            assert (counted_status(batch_id, view.batch(batch_id)[0], submitted, started_ms)
                    == fold.status(submitted, started_ms))
        assert view.batches().get(batch_id, (BatchCounts(), 0))[0] == view.batch(batch_id)[0]


def test_a_tombstone_takes_a_partitions_counts_out_and_the_newest_time_is_said() -> None:
    one = BatchCounts.of([LatestState.of(RequestState("a/1", RequestStatus.SUCCEEDED, "h", batch_id="a",
                                                      created_ms=10, updated_ms=20))])
    two = BatchCounts.of([LatestState.of(RequestState("a/2", RequestStatus.IN_FLIGHT, "h", batch_id="a",
                                                      created_ms=5, updated_ms=6))])
    view = SummaryView()
    view.put(SummaryKey("a", 0), one, at_ms=100)
    view.put(SummaryKey("a", 1), two, at_ms=300)
    counts, at_ms = view.batch("a")
    status = counted_status("a", counts, submitted=3)
    assert (status.succeeded, status.in_flight, status.pending, at_ms) == (1, 1, 1, 300)
    assert (status.first_started_ms, status.last_progress_ms) == (5, 20)
    view.put(SummaryKey("a", 1), None)
    assert view.batch("a") == (one, 100)
    view.put(SummaryKey("a", 0), None)
    assert view.batches() == {}
    assert view.batch("a") == (BatchCounts(), 0)


def test_the_usage_of_provider_batches_lines_is_counted_apart_and_priced_at_the_discount() -> None:
    def ended(request_id: str, tokens: int, provider_batch: bool) -> RequestState:
        return RequestState(request_id, RequestStatus.SUCCEEDED, "h", batch_id="a", model="m",
                            prompt_tokens=tokens, completion_tokens=tokens, provider_batch=provider_batch)

    first, second = BatchCounts.of([LatestState.of(ended("a/1", 100, True))]), BatchCounts()
    second.add(LatestState.of(ended("a/2", 10, False)))
    first.merge(second)
    status = counted_status("a", first, 2)
    assert (status.usage, status.batched_usage) == ({"m": (110, 110)}, {"m": (100, 100)})
    prices = {"m": (1e6, 1e6)}  # a dollar a token
    assert spend_of(status.usage, prices, status.batched_usage).cost_usd == pytest.approx(100 + 20)
