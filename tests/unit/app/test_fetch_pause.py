"""FetchPause marks a topic's assigned partitions as buffered in faust's consumer, and gives them back unless their
buffer is at its pressure mark or a rebalance came in between."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from streamproc.app.faust_app import under_pressure
from streamproc.app.fetch_pause import COOLDOWN_S, FetchPause


class TP(NamedTuple):
    topic: str
    partition: int


@dataclass
class Consumer:
    assigned: set[TP]
    buffered: set[TP] = field(default_factory=set)

    def assignment(self) -> set[TP]:
        return self.assigned

    def on_buffer_full(self, tp: TP) -> None:
        self.buffered.add(tp)

    def on_buffer_drop(self, tp: TP) -> None:
        self.buffered.discard(tp)


@dataclass
class App:
    consumer: Consumer
    consumer_generation_id: int = 1


def app_with(*tps: TP) -> App:
    return App(Consumer(set(tps)))


LOW = [TP("p.requests.low", 0), TP("p.requests.low", 3)]
HIGH = TP("p.requests.high", 0)


def low_paused(clock: Callable[[], float] = time.monotonic) -> tuple[App, FetchPause]:
    """An app assigned LOW, whose topic was just paused."""
    app = app_with(*LOW)
    pause = FetchPause(app, clock=clock)
    pause.pause("p.requests.low")
    return app, pause


def test_a_pause_stops_fetching_only_that_topic_and_a_resume_gives_it_back() -> None:
    app = app_with(*LOW, HIGH)
    pause = FetchPause(app)
    pause.pause("p.requests.low")
    assert app.consumer.buffered == set(LOW)
    pause.resume("p.requests.low")
    assert app.consumer.buffered == set()


def test_a_buffer_at_its_pressure_mark_stays_paused_for_faust_to_give_back() -> None:
    assert under_pressure(4000, 5000) and not under_pressure(3999, 5000)  # 5000 / 1.25
    app, pause = low_paused()
    pause.resume("p.requests.low", at_mark=True)
    assert app.consumer.buffered == set(LOW)


def test_after_a_rebalance_a_resume_touches_nothing() -> None:
    app, pause = low_paused()
    app.consumer_generation_id = 2
    app.consumer.assigned = {LOW[0]}
    app.consumer.buffered = set()  # faust's state of the new generation
    pause.resume("p.requests.low")
    assert app.consumer.buffered == set()


def test_a_partition_taken_away_in_between_is_not_given_back() -> None:
    app, pause = low_paused()
    app.consumer.assigned = {LOW[0]}
    app.consumer.buffered.add(LOW[1])
    pause.resume("p.requests.low")
    assert app.consumer.buffered == {LOW[1]}


def test_a_resume_without_a_pause_does_nothing() -> None:
    app = app_with(*LOW)
    app.consumer.buffered = {LOW[0]}
    FetchPause(app).resume("p.requests.low")
    assert app.consumer.buffered == {LOW[0]}


def test_a_hold_that_ran_out_of_time_leaves_the_topic_unpaused_for_a_while() -> None:
    """The awaited records never came (their agent blocked): the topic's buffer must fill again, as without a
    pause, so the hold-off ends on a full buffer instead of holding each record to its time limit."""
    now = [100.0]
    app, pause = low_paused(clock=lambda: now[0])
    now[0] += 5.0
    pause.resume("p.requests.low", ran_out=True)
    pause.pause("p.requests.low")
    assert app.consumer.buffered == set()
    now[0] += COOLDOWN_S
    pause.pause("p.requests.low")
    assert app.consumer.buffered == set(LOW)
