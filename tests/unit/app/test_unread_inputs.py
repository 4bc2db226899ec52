"""``unread_topics``: a more urgent topic's records that faust fetched, or the broker has, and not yet handed over."""

from __future__ import annotations

from dataclasses import dataclass, field

from faust.types import TP

from streamproc.app.unread_inputs import unread_topics

HIGH, LOW = "p.requests.high", "p.requests.low"


@dataclass
class FakeConsumer:
    """faust's consumer as ``unread_topics`` reads it: the assignment, highwaters, read and committed offsets."""

    ends: dict[TP, int | None]
    _read_offset: dict[TP, int | None] = field(default_factory=dict)
    _committed_offset: dict[TP, int | None] = field(default_factory=dict)

    def assignment(self) -> set[TP]:
        return set(self.ends)

    def highwater(self, tp: TP) -> int | None:
        return self.ends[tp]


def test_a_topic_is_unread_while_its_log_end_is_past_the_last_record_handed_over() -> None:
    high, low = TP(HIGH, 0), TP(LOW, 0)
    consumer = FakeConsumer({high: 46, low: 900}, _read_offset={high: 14, low: 100})
    assert unread_topics(consumer, {HIGH}) == {HIGH}  # 31 high records fetched behind the low batch
    consumer._read_offset[high] = 45  # every one handed over (the log end is the next offset)
    assert unread_topics(consumer, {HIGH}) == set()
    assert unread_topics(consumer, {HIGH, LOW}) == {LOW}


def test_with_nothing_handed_over_yet_the_committed_offset_says_where_the_agent_stands() -> None:
    high = TP(HIGH, 1)
    assert unread_topics(FakeConsumer({high: 20}, _committed_offset={high: 12}), {HIGH}) == {HIGH}
    assert unread_topics(FakeConsumer({high: 20}, _committed_offset={high: 20}), {HIGH}) == set()
    # nothing known (no record handed over, no commit, or no fetch response yet): never held off for it
    assert unread_topics(FakeConsumer({high: 20}), {HIGH}) == set()
    assert unread_topics(FakeConsumer({high: None}, _read_offset={high: 3}), {HIGH}) == set()


def test_partitions_not_assigned_and_other_topics_do_not_count() -> None:
    consumer = FakeConsumer({TP(LOW, 2): 50}, _read_offset={TP(LOW, 2): 10, TP(HIGH, 2): 0})
    assert unread_topics(consumer, {HIGH}) == set()
