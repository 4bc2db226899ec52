"""Whether records more urgent than a priority's are on their way (design §5.11, reading and the gate's yield).

The worker notes each input record as it reaches an agent (:meth:`UrgentRecords.reached`) and each record taken
while it waits for a dispatcher slot (:meth:`UrgentRecords.submitting`). From those, a priority's records learn
whether more urgent ones are *arriving* (a more urgent topic has records that have not reached their agent:
:func:`streamproc.app.unread_inputs.unread_topics`) or *coming* to the gate (arriving, taken and waiting for a slot,
or waiting in memory for room), and hold back for a bounded time. Both answers are kept for :data:`FRESH_S`: every
record waiting in memory asks at each record given back, and the gate asks for every waiting call at each wake.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from streamproc.app.unread_inputs import fetched_partitions, unread_topics
from streamproc.core.tenant_share import more_urgent

FRESH_S = 0.05


class UrgentRecords:
    """``consumer()``: faust's consumer; ``urgent_topics``: per priority, the more urgent priorities' topics;
    ``waiting_priorities()``: the priorities of records waiting in memory; ``gate_left_idle()``: every
    dispatcher slot is taken while the gate could start more calls (urgent records not yet holding a slot cannot
    come before a call ends, so a call yielding to them would only leave the gate idle);
    ``stopping()``: a rebalance or stop is under way (it waits for the calls in hand: none is held back);
    ``peer_topics``: per requests topic, the other tenant groups' topics of its priority."""

    def __init__(self, consumer: Callable[[], Any], urgent_topics: Mapping[str, frozenset[str]],
                 waiting_priorities: Callable[[], set[str]], gate_left_idle: Callable[[], bool],
                 stopping: Callable[[], bool], clock: Callable[[], float] = time.monotonic,
                 peer_topics: Mapping[str, frozenset[str]] | None = None) -> None:
        self._consumer = consumer
        self._urgent_topics = urgent_topics
        self._peer_topics = peer_topics or {}
        self._waiting_priorities = waiting_priorities
        self._gate_left_idle = gate_left_idle
        self._stopping = stopping
        self._clock = clock
        self._reached: dict[Any, int] = {}  # per input partition: the offset of the last record that reached its agent
        self._submitting: Counter[str] = Counter()  # per priority: records taken, waiting for a dispatcher slot
        self._arriving_known: dict[str, tuple[float, bool]] = {}  # priority -> (when asked, the answer)
        self._coming_known: dict[str, tuple[float, bool]] = {}
        self._peers_known: dict[str, tuple[float, bool]] = {}  # topic -> (when asked, the answer)

    def reached(self, tp: Any, offset: int) -> None:
        """A record came out of its agent's buffer."""
        self._reached[tp] = offset

    def revoked(self, tps: Iterable[Any]) -> None:
        """Partitions taken away: assigned again, they are read from their committed offset."""
        for tp in tps:
            self._reached.pop(tp, None)

    @contextlib.contextmanager
    def submitting(self, priority: str) -> Iterator[None]:
        """Around the wait of a record taken for a dispatcher slot."""
        self._submitting[priority] += 1
        try:
            yield
        finally:
            self._submitting[priority] -= 1

    def arriving(self, priority: str) -> bool:
        """Whether a topic more urgent than ``priority``'s has records that have not reached their agent yet."""
        return self._unread(self._arriving_known, priority, self._urgent_topics.get(priority))

    def peers_arriving(self, topic: str) -> bool:
        """Whether another tenant group's topic of ``topic``'s priority has records that have not reached their
        agent yet."""
        return self._unread(self._peers_known, topic, self._peer_topics.get(topic))

    def _unread(self, known: dict[str, tuple[float, bool]], key: str, topics: frozenset[str] | None) -> bool:
        """Whether any of ``topics`` has records that have not reached their agent (kept in ``known`` a moment)."""
        if not topics:
            return False
        return self._known(known, key, lambda: bool(unread_topics(consumer := self._consumer(), topics, self._reached,
                                                                  fetched_partitions(consumer))))

    def coming(self, priority: str) -> bool:
        """Whether calls more urgent than ``priority``'s are on their way to the gate: arriving, taken and waiting for
        a dispatcher slot, or waiting in memory for room."""
        urgent = more_urgent(priority)
        if not urgent:
            return False
        return self._known(self._coming_known, priority, lambda: self._on_their_way(urgent, priority))

    def _on_their_way(self, urgent: tuple[str, ...], priority: str) -> bool:
        if self._stopping() or self._gate_left_idle():
            return False
        waiting = self._waiting_priorities()
        return any(self._submitting[other] > 0 or other in waiting for other in urgent) or self.arriving(priority)

    def _known(self, known: dict[str, tuple[float, bool]], priority: str, ask: Callable[[], bool]) -> bool:
        now = self._clock()
        answer = known.get(priority)
        if answer is None or now - answer[0] > FRESH_S:
            answer = now, ask()
            known[priority] = answer
        return answer[1]
