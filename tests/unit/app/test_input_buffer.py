"""An input topic's agent buffer that one fetch never fills (app/faust_app.py, design §5.11 reading)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from streamproc.app.faust_app import RECORDS_PER_FETCH, input_buffer


def test_the_buffer_holds_a_whole_fetch_past_the_point_where_faust_stops_fetching() -> None:
    assert input_buffer(1024) == 5000  # paused at 4,000 queued, and the fetch under way hands over 1,000 more
    assert input_buffer(8192) == 8192  # a larger stream buffer is kept


@given(st.integers(1, 100_000), st.integers(1, 10_000))
def test_a_fetch_handed_over_after_the_pause_never_finds_the_buffer_full(stream_buffer: int, per_fetch: int) -> None:
    size = input_buffer(stream_buffer, per_fetch)
    paused_at = math.floor(size / 1.25)  # mode's FlowControlQueue: under pressure from here on
    assert size - paused_at >= per_fetch and size >= stream_buffer
    assert input_buffer(stream_buffer) >= RECORDS_PER_FETCH
