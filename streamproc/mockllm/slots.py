"""Slots: at most N requests worked on at once, the others wait their turn in arrival order.

This is how llama.cpp's server behaves with ``--parallel N``: a request that finds every slot busy waits,
and its own generation time starts only when it gets one, so with one slot the answers come one after the
other and a client's latency is mostly queueing. A waiter that leaves (its client gave up, or the server is
stopping) leaves the queue; a slot is handed straight to the next waiter, so nobody can jump the queue.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any


class SlotQueue:
    """A FIFO semaphore of ``slots`` that counts its queue for ``/stats``."""

    def __init__(self, slots: int, clock: Callable[[], float]) -> None:
        self.slots = slots
        self.busy = 0
        self._clock = clock
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._closed = False
        self.reset()

    def reset(self) -> None:
        """Forget the history (the requests at work and in the queue stay where they are)."""
        self.max_queued = len(self._waiters)
        self.queued_seconds = 0.0
        self.arrived = 0  # requests that asked for a slot
        self.waited = 0  # requests that found every slot busy
        self.abandoned = 0  # of those, the ones that left the queue before their turn

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> bool:
        """Wait for a slot in arrival order; False if the server closed the queue (no slot was taken)."""
        if self._closed:
            return False
        self.arrived += 1
        if self.busy < self.slots and not self._waiters:
            self.busy += 1
            return True
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self.waited += 1
        self.max_queued = max(self.max_queued, len(self._waiters))
        started = self._clock()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                if waiter.result():
                    self.release()  # the slot came just as the client left: pass it on
            elif waiter in self._waiters:  # release() may have dropped it already
                self._waiters.remove(waiter)
            self.abandoned += 1
            raise
        finally:
            self.queued_seconds += self._clock() - started

    def release(self) -> None:
        """Hand the slot to the next waiter, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)  # busy stays: the slot changes hands
                return
        self.busy -= 1

    def close(self) -> None:
        """The server is stopping: every waiter gives up at once, and nobody queues any more."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)

    def describe(self) -> dict[str, Any]:
        return {
            "slots": self.slots,
            "busy": self.busy,
            "queued": self.queued,
            "arrived": self.arrived,
            "max_queued": self.max_queued,
            "waited": self.waited,
            "abandoned": self.abandoned,
            "queued_s_total": round(self.queued_seconds, 3),
        }
