"""A call's place behind the client's own earlier calls: its timeout runs from the front."""

from __future__ import annotations

from streamproc.core.guards.own_queue import OwnQueue


def test_a_call_with_nothing_before_it_is_at_the_front_from_its_start() -> None:
    queue = OwnQueue()
    place = queue.start("m", 10.0)
    assert queue.served_for_s(place, 12.0) == 2.0
    assert queue.overdue(place, 1.5, 12.0) and not queue.overdue(place, 2.5, 12.0)


def test_a_call_behind_three_reaches_the_front_when_three_have_finished() -> None:
    """One slot, 4 s a call: the fourth call waits 12 s for the server, then has its own timeout."""
    queue = OwnQueue()
    places = [queue.start("m", 0.0) for _ in range(4)]
    for i, place in enumerate(places[:3], start=1):
        queue.finish(place, 4.0 * i, answered=True)
        assert queue.served_for_s(places[3], 4.0 * i) == (0.0 if i == 3 else None)
    assert not queue.overdue(places[3], 5.0, 16.0)  # 16 s after it was sent, 4 s after the front
    assert queue.overdue(places[3], 5.0, 17.5)


def test_behind_others_a_silent_server_is_still_cut_after_one_timeout() -> None:
    queue = OwnQueue()
    first, second = queue.start("m", 0.0), queue.start("m", 0.0)
    assert not queue.overdue(second, 5.0, 4.0)
    assert queue.overdue(second, 5.0, 5.5)  # nothing finished at all: the server is hung, not busy
    queue.finish(first, 6.0, answered=True)  # ...unless it answers the call before (seen at the next check)
    assert not queue.overdue(second, 5.0, 6.5) and queue.overdue(second, 5.0, 12.0)


def test_models_queue_apart_and_later_calls_finishing_count_too() -> None:
    queue = OwnQueue()
    big = queue.start("big", 0.0)
    waiting = queue.start("big", 0.0)
    small = queue.start("small", 0.0)
    assert queue.served_for_s(small, 1.0) == 1.0  # another model's calls are not ahead of it
    later = queue.start("big", 0.5)
    queue.finish(later, 1.0, answered=True)  # a server with slots answers out of order: still one less ahead
    assert queue.served_for_s(waiting, 1.0) == 0.0
    queue.finish(big, 2.0, answered=True)
    assert queue.served_for_s(queue.start("big", 2.0), 2.0) is None  # `waiting` is still out: one ahead


def test_a_call_given_up_on_is_no_progress() -> None:
    """A timed-out call leaves, but the server did not answer it: the call behind keeps its clock."""
    queue = OwnQueue()
    first, second = queue.start("m", 0.0), queue.start("m", 0.0)
    queue.finish(first, 5.0, answered=False)
    assert queue.served_for_s(second, 5.5) is None
    assert queue.overdue(second, 5.0, 5.5)  # silent since it was sent
    assert queue.served_for_s(queue.start("m", 6.0), 6.0) is None  # `second` is still out: one ahead
