"""``UrgentRecords``: whether more urgent records than a priority's are arriving (not yet at their agent) or coming
to the gate (arriving, taken and waiting for a dispatcher slot, or waiting in memory)."""

from __future__ import annotations

from dataclasses import dataclass, field

from faust.types import TP

from streamproc.app.urgent_records import FRESH_S, UrgentRecords
from tests.unit.app.fake_consumer import FakeConsumer

HIGH = "p.requests.high"
URGENT = {"high": frozenset[str](), "normal": frozenset({HIGH}), "low": frozenset({HIGH, "p.requests"})}



@dataclass
class World:
    consumer: FakeConsumer = field(default_factory=lambda: FakeConsumer({TP(HIGH, 0): 0}))
    waiting: set[str] = field(default_factory=set)
    gate_idle: bool = False
    stopping: bool = False
    now: float = 0.0

    def records(self) -> UrgentRecords:
        return UrgentRecords(lambda: self.consumer, URGENT, lambda: self.waiting, lambda: self.gate_idle,
                             lambda: self.stopping, clock=lambda: self.now)

    def later(self) -> None:
        self.now += 2 * FRESH_S  # past what the answers are kept for


def test_records_not_yet_at_their_agent_are_arriving_until_they_reach_it() -> None:
    world = World()
    urgent = world.records()
    urgent.reached(TP(HIGH, 0), 4)
    world.consumer.ends[TP(HIGH, 0)] = 10  # 5 more high records on the broker or in the agent's buffer
    assert urgent.arriving("low") and urgent.arriving("normal") and not urgent.arriving("high")
    urgent.reached(TP(HIGH, 0), 9)
    assert urgent.arriving("low")  # the answer is kept a moment: the gate asks for every call at each wake
    world.later()
    assert not urgent.arriving("low")


def test_a_partition_taken_away_is_read_again_from_its_committed_offset() -> None:
    world = World(FakeConsumer({TP(HIGH, 0): 10}, {TP(HIGH, 0): 6}))
    urgent = world.records()
    urgent.reached(TP(HIGH, 0), 9)
    assert not urgent.arriving("low")
    urgent.revoked({TP(HIGH, 0)})  # assigned again: the records from 6 come again
    world.later()
    assert urgent.arriving("low")


def test_records_taken_or_waiting_in_memory_are_coming_unless_they_could_never_come() -> None:
    world = World()
    urgent = world.records()
    assert not urgent.coming("low")
    with urgent.submitting("high"):  # a high record waits for a dispatcher slot
        world.later()
        assert urgent.coming("low") and urgent.coming("normal") and not urgent.coming("high")
        world.gate_idle = True  # every dispatcher slot is taken while the gate could start more calls
        world.later()
        assert not urgent.coming("low")
        world.gate_idle, world.stopping = False, True  # a rebalance waits for the calls in hand
        world.later()
        assert not urgent.coming("low")
        world.stopping = False
    world.later()
    assert not urgent.coming("low")
    world.waiting = {"normal"}  # a normal record waits in memory: coming for low, not for normal itself
    world.later()
    assert urgent.coming("low") and not urgent.coming("normal")


def test_another_tenant_groups_records_of_the_same_priority_not_yet_at_their_agent_are_arriving_peers() -> None:
    flood, small = "p.requests", "p.requests.g1"
    consumer = FakeConsumer({TP(flood, 0): 100, TP(small, 0): 0}, {TP(small, 0): 0})
    urgent = UrgentRecords(lambda: consumer, URGENT, set, lambda: False, lambda: False,
                           peer_topics={flood: frozenset({small}), small: frozenset({flood})})
    urgent.reached(TP(flood, 0), 99)  # the flood's partition all read
    consumer.ends[TP(small, 0)] = 5  # the other group's batch fetched, not yet at its agent
    assert urgent.peers_arriving(flood) and not urgent.peers_arriving(small)
    assert not urgent.arriving("normal")  # a peer group is no more urgent: the priorities' yields are untouched
    assert not urgent.peers_arriving("p.requests.low")  # a topic with no peers
