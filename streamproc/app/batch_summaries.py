"""A worker keeps each batch's counts per partition it owns and publishes them to the summary topic (design §4,
batch summaries); the requests that name no batch are counted as the batch None, the stream.

Counts of a partition are built from its RocksDB store once the partition is this worker's and restored (a scan of
its states in key order, in chunks, so the loop goes on meanwhile), then moved by every state write (TableStore: the
replaced state's share out, the new one's in; the replaced state is the one the handler just read, kept here by
key, so a write decodes nothing more). Every
``PUBLISH_EVERY_S`` the batches whose counts changed are written, keyed ``<partition>:<batch_id>``; a partition
newly built is written whole, which also replaces whatever a previous owner (SIGKILLed before it wrote its last
changes) left there. A revoked partition is dropped without a last write: its next owner rebuilds it from the
same restored states, and a late write from here could overwrite the newer one. A forgotten batch is dropped and its
keys tombstoned (``forget`` tombstones them too; this covers a write of ours that raced it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any

from streamproc import codec
from streamproc.codec.summary_record import encode_summary, encode_summary_key
from streamproc.core.batch_summary import BatchCounts, LatestState, SummaryKey, hour_of
from streamproc.core.durations import HOUR_MS, HOURS_KEPT
from streamproc.core.events import RequestState

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 1.0  # at most one record per second per changed (batch, partition)
SCAN_CHUNK = 500  # states counted between two yields to the event loop (tens of milliseconds)
LATEST_KEPT = 16_384  # states kept by key between the handler's read and its write: more than in hand at once


class BatchSummaries:
    """Per owned partition, per batch, the counts of its requests' latest states."""

    def __init__(self, table: Any, producer: Any, topic: str, owned: Callable[[], Collection[int]],
                 forgotten: Callable[[], Collection[str]], ready: Callable[[], bool]) -> None:
        self._table = table
        self._producer = producer
        self._topic = topic
        self._owned = owned  # the partitions whose states this worker writes now
        self._forgotten = forgotten  # every batch forgotten so far
        self._ready = ready  # no rebalance under way and the owned partitions restored
        self._counts: dict[int, dict[str | None, BatchCounts]] = {}  # partitions counted, or being counted
        self._cursor: dict[int, bytes | None] = {}  # partitions being counted: the last key counted (None: none)
        self._changed: dict[int, set[str | None]] = {}
        self._latest: OrderedDict[bytes, RequestState] = OrderedDict()  # states just read or written, by key

    def known(self, key: bytes) -> tuple[bool, RequestState | None]:
        """The key's current state when it was read or written lately (the handler reads a state, then writes
        the next one): (True, state); else (False, None), and the caller reads the store."""
        state = self._latest.get(key)
        return (state is not None, state)

    def read(self, key: bytes, state: RequestState | None) -> None:
        """The handler read ``key``'s state: its next write replaces this one (kept for the last few keys)."""
        if state is not None:
            self._remember(key, state)

    def written(self, partition: int, key: bytes, replaced: RequestState | None, state: RequestState) -> None:
        """A state write: ``replaced`` is the state it overwrote (None: the request's first)."""
        self._remember(key, state)
        batches = self._counts.get(partition)
        if batches is None:  # not counted yet: the scan will read it
            return
        if partition in self._cursor:
            cursor = self._cursor[partition]
            if cursor is None or key > cursor:  # ahead of the scan: it reads the new state
                return
        if replaced is not None:
            batches.setdefault(replaced.batch_id, BatchCounts()).add(LatestState.of(replaced), -1)
        batches.setdefault(state.batch_id, BatchCounts()).add(LatestState.of(state))
        self._changed.setdefault(partition, set()).add(state.batch_id)

    def _remember(self, key: bytes, state: RequestState) -> None:
        self._latest[key] = state
        self._latest.move_to_end(key)
        while len(self._latest) > LATEST_KEPT:
            self._latest.popitem(last=False)

    def revoked(self, partitions: Collection[int]) -> None:
        for partition in partitions:
            self._counts.pop(partition, None)
            self._cursor.pop(partition, None)
            self._changed.pop(partition, None)
        if partitions:  # a partition back later was written by another owner meanwhile
            self._latest.clear()

    async def publish_once(self) -> int:
        """Build the owned partitions not built yet, then write what changed; returns the records written."""
        if not self._ready():
            return 0
        owned = set(self._owned())
        self.revoked(set(self._counts) - owned)
        for partition in sorted(owned - set(self._counts)):
            await self._build(partition)
        forgotten = set(self._forgotten())
        now_ms = int(time.time() * 1000)
        first_hour_ms = hour_of(now_ms) - (HOURS_KEPT - 1) * HOUR_MS
        sends = []
        for partition, batches in list(self._counts.items()):  # a revoke may come while a send waits
            if partition in self._cursor:
                continue
            changed, self._changed[partition] = self._changed.get(partition, set()), set()
            for batch_id in sorted(changed | (forgotten & batches.keys()), key=lambda batch: batch or ""):
                # a forgotten batch's tombstone: `forget` wrote them too, but a write of ours may have come after
                if batch_id in forgotten:
                    value = None
                else:
                    batches[batch_id].drop_hours_before(first_hour_ms)
                    value = encode_summary(batches[batch_id], now_ms)
                key = encode_summary_key(SummaryKey(batch_id, partition))
                sends.append(await self._producer.send(self._topic, key, value, partition=0, timestamp=None,
                                                       headers=None))
            for batch_id in forgotten & batches.keys():
                del batches[batch_id]
        for outcome in await asyncio.gather(*sends, return_exceptions=True):
            if isinstance(outcome, BaseException):
                log.error("a batch summary was not delivered (the next change of its batch writes it again): %r",
                          outcome)
        return len(sends)

    async def _build(self, partition: int) -> None:
        """Count the partition's states from its store, in key order and in chunks, yielding between them: a
        write behind the scan's cursor moves the counts (``written``), one ahead of it is read by the scan."""
        db = dict(getattr(self._table.data, "_dbs", {})).get(partition)
        batches: dict[str | None, BatchCounts] = {}
        self._counts[partition], self._cursor[partition] = batches, None
        scanned = 0
        while db is not None:
            cursor = self._cursor[partition]
            chunk = []
            for key, raw in db.items(from_key=cursor):  # a new iterator each chunk: it sees the latest writes
                if key == cursor:
                    continue
                chunk.append((key, raw))
                if len(chunk) >= SCAN_CHUNK:
                    break
            for _key, raw in chunk:
                try:
                    state = codec.decode(raw, RequestState)
                except (codec.CodecError, TypeError):  # faust's own keys (its offset), undecodable state
                    continue
                batches.setdefault(state.batch_id, BatchCounts()).add(LatestState.of(state))
            scanned += len(chunk)
            if len(chunk) < SCAN_CHUNK:
                break
            self._cursor[partition] = chunk[-1][0]
            await asyncio.sleep(0)
            if self._counts.get(partition) is not batches:  # revoked meanwhile
                return
        self._cursor.pop(partition, None)
        self._changed[partition] = set(batches)
        log.info("batch summaries: partition %d counted, %d states in %d batches", partition, scanned, len(batches))
