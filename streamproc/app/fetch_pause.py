"""Stop faust fetching a topic's partitions while its agent holds off for more urgent records on their way.

The Kafka client hands fetched records over partition by partition in the order they were fetched, so records of a
``high`` topic fetched after a ``low`` flood's wait until the ``low`` data fetched before them is handed over, or until
faust stops taking from the ``low`` partitions because their agent's buffer reached its pressure mark (at the
handing-over pace, seconds for thousands of records). Marking the ``low`` partitions as buffered, as faust does at that
mark, skips them at once; they are given back when the hold ends, unless their buffer is at its mark (faust gives them
back itself once it drains). A rebalance resets what faust fetches: a pause of an earlier generation is forgotten.
A hold that ran out of time (the awaited records never came: their agent is blocked, their tenant waits for its
quota) leaves the topic unpaused for :data:`COOLDOWN_S`: its buffer then fills as before, and the hold, which lasts
only while the buffer takes a whole fetch, ends, so a lower priority is never held to one record per hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

COOLDOWN_S = 10.0


class FetchPause:
    """The partitions of each topic this worker stopped fetching, by consumer generation."""

    def __init__(self, app: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._app = app
        self._clock = clock
        self._paused: dict[str, tuple[int, set[Any]]] = {}  # topic -> (generation, its partitions paused)
        self._not_before: dict[str, float] = {}  # topic -> when it may be paused again

    def pause(self, topic: str) -> None:
        """Stop fetching ``topic``'s partitions assigned to this worker (until :meth:`resume`), unless a hold of it
        ran out of time within :data:`COOLDOWN_S`."""
        if self._clock() < self._not_before.get(topic, 0.0):
            return
        consumer = self._app.consumer
        partitions = {tp for tp in consumer.assignment() if tp.topic == topic}
        for tp in partitions:
            consumer.on_buffer_full(tp)
        self._paused[topic] = (self._app.consumer_generation_id, partitions)

    def resume(self, topic: str, at_mark: bool = False, ran_out: bool = False) -> None:
        """Fetch ``topic`` again, unless its agent's buffer is at faust's pressure mark (``at_mark``: faust gives the
        partitions back itself once it drains); ``ran_out``: the hold ended by its time limit, with the awaited records
        still on their way."""
        if ran_out:
            self._not_before[topic] = self._clock() + COOLDOWN_S
        generation, partitions = self._paused.pop(topic, (None, set()))
        if generation != self._app.consumer_generation_id or at_mark:
            return
        consumer = self._app.consumer
        assigned = consumer.assignment()
        for tp in partitions & set(assigned):
            consumer.on_buffer_drop(tp)
