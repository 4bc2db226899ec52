"""A worker deletes the states of forgotten batches from its own RocksDB (design §8, "State size").

``streamproc forget`` tombstones a batch's states on the changelog, but a worker does not read the changelog of
the partitions it owns, and it stores the highest changelog offset it wrote itself as where a restore on its own
disk resumes: its next writes would move that offset past the tombstones, and the forgotten states would stay on
its disk for good. So every worker deletes them itself from the partitions it owns: a batch newly forgotten from
all of them, every forgotten batch from a partition it did not own at its last pass (one restored from a disk of
before the forget, or taken over from a worker that died before its pass). It sends a tombstone for each state it
deletes: a state written again after the command's tombstones (an ended request's record read again rewrites its
state) would otherwise come back on the next restore, and automatic retention writes none of its own, so these are
the only ones its batches get. A standby partition is left alone: it applies the owner's tombstones from the
changelog like any other write, and is purged (with tombstones) if it is ever owned.

States are found by key prefix: ``submit`` keys a request ``<batch_id>/<custom_id>`` (core.identity), and RocksDB
keeps keys in order, so a batch's states are one range, found with one seek. Ids without batch scope (other
producers) are left on the disk until its next restore from scratch; the command's tombstones keep them out of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

from streamproc.core.identity import request_id_for

log = logging.getLogger(__name__)

_YIELD_EVERY = 500  # deletes between two yields to the event loop


class TablePurge:
    """Deletes forgotten batches' states from the state table's local partitions."""

    def __init__(self, table: Any, producer: Any, forgotten: Callable[[], Collection[str]],
                 owned: Callable[[], Collection[int]]) -> None:
        self._table = table
        self._producer = producer
        self._forgotten = forgotten  # every batch forgotten so far
        self._owned = owned  # the partitions whose changelog this worker writes now
        self._owned_before: set[int] = set()  # owned at the last pass
        self._batches: set[str] = set()  # forgotten at the last pass

    async def run_once(self) -> int:
        """Purge what the last pass did not: new batches everywhere, every batch on newly owned partitions; returns
        how many states were deleted (and tombstoned)."""
        dbs = dict(getattr(self._table.data, "_dbs", {}))  # faust's RocksDB store: partition -> its database
        batches = set(self._forgotten())
        owned = set(self._owned()) & set(dbs)
        deleted = 0
        for partition in sorted(owned):
            todo = batches if partition not in self._owned_before else batches - self._batches
            for batch_id in sorted(todo):
                deleted += await self._purge(partition, dbs[partition], batch_id)
        self._owned_before, self._batches = owned, batches
        if deleted:
            log.info("forgotten batches: deleted and tombstoned %d of their states", deleted)
        return deleted

    async def _purge(self, partition: int, db: Any, batch_id: str) -> int:
        prefix = request_id_for(batch_id, "").encode()  # the range of the batch's request ids
        keys = []
        for key in db.keys(from_key=prefix):
            if not key.startswith(prefix):
                break
            keys.append(key)
        for index, key in enumerate(keys, 1):
            db.delete(key)
            await self._producer.send(self._table.changelog_topic_name, key, None, partition=partition,
                                      timestamp=None, headers=None)
            if index % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
        return len(keys)
