"""Where a call stands behind the client's own earlier calls to the same model, so a read timeout measures
the server's work on it, not the queue the client itself made.

A server with few slots answers the calls in flight one after another: with 16 in flight and 4 s a call,
the last one waits a minute before the server starts on it. Timed from its start, that call looked hung and
was cut at the 60 s read timeout (a real llama.cpp server on a busy machine: 16 timeouts of 100 calls),
though the server was answering every 4 s. So a call counts as *at the front* once as many calls to its
model have finished since it started as were in flight before it (the server's queue is first come, first
served as far as the client can tell); its timeout runs from then. Before that it is cut only if the
server answers nothing at all for a whole timeout: a hung server still costs one timeout, not more (calls
the client gave up on are no answers, so they do not restart the others' clocks).

Time is passed in; nothing here waits.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass


@dataclass
class Place:
    """One call's place: the calls in flight before it, the finished count when it started, and when it
    was first seen at the front (None: not yet)."""

    model: str
    ahead: int
    finished_before: int
    started: float
    front_at: float | None = None


class OwnQueue:
    """Per model: calls in flight, calls answered, and when the last one was. Only a model with a call in
    flight has an entry (no :class:`Place` of it is left once its last call finished), so the entries are
    bounded by the calls in flight, whatever model names the requests carry."""

    def __init__(self) -> None:
        self._in_flight: defaultdict[str, int] = defaultdict(int)
        self._finished: defaultdict[str, int] = defaultdict(int)
        self._last_finished_at: defaultdict[str, float] = defaultdict(lambda: -math.inf)

    def start(self, model: str, now: float) -> Place:
        ahead = self._in_flight[model]
        place = Place(model, ahead, self._finished[model], now, now if ahead == 0 else None)
        self._in_flight[model] += 1
        return place

    def finish(self, place: Place, now: float, answered: bool) -> None:
        """The call is over; ``answered``: the server answered it (any HTTP response). One the client gave up
        on (a timeout, a broken connection) is no sign of progress and may still hold the server's slot."""
        model = place.model
        self._in_flight[model] -= 1
        if answered:
            self._finished[model] += 1
            self._last_finished_at[model] = now
        if self._in_flight[model] <= 0:
            for counts in (self._in_flight, self._finished, self._last_finished_at):
                counts.pop(model, None)

    def in_flight(self, model: str) -> int:
        """Calls of ``model`` in flight now."""
        return self._in_flight.get(model, 0)

    def served_for_s(self, place: Place, now: float) -> float | None:
        """How long the server has had the call to itself (seconds since it reached the front), or None
        while calls sent before it are still out."""
        if place.front_at is None and self._finished[place.model] - place.finished_before >= place.ahead:
            place.front_at = now
        return None if place.front_at is None else now - place.front_at

    def idle_for_s(self, place: Place, now: float) -> float:
        """Seconds since the server last finished a call of the model, or since this call started."""
        return now - max(place.started, self._last_finished_at[place.model])

    def overdue(self, place: Place, timeout_s: float, now: float) -> bool:
        """Whether the call has outlived ``timeout_s``: from the front, or, behind earlier calls, with the
        server silent for that long."""
        served = self.served_for_s(place, now)
        return (served if served is not None else self.idle_for_s(place, now)) > timeout_s
