"""Ordered acks: only a contiguous completed prefix of a partition is ever released."""

from __future__ import annotations

import random

import pytest

from streamproc.core.acker import OrderedAcker


def test_in_order_completions_release_at_once() -> None:
    acker: OrderedAcker[str] = OrderedAcker()
    for offset in range(3):
        acker.track(0, offset, f"e{offset}")
    assert acker.complete(0, 0) == ["e0"]
    assert acker.complete(0, 1) == ["e1"]
    assert acker.complete(0, 2) == ["e2"]
    assert len(acker) == 0


def test_out_of_order_completions_wait_for_the_head() -> None:
    acker: OrderedAcker[str] = OrderedAcker()
    for offset in (10, 11, 12, 13):
        acker.track("p", offset, f"e{offset}")
    assert acker.complete("p", 12) == []
    assert acker.complete("p", 11) == []
    assert acker.pending("p") == 4
    assert acker.complete("p", 10) == ["e10", "e11", "e12"]
    assert acker.pending("p") == 1
    assert acker.complete("p", 13) == ["e13"]


def test_offset_gaps_are_fine() -> None:
    # Compacted topics and transaction markers leave holes in the offsets.
    acker: OrderedAcker[int] = OrderedAcker()
    for offset in (3, 9, 40):
        acker.track(0, offset, offset)
    assert acker.complete(0, 40) == []
    assert acker.complete(0, 9) == []
    assert acker.complete(0, 3) == [3, 9, 40]


def test_partitions_are_independent() -> None:
    acker: OrderedAcker[str] = OrderedAcker()
    acker.track(("requests", 0), 5, "a5")
    acker.track(("requests", 1), 5, "b5")
    acker.track(("requests", 0), 6, "a6")
    assert acker.complete(("requests", 0), 6) == []
    assert acker.complete(("requests", 1), 5) == ["b5"]
    assert acker.pending(("requests", 0)) == 2
    assert acker.pending(("requests", 1)) == 0


def test_counts() -> None:
    acker: OrderedAcker[int] = OrderedAcker()
    for offset in range(5):
        acker.track(0, offset, offset)
    acker.track(1, 0, 100)
    acker.complete(0, 3)
    acker.complete(0, 4)
    assert (len(acker), acker.in_flight, acker.pending(0), acker.pending(1), acker.pending(7)) == (6, 4, 5, 1, 0)
    acker.complete(0, 0)
    assert (len(acker), acker.in_flight) == (5, 3)


def test_completing_an_unknown_offset_raises() -> None:
    acker: OrderedAcker[int] = OrderedAcker()
    acker.track(0, 1, 1)
    with pytest.raises(ValueError, match="not tracked"):
        acker.complete(0, 2)
    with pytest.raises(ValueError, match="not tracked"):
        acker.complete(9, 1)


def test_completing_twice_raises() -> None:
    acker: OrderedAcker[int] = OrderedAcker()
    acker.track(0, 1, 1)
    acker.track(0, 2, 2)
    acker.complete(0, 2)
    with pytest.raises(ValueError, match="twice"):
        acker.complete(0, 2)
    assert acker.complete(0, 1) == [1, 2]
    with pytest.raises(ValueError, match="already released"):
        acker.complete(0, 1)


@pytest.mark.parametrize("offset", [4, 3])
def test_tracking_twice_or_backwards_raises(offset: int) -> None:
    acker: OrderedAcker[int] = OrderedAcker()
    acker.track(0, 4, 4)
    with pytest.raises(ValueError, match="offset order"):
        acker.track(0, offset, offset)
    assert acker.pending(0) == 1


def test_tracking_a_released_offset_again_raises() -> None:
    acker: OrderedAcker[int] = OrderedAcker()
    acker.track(0, 4, 4)
    acker.complete(0, 4)
    with pytest.raises(ValueError):
        acker.track(0, 4, 4)


def test_forget_returns_unreleased_items_in_order_and_restarts_tracking() -> None:
    acker: OrderedAcker[str] = OrderedAcker()
    for offset in (1, 2, 3, 4):
        acker.track(0, offset, f"e{offset}")
    acker.track(1, 1, "other")
    acker.complete(0, 1)
    acker.complete(0, 3)  # done, but blocked behind 2: never acked by this worker
    assert acker.forget(0) == ["e2", "e3", "e4"]
    assert (len(acker), acker.in_flight, acker.pending(0)) == (1, 1, 0)
    with pytest.raises(ValueError):
        acker.complete(0, 2)
    # The partition comes back and is read again from its committed offset (2).
    acker.track(0, 2, "again")
    assert acker.complete(0, 2) == ["again"]
    assert acker.forget(42) == []


@pytest.mark.parametrize("seed", range(200))
def test_random_completion_orders_release_only_contiguous_prefixes(seed: int) -> None:
    rng = random.Random(seed)
    acker: OrderedAcker[tuple[int, int]] = OrderedAcker()
    tracked: dict[int, list[int]] = {}
    next_offset = {p: rng.randrange(0, 1000) for p in range(rng.randint(1, 4))}
    for _ in range(rng.randint(1, 120)):
        partition = rng.choice(list(next_offset))
        offset = next_offset[partition]
        next_offset[partition] += rng.choice([1, 1, 1, 2, 7])
        acker.track(partition, offset, (partition, offset))
        tracked.setdefault(partition, []).append(offset)

    work = [(p, o) for p, offsets in tracked.items() for o in offsets]
    rng.shuffle(work)
    completed: set[tuple[int, int]] = set()
    released: list[tuple[int, int]] = []
    for partition, offset in work:
        completed.add((partition, offset))
        newly = acker.complete(partition, offset)
        for item in newly:
            p, o = item
            below = [lower for lower in tracked[p] if lower <= o]
            assert all((p, lower) in completed for lower in below), f"released {item} before a lower offset"
        assert [o for _, o in newly] == sorted(o for _, o in newly)
        released.extend(newly)
        assert acker.in_flight == len(work) - len(completed)
        assert len(acker) == len(work) - len(released)

    assert sorted(released) == sorted(work)  # everything, exactly once
    for partition, offsets in tracked.items():
        assert [o for p, o in released if p == partition] == offsets  # in offset order per partition
    assert len(acker) == 0


def test_many_events_in_a_sliding_window() -> None:
    # 200 windows of 256 in flight, each completed in reverse: the shape of a busy worker.
    acker: OrderedAcker[int] = OrderedAcker()
    released = 0
    window = 256
    for start in range(0, 200 * window, window):
        for offset in range(start, start + window):
            acker.track(offset % 8, offset, offset)
        for offset in reversed(range(start, start + window)):
            released += len(acker.complete(offset % 8, offset))
    assert released == 200 * window
    assert len(acker) == 0


def test_a_retired_lane_is_dropped_once_its_last_event_is_released() -> None:
    acker: OrderedAcker[int] = OrderedAcker()
    acker.track(("tp", 1), 5, 5)
    acker.track(("tp", 1), 6, 6)
    acker.track(("tp", 0), 3, 3)
    acker.complete(("tp", 0), 3)
    acker.retire(("tp", 0))  # empty: dropped now
    acker.retire(("tp", 1))  # busy: kept until its events are released
    assert acker.lanes == 1
    acker.complete(("tp", 1), 6)
    assert acker.lanes == 1  # 5 is still running
    assert acker.complete(("tp", 1), 5) == [5, 6]
    assert (acker.lanes, len(acker), acker.in_flight) == (0, 0, 0)
    acker.retire(("tp", 9))  # unknown: nothing to do


def test_lanes_of_many_generations_do_not_pile_up() -> None:
    acker: OrderedAcker[int] = OrderedAcker()
    for generation in range(1000):
        lane = ("tp", generation)
        acker.track(lane, generation, generation)
        acker.complete(lane, generation)
        acker.retire(("tp", generation - 1))
    assert acker.lanes == 1  # only the current generation's
