"""Bounded concurrency with ordered acks: hundreds of LLM calls in flight, nothing acked out of order.

faust's ``concurrency=N`` can commit past a message still in flight (faust-streaming #606), so the worker
takes events one at a time (``concurrency=1``, ``noack()``), runs each in its own task under a semaphore,
and acks a partition's events only as a contiguous completed prefix (design §5).

A record whose work raises, or that its handler holds, can never complete, so its partition can never
commit again: that is never left silent. ``on_stuck`` hears of it (the worker stops loudly, so the record
is read again by a worker that can write its outcome).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

from streamproc.app.handler import Disposition
from streamproc.core.acker import OrderedAcker

Ack = Callable[[], Awaitable[object]]
OnStuck = Callable[[Hashable, int, str], None]  # (lane, offset, why)

log = logging.getLogger(__name__)


class Dispatcher:
    """Runs handler calls concurrently (at most ``limit``) and releases their acks in offset order."""

    def __init__(self, limit: int, on_stuck: OnStuck | None = None, waiting_room: int | None = None) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._waiting_room = asyncio.Semaphore(waiting_room if waiting_room is not None else 4 * limit)
        self._waiting = 0
        self._on_stuck = on_stuck
        self._acker: OrderedAcker[Ack] = OrderedAcker()
        self._tasks: set[asyncio.Task[None]] = set()
        self._acking = asyncio.Lock()  # FIFO: acks released by different tasks never overtake each other
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        """Records being handled (not those still waiting for their due time)."""
        return len(self._tasks) - self._waiting

    @property
    def slots_full(self) -> bool:
        """Whether every slot is taken (a record handed over now would wait for one)."""
        return self._slots.locked()

    async def submit(self, lane: Hashable, offset: int, work: Callable[[], Awaitable[Disposition]],
                     ack: Ack, wait: Callable[[], Awaitable[object]] | None = None, call: bool = True) -> None:
        """Wait for a free slot, then start ``work``; ``ack`` runs once it and every lower offset are done.

        ``lane`` is the partition (with the consumer generation, so a partition handed back after a
        rebalance starts a fresh lane). The task copies the caller's context, so faust's current event
        (a contextvar) stays the one being handled, which table writes need.

        With ``wait`` (a retry-tier record not yet due), the record takes a place in the waiting room instead
        of a slot: it awaits ``wait()`` there, then a slot, then runs ``work``. So records sleep side by side
        without holding call slots, and one record due later never holds up the records behind it (sleeping
        in the agent's loop would, for every partition of the tier); the waiting room's size bounds them.

        ``call=False`` (a record parked on the backlog: a send, no LLM call) runs ``work`` in a place of the waiting
        room instead of a slot, so parking goes on while every slot is held by the calls it reaches past.
        """
        room = self._slots if wait is None and call else self._waiting_room
        await room.acquire()
        try:
            self._acker.track(lane, offset, ack)
        except BaseException:
            room.release()  # a rejected event must not keep its place
            raise
        if not call:
            self._waiting += 1
            task = asyncio.create_task(self._run_without_slot(lane, offset, work))
        elif wait is None:
            task = asyncio.create_task(self._run(lane, offset, work))
        else:
            self._waiting += 1
            task = asyncio.create_task(self._run_when(lane, offset, wait, work))
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def _run_when(self, lane: Hashable, offset: int, wait: Callable[[], Awaitable[object]],
                        work: Callable[[], Awaitable[Disposition]]) -> None:
        try:
            await wait()
        except Exception:  # a broken wait must not lose the record: it runs now, and its work decides
            log.exception("waiting for the record at offset %d of %s failed; handling it now", offset, lane)
        finally:
            self._waiting -= 1
            self._waiting_room.release()
        await self._slots.acquire()
        await self._run(lane, offset, work)

    async def _run_without_slot(self, lane: Hashable, offset: int, work: Callable[[], Awaitable[Disposition]]) -> None:
        try:
            await self._run(lane, offset, work, self._waiting_room)
        finally:
            self._waiting -= 1

    async def _run(self, lane: Hashable, offset: int, work: Callable[[], Awaitable[Disposition]],
                   place: asyncio.Semaphore | None = None) -> None:
        why = "its handler holds it"
        try:
            disposition = await work()
        except Exception as exc:  # the handler never raises; this is a requeue or a bug: never lose it silently
            log.exception("record at offset %d of %s could not be handled", offset, lane)
            disposition, why = Disposition.HOLD, f"{type(exc).__name__}: {exc}"
        finally:
            (place or self._slots).release()
        if disposition is Disposition.HOLD:
            if self._on_stuck is not None:
                self._on_stuck(lane, offset, why)
            return
        if disposition is Disposition.ACK:
            released = self._acker.complete(lane, offset)
            if released:
                async with self._acking:  # an ack that awaits must not let a later release ack before it
                    for ack in released:
                        await ack()

    def retire(self, lane: Hashable) -> None:
        """``lane`` gets no new record (its consumer generation ended): forget it once its acks are released."""
        self._acker.retire(lane)

    @property
    def lanes(self) -> int:
        return self._acker.lanes

    async def wait_idle(self) -> None:
        """Return once no task runs (used to drain before a deliberate stop)."""
        await self._idle.wait()
