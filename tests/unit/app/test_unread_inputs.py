"""``unread_topics``: a more urgent topic's records that have not reached their agent (at the broker, in faust's
fetch, or in the agent's buffer)."""

from __future__ import annotations

from faust.types import TP

from streamproc.app.unread_inputs import unread_topics
from tests.unit.app.fake_consumer import FakeConsumer

HIGH, LOW = "p.requests.high", "p.requests.low"


def test_a_topic_is_unread_while_its_log_end_is_past_the_last_record_that_reached_its_agent() -> None:
    high, low = TP(HIGH, 0), TP(LOW, 0)
    consumer = FakeConsumer({high: 46, low: 900})
    reached = {high: 14, low: 100}
    assert unread_topics(consumer, {HIGH}, reached) == {HIGH}  # 31 high records not yet at the high agent
    reached[high] = 45  # every one reached it (the log end is the next offset)
    assert unread_topics(consumer, {HIGH}, reached) == set()
    assert unread_topics(consumer, {HIGH, LOW}, reached) == {LOW}


def test_with_nothing_handed_over_yet_the_committed_offset_says_where_the_agent_stands() -> None:
    high = TP(HIGH, 1)
    assert unread_topics(FakeConsumer({high: 20}, _committed_offset={high: 12}), {HIGH}, {}) == {HIGH}
    assert unread_topics(FakeConsumer({high: 20}, _committed_offset={high: 20}), {HIGH}, {}) == set()
    # nothing known (no record reached the agent, no commit, or no fetch response yet): never held off for it
    assert unread_topics(FakeConsumer({high: 20}), {HIGH}, {}) == set()
    assert unread_topics(FakeConsumer({high: None}), {HIGH}, {high: 3}) == set()


def test_a_topic_never_committed_is_unread_while_the_client_holds_its_fetch() -> None:
    """A first high batch: no commit, no record reached its agent, so the log end cannot say where the agent stands
    (the 22 s a high batch behind 20,000 low records waited in the client's buffer, not held off for)."""
    high = TP(HIGH, 1)
    assert unread_topics(FakeConsumer({high: 25}), {HIGH}, {}, fetched={high}) == {HIGH}
    assert unread_topics(FakeConsumer({high: 25}), {HIGH}, {}, fetched=set()) == set()
    # once a record reached the agent, the log end says it again: the rest of the fetch is unread, then none
    assert unread_topics(FakeConsumer({high: 25}), {HIGH}, {high: 3}, fetched={high}) == {HIGH}
    assert unread_topics(FakeConsumer({high: 25}), {HIGH}, {high: 24}, fetched={high}) == set()


def test_partitions_not_assigned_and_other_topics_do_not_count() -> None:
    consumer = FakeConsumer({TP(LOW, 2): 50})
    assert unread_topics(consumer, {HIGH}, {TP(LOW, 2): 10, TP(HIGH, 2): 0}) == set()
