"""Seven fixes to faust-streaming 0.15.3's offset bookkeeping, without which a worker can lose requests or state.

They bite after a crash or a rebalance, mostly on partitions with no committed offset yet (the worker died
before its first commit); design §5.6 tells how each was found:

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
   nothing, and every stream partition is sought again after faust's seek, before it resumes: to its
   committed offset, or its first one when it has none (a fetch that ended while faust's seek ran can
   have moved the position past records then dropped as inactive).

3. **Records acked that no agent saw.** A stream drops a record fetched before a rebalance (old consumer
   generation) or while flow control is off, and *acks* it, so its offset counts as done. When the same
   partition comes back to this worker, that stale ack fills the acked offsets of the new generation: the
   next commit can pass the record (and, with no committed offset or offset 0, every record before it)
   while no agent ever handled it. A retry-tier record lost this way leaves its request ``retrying``
   forever. Here only records an agent took (faust marks them *tracked*) are acked; a dropped one is
   simply fetched again from the committed offset.

4. **A commit that passes state writes not yet sent.** Before committing offsets faust flushes its producer
   buffer, where table writes (the state changelog) wait to be handed to aiokafka; but that flush returns as
   soon as no message left the buffer for 0.1 s, and it never waits for the one being handed over. With a
   slow or restarting broker the commit then passes records whose state writes are still in memory: a
   SIGKILL loses them, and the reconciler later sees a finished request as ``in_flight`` and calls it again.
   Here the flush waits until the buffer is empty and no hand-over is under way. (The state table's writes
   do not pass through that buffer: ``TableStore`` in app/worker.py hands them to aiokafka itself. The fix
   covers faust's own table writes, e.g. the roundtrip tool's table.)

5. **Records skipped, then committed as a gap.** faust takes any jump in the offsets it delivers for
   a partition as a gap in the log (compaction, transaction markers) and counts the missing offsets *and
   the record that revealed the jump* as done. A seek resets faust's read offset to the committed one,
   so a record fetched before the seek and delivered after it (offset 69 where 36 comes next) opens a
   "gap" over 36..68; the records read again from 36 are then dropped as older than the read offset,
   and faust's head check lets the commit pass 36 because it tolerates one missing offset there
   (faust-streaming #606), and any number when the committed offset is 0. This path is inferred from the
   offsets of one loss, not observed step by step (design §5.6). streamproc's request and retry topics have
   no gaps (no compaction, no transactions). Here, on the topics the worker names, a jump over records that
   are still in the log is never counted as done: the worker is told and stops loudly, so that the
   partition is read again from its committed offset. Records deleted by retention
   before they were read are still a gap (with a warning). And on those topics a commit never passes an
   offset that was neither acked nor a gap: the head check is exact, for a committed offset of 0 too, and
   a partition with none committed yet starts from the offset fix 2 sought it to. For the jump to show,
   fix 2 also sets faust's read offset to one before where reading starts (faust sets the start itself,
   or none for offset 0, which hides a jump over the first record or from the start).

6. **A record of a partition with no handler crashes the fetcher.** faust's conductor looks each record's
   partition up in its handler map with a plain ``dict`` lookup; the map follows the assignment only once
   faust's ``on_partitions_assigned`` has reached the conductor, after awaiting the agents, and a
   resubscription rebuilds it from the current assignment alone. A record fetched in that window (its
   partition just assigned, or just taken away) raised ``KeyError`` in the fetcher's drain, which stopped the
   worker's reading for good. Inferred, not reproduced: a rolling upgrade's worker stopped so, with
   ``KeyError(TopicPartition(... requests, 7))`` in the drain at the rebalance after another worker left,
   and this lookup is the drain's one plain-``dict`` access by partition. Here such a record is left
   unread and unacked, like the records of fix 3: the rebalance ends with every stream partition sought to
   its committed offset (fix 2), so it is fetched again by whoever then holds its partition.

7. **Acks of an earlier generation counted in the next.** faust forgets a partition's acked offsets when the
   partition is revoked, *before* it waits for the records in hand; a record of the old generation acked after
   that (a waiting record parked at the rebalance, a call that ended then) lands in the emptied list, and when
   the partition comes back to this worker the stale ack counts for the new generation, which reads the record
   again from the committed offset: a commit can pass the copy in hand while it runs, and a SIGKILL then leaves
   its request ``in_flight`` behind a committed offset, for the reconciler to re-drive a minute later (the chaos
   run with priorities: 40 such re-drives in one run, after a broker restart held a commit for 31 s; design
   §5.6). Here a record fetched in an earlier generation than the consumer's is never acked, and an assignment
   starts its partitions with no acked offsets.

A dropped record becomes a lost request because faust then commits past it: with no committed offset,
``Consumer._new_offset`` does not check the head of the acked offsets. Importing this module applies the
fixes once; :func:`streamproc.app.faust_app.make_faust_app` does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from faust.tables.recovery import Recovery
from faust.transport.conductor import Conductor
from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.producer import ProducerBuffer

_recovery_completed: Callable[..., Awaitable[None]] = Recovery.on_recovery_completed
_fetch_records: Callable[..., Awaitable[Any]] = AIOKafkaConsumerThread._fetch_records
_ack: Callable[[Any, Any], bool] = Consumer.ack
_on_partitions_assigned: Callable[..., Awaitable[None]] = Consumer.on_partitions_assigned
_send_pending: Callable[[Any, Any], Awaitable[None]] = ProducerBuffer._send_pending
_new_offset: Callable[[Any, Any], int | None] = Consumer._new_offset
_add_gap: Callable[[Any, Any, int, int], Awaitable[None]] = Consumer._add_gap
_compile_message_handler: Callable[[Any], Any] = Conductor._compile_message_handler
HANDOVER_POLL_S = 0.01
START_OFFSETS = "_streamproc_start_offsets"  # per stream partition, where reading started after recovery
SKIP_WATCH = "_streamproc_skip_watch"  # on the app: the gapless topics and who hears of skipped records
log = logging.getLogger(__name__)
OnSkipped = Callable[[str, int, int, int], None]  # topic, partition, first and last offset skipped


@dataclass(frozen=True)
class _SkipWatch:
    topics: frozenset[str]
    on_skipped: OnSkipped


def watch_skipped_records(app: Any, topics: Collection[str], on_skipped: OnSkipped) -> None:
    """Name the topics that have no offset gaps, and who hears of records skipped on them (fix 5)."""
    app.__dict__[SKIP_WATCH] = _SkipWatch(frozenset(topics), on_skipped)


def _gapless_watch(consumer: Any, tp: Any) -> _SkipWatch | None:
    """The skip watch when ``tp`` is on a topic the worker named as gapless (fix 5), else None."""
    watch: _SkipWatch | None = consumer.app.__dict__.get(SKIP_WATCH)
    return watch if watch is not None and tp.topic in watch.topics else None


async def _on_recovery_completed(self: Any, generation_id: int = 0) -> None:
    """faust's own completion, with the stream partitions resumed only after the seek (fix 1), and each
    sought again after it, to its first offset when it has no committed one (fix 2)."""
    consumer = self.app.consumer
    held: set[Any] = set()
    seek_to_committed = consumer.perform_seek

    def hold(partitions: Iterable[Any]) -> None:
        held.update(partitions)

    async def seek_then_resume() -> None:
        await seek_to_committed()
        streams = sorted(tp for tp in held if tp in consumer.assignment())
        committed = {tp: consumer._committed_offset.get(tp) for tp in streams}
        uncommitted = [tp for tp in streams if committed[tp] is None]
        earliest = await consumer.earliest_offsets(*uncommitted) if uncommitted else {}
        starts = {tp: earliest[tp] if committed[tp] is None else committed[tp] for tp in streams}
        for tp, start in starts.items():  # again: a fetch that ended during faust's seek may have moved it on
            await consumer.seek(tp, start)
        for tp, start in starts.items():  # read last: one before the start (faust says the start itself, or
            consumer._read_offset[tp] = start - 1  # None for 0), so that any jump after it is seen (fix 5)
        consumer.__dict__.setdefault(START_OFFSETS, {}).update(starts)
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
    """faust's ack for a record an agent took; a record the stream dropped unseen is not done (fix 3), nor a
    record of an earlier consumer generation (fix 7: the new one reads it again from the committed offset)."""
    if not message.tracked:
        return False
    if message.generation_id is not None and message.generation_id != self.app.consumer_generation_id:
        return False
    return _ack(self, message)


async def _assigned_unacked(self: Any, assigned: Any, generation_id: int = 0) -> None:
    """faust's assignment, each partition starting with no acked offsets (fix 7: acks made after its revoke,
    before this assignment, were the earlier generation's)."""
    for tp in assigned:
        self._acked.pop(tp, None)
        self._acked_index.pop(tp, None)
    await _on_partitions_assigned(self, assigned, generation_id)


async def _send_counted(self: Any, fut: Any) -> None:
    """faust's hand-over of one buffered message to aiokafka, counted while under way (fix 4)."""
    self.__dict__["handing_over"] = self.__dict__.get("handing_over", 0) + 1
    try:
        await _send_pending(self, fut)
    finally:
        self.handing_over -= 1


async def _flush_all(self: Any) -> None:
    """Until every buffered message is with aiokafka (fix 4), polled: faust's flush waits for each message
    under a timeout of its own, which costs CPU for every record. As in faust, a producer that stopped with
    messages in its buffer is refused."""
    while self.size or self.__dict__.get("handing_over", 0):
        if self.state != "running" and self.size:
            raise RuntimeError("Cannot flush: Producer not Running")
        await asyncio.sleep(HANDOVER_POLL_S)


async def _add_gap_checked(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
    """faust's gap, on a gapless topic only for records retention deleted before they were read (fix 5).

    ``offset_to`` is the record that revealed the jump: it is delivered, not part of the gap."""
    watch = _gapless_watch(self, tp)
    if watch is None:
        return await _add_gap(self, tp, offset_from, offset_to)
    committed = self._committed_offset[tp]
    first = offset_from if committed is None else min(offset_from, committed)
    try:
        earliest = (await self.earliest_offsets(tp)).get(tp)
    except Exception:  # the broker did not say: take the records as skipped, the safe side
        log.warning("%s[%d]: could not read the earliest offset", tp.topic, tp.partition, exc_info=True)
        earliest = None
    if earliest is not None and earliest >= offset_to:
        log.warning("%s[%d]: offsets %d..%d were deleted by retention before they were read", tp.topic,
                    tp.partition, first, offset_to - 1)
        self._gap[tp].addi(first, offset_to)
        return
    log.critical("%s[%d]: the consumer delivered offset %d after %d: offsets %d..%d, still in the log, were "
                 "skipped; they are not committed past", tp.topic, tp.partition, offset_to, offset_from - 1,
                 first, offset_to - 1)
    watch.on_skipped(tp.topic, tp.partition, first, offset_to - 1)


def _covered(gaps: Any, start: int, end: int) -> bool:
    """Whether the gap intervals cover every offset in [start, end)."""
    reached = start
    for gap in sorted(gaps.overlap(start, end), key=lambda interval: interval.begin):
        if gap.begin > reached:
            return False
        reached = max(reached, gap.end)
    return reached >= end


def _new_offset_exact(self: Any, tp: Any) -> int | None:
    """faust's next offset to commit, withheld on a gapless topic while the committed offset itself is
    neither acked nor in a gap (fix 5: faust lets one missing offset through, and any when the committed
    offset is 0; with none committed, the head is where reading started). Other topics keep faust's
    tolerance, which its own gaps need: they start one past the committed offset."""
    acked = self._acked[tp]
    if acked and _gapless_watch(self, tp) is not None:
        committed = self._committed_offset[tp]
        if committed is None:  # nothing committed yet: the head is where reading started (fix 2's seek)
            committed = self.__dict__.get(START_OFFSETS, {}).get(tp)
        head = min(acked)
        if committed is not None and head > committed and not _covered(self._gap[tp], committed, head):
            return None
    return _new_offset(self, tp)


def _compile_unassigned_tolerant_handler(self: Any) -> Callable[[Any], Awaitable[None]]:
    """faust's record dispatch, where a record whose partition has no handler (yet, or any more) is left
    unread instead of raising in the fetcher (fix 6)."""
    if self.app.client_only:
        return _compile_message_handler(self)  # type: ignore[no-any-return]
    handlers: dict[Any, Any] = self._tp_to_callback  # cleared and refilled in place, never replaced
    unhandled: set[Any] = set()  # partitions already said, so a fetch of them does not log every record

    async def on_message(message: Any) -> None:
        async with self._tp_to_callback_lock:
            handler = handlers.get(message.tp)
        if handler is not None:
            unhandled.discard(message.tp)
            return await handler(message)  # type: ignore[no-any-return]
        if message.tp not in unhandled:
            unhandled.add(message.tp)
            log.warning("%s[%d]: a record at offset %d arrived for a partition this worker has no handler for "
                        "(a rebalance under way); left unread, it is read again from the committed offset",
                        message.tp.topic, message.tp.partition, message.offset)
        return None

    return on_message


Recovery.on_recovery_completed = _on_recovery_completed  # type: ignore[method-assign]
AIOKafkaConsumerThread._fetch_records = _fetch_active_records  # type: ignore[method-assign,assignment]
Consumer.ack = _ack_taken  # type: ignore[method-assign]
Consumer.on_partitions_assigned = _assigned_unacked  # type: ignore[method-assign]
ProducerBuffer._send_pending = _send_counted  # type: ignore[method-assign]
ProducerBuffer.flush = _flush_all  # type: ignore[method-assign]
Consumer._add_gap = _add_gap_checked  # type: ignore[method-assign]
Consumer._new_offset = _new_offset_exact  # type: ignore[method-assign]
Conductor._compile_message_handler = _compile_unassigned_tolerant_handler  # type: ignore[method-assign]
