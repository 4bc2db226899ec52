"""Four fixes to faust-streaming 0.15.3's offset bookkeeping, without which a worker can lose requests or state.

Seen in the SIGKILL test, about 1 restart in 6 on a loaded machine, always on partitions with no committed
offset yet (the worker died before its first commit):

1. **Records cleared from the stream queue.** When table recovery ends, faust resumes the stream
   partitions, then awaits ``perform_seek()``, then calls ``flow_control.resume()``, which clears every
   channel queue (faust creates them with ``clear_on_resume=True``). Records fetched during the seek are
   dropped without an ack. Here the resume of the stream partitions waits until the seek is done, so no
   fetch can happen between it and the queue-clearing resume.
2. **A whole backlog consumed while paused.** faust hands its *live* set of active partitions to the fetch,
   which runs in the consumer thread; when recovery pauses the changelog partitions, that set can become
   empty while the fetch waits, and aiokafka reads an empty set as "every partition". The stream records it
   returns are then dropped as inactive, and a partition without a committed offset is never sought back
   (aiokafka seeks only to a committed offset > 0). Here each fetch gets a snapshot, an empty one fetches
   nothing, and partitions without a committed offset are sought to their first offset after the seek.

3. **Records acked that no agent saw.** A stream drops a record fetched before a rebalance (old consumer
   generation) or while flow control is off, and *acks* it, so its offset counts as done. When the same
   partition comes back to this worker, that stale ack fills the acked offsets of the new generation: the
   next commit can pass the record (and, with no committed offset or offset 0, every record before it)
   while no agent ever handled it. A retry-tier record lost this way leaves its request ``retrying``
   forever (issue 13: two workers, three SIGKILLs, 8 requests stranded). Here only records an agent took
   (faust marks them *tracked*) are acked; a dropped one is simply fetched again from the committed offset.

4. **A commit that passes state writes not yet sent.** Before committing offsets faust flushes its producer
   buffer, where table writes (the state changelog) wait to be handed to aiokafka; but that flush returns as
   soon as no message left the buffer for 0.1 s, and it never waits for the one being handed over. With a
   slow or restarting broker the commit then passes records whose state writes are still in memory: a
   SIGKILL loses them, and the reconciler later sees a finished request as ``in_flight`` and calls it again.
   Here the flush waits until the buffer is empty and no hand-over is under way.

A dropped record becomes a lost request because faust then commits past it: with no committed offset,
``Consumer._new_offset`` does not check the head of the acked offsets. Importing this module applies the
fixes once; :func:`streamproc.app.faust_app.make_faust_app` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.producer import ProducerBuffer

_recovery_completed: Callable[..., Awaitable[None]] = Recovery.on_recovery_completed
_fetch_records: Callable[..., Awaitable[Any]] = AIOKafkaConsumerThread._fetch_records
_ack: Callable[[Any, Any], bool] = Consumer.ack
_send_pending: Callable[[Any, Any], Awaitable[None]] = ProducerBuffer._send_pending
HANDOVER_POLL_S = 0.01


async def _on_recovery_completed(self: Any, generation_id: int = 0) -> None:
    """faust's own completion, with the stream partitions resumed only after the seek (fix 1) and the
    partitions without a committed offset sent back to their first offset (fix 2)."""
    consumer = self.app.consumer
    held: set[Any] = set()
    seek_to_committed = consumer.perform_seek

    def hold(partitions: Iterable[Any]) -> None:
        held.update(partitions)

    async def seek_then_resume() -> None:
        await seek_to_committed()
        streams = [tp for tp in held if tp in consumer.assignment()]
        uncommitted = [tp for tp in streams if consumer._committed_offset.get(tp) is None]
        if uncommitted:
            earliest = await consumer.earliest_offsets(*uncommitted)
            for tp in uncommitted:
                await consumer.seek(tp, earliest[tp])
        del consumer.resume_partitions  # the class's method again
        consumer.resume_partitions(set(streams))  # faust's next step clears the queues, with no await between

    consumer.resume_partitions = hold
    consumer.perform_seek = seek_then_resume
    try:
        await _recovery_completed(self, generation_id)
    finally:
        for name in ("resume_partitions", "perform_seek"):
            consumer.__dict__.pop(name, None)


async def _fetch_active_records(self: Any, consumer: Any, active_partitions: Any, **kwargs: Any) -> Any:
    """Fetch the partitions active when the fetch starts, and nothing when none is (fix 2); ``None`` (a
    client-only app) still means every partition."""
    if active_partitions is None:
        return await _fetch_records(self, consumer, None, **kwargs)
    partitions = set(active_partitions)
    if not partitions:
        return {}
    return await _fetch_records(self, consumer, partitions, **kwargs)


def _ack_taken(self: Any, message: Any) -> bool:
    """faust's ack for a record an agent took; a record the stream dropped unseen is not done (fix 3)."""
    if not message.tracked:
        return False
    return _ack(self, message)


async def _send_counted(self: Any, fut: Any) -> None:
    """faust's hand-over of one buffered message to aiokafka, counted while under way (fix 4)."""
    self.__dict__["handing_over"] = self.__dict__.get("handing_over", 0) + 1
    try:
        await _send_pending(self, fut)
    finally:
        self.handing_over -= 1


async def _flush_all(self: Any) -> None:
    """Until every buffered message is with aiokafka (fix 4); faust's check still refuses a stopped producer
    that holds messages."""
    while self.size or self.__dict__.get("handing_over", 0):
        await self.flush_atmost(None)
        if not self.size:  # the last one is being handed over
            await asyncio.sleep(HANDOVER_POLL_S)


Recovery.on_recovery_completed = _on_recovery_completed  # type: ignore[method-assign]
AIOKafkaConsumerThread._fetch_records = _fetch_active_records  # type: ignore[method-assign,assignment]
Consumer.ack = _ack_taken  # type: ignore[method-assign]
ProducerBuffer._send_pending = _send_counted  # type: ignore[method-assign]
ProducerBuffer.flush = _flush_all  # type: ignore[method-assign]
