"""The pure parts of ``scripts/bench fleet`` (benchmarks/fleet.py, fleet_workers.py): rows, labels, targets."""

from __future__ import annotations

import argparse
import time

import pytest

from benchmarks.fleet import Check, Measured, add_arguments, check_arguments, checks, client_label, rows_of
from benchmarks.fleet_workers import SCENARIOS, Change
from benchmarks.guards import Outcomes
from benchmarks.servers import StrictRun

IDS = frozenset({"r1", "r2", "r3"})


def figures(wall_s: float, *, answered_429: int = 15, repeated: int = 0, finished: int = 3) -> StrictRun:
    """1,500 calls the limiter admitted at 3,000 RPM: an ideal of 30 s."""
    times = (100.0 + wall_s / 2, 100.0 + wall_s / 2, 100.0 + wall_s)[:finished]
    return StrictRun("test", IDS, IDS, 100.0, times, 1500, answered_429, {}, {}, 3000,
                     repeated_outcomes=repeated)


def found(measured: list[Measured], what: str) -> Check:
    [check] = [check for check in checks(measured) if what in check.what]
    return check


def test_the_fleet_rows_have_their_own_wall_target() -> None:
    one = Measured(1, "strict", "worker", figures(33.6))  # 1.12 of the ideal
    three = Measured(1, "strict", "worker", figures(33.6), "3")
    killed = Measured(1, "strict", "worker-no-hedge", figures(35.1), "kill")  # 1.17
    assert not found([one], "wall / ideal <= 1.10").met
    assert found([three], "wall / ideal <= 1.15").met
    assert not found([killed], "wall / ideal <= 1.15").met


def test_every_request_must_end_exactly_once() -> None:
    assert found([Measured(1, "strict", "worker", figures(30.0), "kill")], "ended once").met
    twice = found([Measured(1, "strict", "worker", figures(30.0, repeated=2), "kill")], "ended once")
    assert not twice.met and "2 more than once" in twice.figure
    assert not found([Measured(1, "strict", "worker", figures(30.0, finished=2), "join")], "ended once").met


def test_the_429_share_counts_every_429_against_strict() -> None:
    assert found([Measured(1, "strict", "worker", figures(30.0, answered_429=30), "2")], "429s <= 2%").met
    assert not found([Measured(1, "strict", "worker", figures(30.0, answered_429=31), "2")], "429s <= 2%").met


def test_a_fleet_is_compared_with_the_peers_of_its_own_run_and_profile() -> None:
    fleet = Measured(2, "strict", "worker", figures(40.0), "join")
    peers = [Measured(2, "strict", "tenacity", figures(45.0)), Measured(2, "strict", "litellm", figures(39.0)),
             Measured(1, "strict", "tenacity", figures(20.0)), Measured(2, "strict-v1", "litellm", figures(20.0))]
    below = [check for check in checks([fleet, *peers]) if "wall below" in check.what]
    assert [(check.what.split("below ")[1], check.met) for check in below] == [
        ("asyncio+tenacity's", True), ("LiteLLM Router's", False)]


def test_the_rows_a_client_runs() -> None:
    rows = ["1", "2", "3", "join", "kill"]
    assert rows_of("strict", "worker", rows) == rows
    assert rows_of("strict", "worker-no-hedge", ["kill"]) == ["kill"]
    assert rows_of("strict-v1", "worker", rows) == ["1"]  # more than one worker only against strict
    assert rows_of("strict", "tenacity", rows) == ["1"]  # a peer is one process


def test_labels_and_scenarios() -> None:
    assert client_label("worker", "1") == "worker"
    assert client_label("worker-no-hedge", "3") == "3 workers, hedging off"
    assert client_label("worker", "kill") == "3 workers, one SIGKILLed at 1/3"
    assert client_label("worker", "join") == "2 workers, one more joins at 1/3"
    assert (SCENARIOS["join"].start, SCENARIOS["join"].change) == (2, Change.JOIN)
    assert (SCENARIOS["kill"].start, SCENARIOS["kill"].change) == (3, Change.KILL)


def test_unknown_rows_are_refused() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--partitions", type=int, default=8)
    check_arguments(parser, parser.parse_args(["--fleet-workers", "kill,2"]))
    with pytest.raises(SystemExit):
        check_arguments(parser, parser.parse_args(["--fleet-workers", "4"]))


async def test_a_milestone_is_set_once_that_many_requests_had_an_outcome() -> None:
    outcomes = Outcomes({"r1", "r2", "r3"}, time.time())
    third, all_of_them = outcomes.reached(1), outcomes.reached(3)
    assert not third.is_set()
    outcomes.terminal["r1"] = []
    outcomes.signal_milestones()
    assert third.is_set() and not all_of_them.is_set()
    assert outcomes.reached(1).is_set()  # already reached: set at once
