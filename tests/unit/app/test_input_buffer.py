"""An input topic's agent buffer that one fetch never fills (app/faust_app.py, design §5.11 reading)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from streamproc.app.faust_app import RECORDS_PER_FETCH, fetch_fits, input_buffer


def test_the_buffer_holds_a_whole_fetch_past_the_point_where_faust_stops_fetching() -> None:
    assert input_buffer(1024) == 5000  # paused at 4,000 queued, and the fetch under way hands over 1,000 more
    assert input_buffer(8192) == 8192  # a larger stream buffer is kept


@given(st.integers(1, 100_000), st.integers(1, 10_000))
def test_a_fetch_handed_over_after_the_pause_never_finds_the_buffer_full(stream_buffer: int, per_fetch: int) -> None:
    size = input_buffer(stream_buffer, per_fetch)
    paused_at = math.floor(size / 1.25)  # mode's FlowControlQueue: under pressure from here on
    assert size - paused_at >= per_fetch and size >= stream_buffer
    assert input_buffer(stream_buffer) >= RECORDS_PER_FETCH


def test_a_buffer_takes_a_fetch_only_with_a_whole_fetch_of_room() -> None:
    """The hold-off for urgent records arriving lasts only while faust can still hand this buffer a fetch: a full
    buffer makes faust wait for every topic, so holding off then would keep the urgent records out (a low buffer
    over its pause mark with more low partitions still fetched filled up, and the low agent crawled at one record
    per hold-off while the high records sat in the client)."""
    size = input_buffer(1024)
    assert fetch_fits(0, size)
    assert fetch_fits(size - RECORDS_PER_FETCH, size)
    assert not fetch_fits(size - RECORDS_PER_FETCH + 1, size)
    assert not fetch_fits(size, size)
