"""The pool for long requests: long calls hold at most a share of the slots while short calls are about, all of
them when short calls are quiet, and never none."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.guards.long_requests import (
    NO_POOL,
    LongPool,
    LongRequests,
    estimated_size,
    timing_key,
)

POLICY = LongRequests(threshold_tokens=2000, share=0.25, quiet_s=2.0)


def body(prompt_chars: int, max_tokens: int | None = None) -> dict[str, object]:
    chat: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "x" * prompt_chars}]}
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    return chat


def test_the_size_is_prompt_characters_over_four_plus_the_completion_budget() -> None:
    assert estimated_size(body(400, 1000)) == 100 + 4 + 3 + 1000
    assert estimated_size(body(400)) == 100 + 4 + 3 + 256  # no max_tokens: the default budget
    assert estimated_size({"model": "m", "prompt": "y" * 40, "max_completion_tokens": 5}) == 10 + 5


def test_long_is_over_the_threshold_and_nothing_is_long_without_a_pool() -> None:
    assert POLICY.is_long(body(0, 2000))  # 2,007 tokens
    assert not POLICY.is_long(body(0, 1990))  # 1,997
    assert POLICY.is_long(body(4 * 8000))  # a long context is long too
    assert not NO_POOL.is_long(body(4 * 100_000, 100_000))
    assert not POLICY.is_long(json.loads('{"model": "m", "max_tokens": "lots"}'))  # odd shapes count what they can


@pytest.mark.parametrize(("limit", "cap"), [(1, 1), (3, 1), (4, 1), (16, 4), (256, 64)])
def test_the_cap_is_the_share_of_the_limit_and_at_least_one(limit: int, cap: int) -> None:
    assert POLICY.cap(limit) == cap


def test_settings_out_of_range_are_refused() -> None:
    for threshold, share in ((-1, 0.5), (100, 0.0), (100, 1.5)):
        with pytest.raises(ValueError):
            LongRequests(threshold_tokens=threshold, share=share)


def test_long_calls_hold_their_share_while_short_calls_are_in_flight() -> None:
    pool = LongPool(POLICY)
    pool.start("*", long=False, now=0.0)
    started = 0
    while pool.may_start("*", long=True, limit=16, now=0.0, short_waiting=False):
        pool.start("*", long=True, now=0.0)
        started += 1
    assert started == 4
    assert pool.may_start("*", long=False, limit=16, now=0.0, short_waiting=False)  # short ones always may


def test_a_short_call_waiting_holds_long_calls_to_their_share() -> None:
    pool = LongPool(POLICY)
    for _ in range(4):
        pool.start("*", long=True, now=100.0)
    assert pool.may_start("*", long=True, limit=16, now=100.0, short_waiting=False)  # shorts quiet: all slots
    assert not pool.may_start("*", long=True, limit=16, now=100.0, short_waiting=True)


def test_long_calls_take_every_slot_once_short_ones_are_quiet() -> None:
    pool = LongPool(POLICY)
    pool.start("*", long=False, now=0.0)
    pool.start("*", long=True, now=0.0)
    pool.end("*", long=False, now=1.0)
    assert not pool.may_start("*", long=True, limit=4, now=2.9, short_waiting=False)  # within quiet_s of the short
    assert pool.may_start("*", long=True, limit=4, now=3.0, short_waiting=False)


def test_deployments_are_pooled_apart() -> None:
    pool = LongPool(POLICY)
    pool.start("m@1", long=False, now=0.0)
    pool.start("m@1", long=True, now=0.0)
    assert not pool.may_start("m@1", long=True, limit=4, now=0.0, short_waiting=False)
    assert pool.may_start("m@2", long=True, limit=4, now=0.0, short_waiting=False)


def test_an_end_without_a_start_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        LongPool(POLICY).end("*", long=True, now=0.0)


def test_long_calls_are_timed_apart() -> None:
    assert timing_key("gpt-4o", long=False) == "gpt-4o"
    assert timing_key("gpt-4o", long=True) != "gpt-4o"


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.floats(0, 1)), max_size=200),
       st.integers(1, 64), st.floats(0.05, 1.0))
def test_while_shorts_are_in_flight_long_calls_never_pass_their_cap(steps: list[tuple[bool, bool, float]],
                                                                    limit: int, share: float) -> None:
    """Any sequence of starts and ends: whenever a short call is in flight, the long calls started since the
    last moment shorts were quiet never exceed the cap, and a long call may always start when none is out."""
    pool = LongPool(LongRequests(threshold_tokens=1, share=share, quiet_s=2.0))
    cap = pool.policy.cap(limit)
    in_flight = {True: 0, False: 0}
    now = 0.0
    for start, long, dt in steps:
        now += dt
        if start or in_flight[long] == 0:
            if pool.may_start("*", long, limit, now, short_waiting=False):
                if long and in_flight[False] > 0:
                    assert in_flight[True] < cap
                pool.start("*", long, now)
                in_flight[long] += 1
            else:
                assert long and in_flight[True] >= cap  # only the cap ever holds a call back
        else:
            pool.end("*", long, now)
            in_flight[long] -= 1
        assert pool.long_in_use("*") == in_flight[True]
