"""The worker's calls in flight shared among its deployments: each within its own limit, all within the total,
and each sure of its part, so a hung replica cannot hold the slots a healthy one needs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.guards.in_flight_parts import InFlightParts


def fill(parts: InFlightParts, key: str, limits: dict[str, int]) -> int:
    """Start calls of ``key`` while it may; how many started."""
    started = 0
    while parts.may_start(key, limits):
        parts.start(key)
        started += 1
    return started


def test_one_deployment_takes_its_limit_within_the_total() -> None:
    parts = InFlightParts(total=8)
    assert fill(parts, "*", {"*": 5}) == 5
    assert fill(InFlightParts(total=8), "*", {"*": 100}) == 8


def test_a_deployment_at_its_limit_does_not_hold_back_another() -> None:
    parts = InFlightParts(total=100)
    limits = {"m@1": 4, "m@2": 30}
    assert fill(parts, "m@1", limits) == 4  # slow: its limit fell
    assert not parts.may_start("m@1", limits)
    assert fill(parts, "m@2", limits) == 30
    assert parts.total_in_use == 34


def test_a_hung_deployment_that_took_every_free_slot_leaves_the_others_their_part() -> None:
    parts = InFlightParts(total=256)
    limits = {"m@1": 256, "m@2": 256}
    assert fill(parts, "m@1", limits) == 128  # the other's part stays free while it has no calls
    assert fill(parts, "m@2", limits) == 128
    assert parts.total_in_use == 256 and not parts.may_start("m@1", limits)


def test_slots_beyond_the_parts_are_first_come() -> None:
    parts = InFlightParts(total=10)
    limits = {"m@1": 10, "m@2": 2}  # m@2's part is its limit, 2: the other may take 8
    assert fill(parts, "m@1", limits) == 8
    assert fill(parts, "m@2", limits) == 2
    parts.end("m@2")
    assert not parts.may_start("m@1", limits)  # the freed slot is m@2's part
    assert parts.may_start("m@2", limits)


def test_a_deployment_held_by_its_own_limit_holds_back_only_its_own_calls() -> None:
    parts = InFlightParts(total=10)
    limits = {"m@1": 1, "m@2": 5}
    parts.start("m@1")
    assert not parts.may_start("m@1", limits)
    assert parts.may_start("m@2", limits)


def test_ending_a_call_that_never_started_is_an_error() -> None:
    parts = InFlightParts(total=4)
    with pytest.raises(RuntimeError):
        parts.end("m@1")
    with pytest.raises(ValueError):
        InFlightParts(total=0)


steps = st.lists(st.tuples(st.sampled_from(["start", "end"]), st.integers(0, 3)), max_size=300)


@given(total=st.integers(1, 64), limits=st.lists(st.integers(1, 64), min_size=1, max_size=4), script=steps)
def test_the_total_holds_each_limit_holds_and_every_part_stays_free_for_its_deployment(
        total: int, limits: list[int], script: list[tuple[str, int]]) -> None:
    """Whatever the others did, a deployment below its part may start a call; no deployment passes its limit
    and the worker never passes its total."""
    parts = InFlightParts(total)
    by_key = {f"m@{n}": limit for n, limit in enumerate(limits)}
    keys = list(by_key)
    for action, index in script:
        key = keys[index % len(keys)]
        if action == "start" and parts.may_start(key, by_key):
            parts.start(key)
        elif action == "end" and parts.in_use(key):
            parts.end(key)
        assert parts.total_in_use <= total
        for other in keys:
            assert parts.in_use(other) <= by_key[other]
            if parts.in_use(other) < parts.part(other, by_key):
                assert parts.may_start(other, by_key)
