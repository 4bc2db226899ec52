"""Picking a deployment: the least expected wait for its weight, so a slower replica gets fewer calls."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.guards.balance import Choice, DeploymentLoad

A, B = Choice("m@1"), Choice("m@2")


def take(load: DeploymentLoad, choices: list[Choice]) -> str:
    choice = load.pick(choices)
    assert choice is not None
    load.begin(choice.key)
    return choice.key


def test_idle_deployments_of_equal_latency_take_calls_in_turn() -> None:
    load = DeploymentLoad()
    picked = []
    for _ in range(4):
        picked.append(take(load, [A, B]))
        load.end(picked[-1], 0.5)
    assert picked == ["m@1", "m@2", "m@1", "m@2"]


def test_the_least_outstanding_deployment_takes_the_call() -> None:
    load = DeploymentLoad()
    for _ in range(3):
        load.begin("m@1")
    load.begin("m@2")
    assert load.pick([A, B]) == B
    assert load.pick([A]) == A and load.pick([]) is None


def test_a_weight_of_two_takes_twice_the_outstanding_calls() -> None:
    load, heavy = DeploymentLoad(), Choice("m@1", weight=2)
    for _ in range(30):
        take(load, [heavy, B])
    assert (load.outstanding("m@1"), load.outstanding("m@2")) == (20, 10)


def test_a_deployment_not_heard_from_is_tried() -> None:
    load = DeploymentLoad()
    load.begin("m@1")
    load.end("m@1", 0.2)
    assert take(load, [A, B]) == "m@2"


def test_the_latency_average_follows_the_answers() -> None:
    load = DeploymentLoad()
    for latency in (1.0, 2.0):
        load.begin("m@1")
        load.end("m@1", latency)
    assert load.latency_s("m@1") == pytest.approx(1.3) and load.latency_s("m@2") is None
    load.begin("m@1")
    load.abandon("m@1")  # says nothing of its speed
    assert load.latency_s("m@1") == pytest.approx(1.3) and load.outstanding("m@1") == 0


def test_an_end_without_a_begin_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        DeploymentLoad().end("m@1", 1.0)
    with pytest.raises(RuntimeError):
        DeploymentLoad().abandon("m@1")


@given(st.integers(min_value=1, max_value=64), st.integers(min_value=2, max_value=20))
def test_a_replica_twice_as_slow_gets_at_most_forty_percent(slots: int, rounds: int) -> None:
    """At a full in-flight limit (``slots`` calls out), in ticks of 0.1 s: a call to m@1 ends after 1 tick, one to
    m@2 after 2."""
    load, ends, given_to = DeploymentLoad(), list[tuple[int, str]](), {"m@1": 0, "m@2": 0}
    ticks = {"m@1": 1, "m@2": 2}
    for tick in range(rounds * 10):
        for end in [e for e in ends if e[0] == tick]:
            ends.remove(end)
            load.end(end[1], ticks[end[1]] / 10)
        while len(ends) < slots:
            key = take(load, [A, B])
            given_to[key] += 1
            ends.append((tick + ticks[key], key))
    assert given_to["m@2"] <= 0.4 * sum(given_to.values())
