"""Per-partition ordered acks: release an event only when every lower offset of its partition is complete.

Events are handled concurrently and finish in any order, but a Kafka commit covers everything below the
committed offset. Acking out of order is how faust's ``concurrency=N`` loses messages on a crash
(faust-streaming #606, design §5); acking only a contiguous completed prefix cannot.

Each partition keeps a deque of tracked offsets in arrival order plus the set of those completed ahead of
the head; ``complete`` pops from the head while the head is done. Every offset is pushed, added and popped
once, so the cost is O(1) amortised per event.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Lane(Generic[T]):
    """One partition's unreleased events, in offset order."""

    __slots__ = ("done", "items", "last_offset", "order", "retired")

    def __init__(self) -> None:
        self.order: deque[int] = deque()
        self.items: dict[int, T] = {}
        self.done: set[int] = set()
        self.last_offset: int | None = None
        self.retired = False  # no event will be tracked again: drop the lane once its last one is released


class OrderedAcker(Generic[T]):
    """Tracks in-flight events per partition and hands back the ones that may be acked, in offset order."""

    def __init__(self) -> None:
        self._lanes: dict[Hashable, _Lane[T]] = {}
        self._unreleased = 0
        self._completed_unreleased = 0

    def track(self, partition: Hashable, offset: int, item: T) -> None:
        """Register an event as it is taken from the stream; offsets must rise within a partition."""
        lane = self._lanes.setdefault(partition, _Lane())
        if lane.last_offset is not None and offset <= lane.last_offset:
            raise ValueError(
                f"offset {offset} of partition {partition!r} tracked after offset {lane.last_offset}: "
                "events must be tracked once each, in offset order"
            )
        lane.last_offset = offset
        lane.order.append(offset)
        lane.items[offset] = item
        self._unreleased += 1

    def complete(self, partition: Hashable, offset: int) -> list[T]:
        """Mark an event handled; return the events now safe to ack (possibly none), lowest offset first."""
        lane = self._lanes.get(partition)
        if lane is None or offset not in lane.items:
            raise ValueError(f"offset {offset} of partition {partition!r} is not tracked (or already released)")
        if offset in lane.done:
            raise ValueError(f"offset {offset} of partition {partition!r} completed twice")
        lane.done.add(offset)
        self._completed_unreleased += 1
        released: list[T] = []
        while lane.order and lane.order[0] in lane.done:
            head = lane.order.popleft()
            lane.done.remove(head)
            released.append(lane.items.pop(head))
        self._unreleased -= len(released)
        self._completed_unreleased -= len(released)
        if lane.retired and not lane.order:
            del self._lanes[partition]
        return released

    def retire(self, partition: Hashable) -> None:
        """No event of ``partition`` will be tracked again (its consumer generation is over): drop its lane
        now if it is empty, else once its last event is released. Without this, lanes keyed by generation
        would pile up with every rebalance."""
        lane = self._lanes.get(partition)
        if lane is None:
            return
        if lane.order:
            lane.retired = True
        else:
            del self._lanes[partition]

    @property
    def lanes(self) -> int:
        """Lanes kept (each holds its last offset, for the order check)."""
        return len(self._lanes)

    def pending(self, partition: Hashable) -> int:
        """Events of ``partition`` not yet released (still running, or done behind a running one)."""
        lane = self._lanes.get(partition)
        return len(lane.order) if lane is not None else 0

    def forget(self, partition: Hashable) -> list[T]:
        """Drop a revoked partition; return its unreleased events in offset order (never to be acked here).

        Its next owner starts from the committed offset, which may be below offsets seen here: tracking
        restarts from scratch if the partition comes back.
        """
        lane = self._lanes.pop(partition, None)
        if lane is None:
            return []
        self._unreleased -= len(lane.order)
        self._completed_unreleased -= len(lane.done)
        return [lane.items[offset] for offset in lane.order]

    @property
    def in_flight(self) -> int:
        """Events tracked and not yet completed, over all partitions."""
        return self._unreleased - self._completed_unreleased

    def __len__(self) -> int:
        """Events tracked and not yet released, over all partitions."""
        return self._unreleased
