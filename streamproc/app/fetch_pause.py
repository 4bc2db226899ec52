"""Stop faust fetching a topic's partitions while its agent holds off for more urgent records on their way.

The Kafka client hands fetched records over partition by partition in the order they were fetched, so records of a
``high`` topic fetched after a ``low`` flood's wait until the ``low`` data fetched before them is handed over, or until
faust stops taking from the ``low`` partitions because their agent's buffer reached its pressure mark (at the
handing-over pace, seconds for thousands of records). Marking the ``low`` partitions as buffered, as faust does at that
mark, skips them at once; they are given back when the hold ends, unless their buffer is at its mark (faust gives them
back itself once it drains). A rebalance resets what faust fetches: a pause of an earlier generation is forgotten.
"""

from __future__ import annotations

from typing import Any

from streamproc.app.faust_app import under_pressure


class FetchPause:
    """The partitions of each topic this worker stopped fetching, by consumer generation."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._paused: dict[str, tuple[int, set[Any]]] = {}  # topic -> (generation, its partitions paused)

    def pause(self, topic: str) -> None:
        """Stop fetching ``topic``'s partitions assigned to this worker (until :meth:`resume`)."""
        consumer = self._app.consumer
        partitions = {tp for tp in consumer.assignment() if tp.topic == topic}
        for tp in partitions:
            consumer.on_buffer_full(tp)
        self._paused[topic] = (self._app.consumer_generation_id, partitions)

    def resume(self, topic: str, queued: int, maxsize: int) -> None:
        """Fetch ``topic`` again, unless its agent's buffer (``queued`` of ``maxsize``) is at faust's pressure mark."""
        generation, partitions = self._paused.pop(topic, (None, set()))
        if generation != self._app.consumer_generation_id or under_pressure(queued, maxsize):
            return
        consumer = self._app.consumer
        assigned = consumer.assignment()
        for tp in partitions & set(assigned):
            consumer.on_buffer_drop(tp)
