"""Forget finished batches on Kafka: tombstone their states on the state changelog and mark their manifest forgotten
(design §8, "State size"). ``streamproc forget`` and the workers' automatic retention both come here.

The command folds the changelog, to know each state's key and partition (it may run with no worker up, and ids
without batch scope are found only there). Automatic retention runs in a worker, every few seconds when the
retention is short, so it reads only the summaries and the manifests (their size grows with the batches kept, not
with the requests): it chooses from the summed counts and writes the manifests, and every worker's purge
(``app/table_purge``) deletes the batch's states from its disk and tombstones them on the partitions it owns.

The changelog is compacted and keyed by request id, and a restore applies a record without a value as a delete
(faust's ``apply_changelog_batch``), so a tombstone in the partition the state was written to removes the state
from every later restore, and compaction removes both once the segment rolls. The tombstones are written first
and the manifest after them: a worker that reads the manifest deletes the batch's states from its own RocksDB
(``app/table_purge``), which the tombstones already cover on the changelog. Its batch summaries are tombstoned too
(one key per partition), so the summary topic keeps only the batches not forgotten. Exports and the sink read the
results and failure topics, which are left as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from aiokafka.structs import ConsumerRecord

from streamproc import codec
from streamproc.app.summary_reader import read_summaries
from streamproc.app.topic_reader import TopicReader
from streamproc.codec.manifest import BatchManifest, decode_manifest, encode_manifest
from streamproc.codec.summary_record import encode_summary_key
from streamproc.core.batch_status import BatchesFold, BatchStatus
from streamproc.core.batch_summary import SummaryKey, SummaryView
from streamproc.core.events import RequestState
from streamproc.core.retention import Forgotten, Submitted, finished_before, finished_by_counts, forgotten_at, refusal
from streamproc.core.topology import Topology
from streamproc.kafka.clients import kafka_producer
from streamproc.kafka.connection import KafkaConnection

_SENDS_PER_WAIT = 5_000  # tombstones sent before their acknowledgements are awaited


@dataclass(frozen=True)
class Forgetting:
    """The outcome for one batch: how many states were tombstoned and what its manifest keeps, or why it stays."""

    batch_id: str
    states: int = 0
    forgotten: Forgotten | None = None
    refused: str | None = None


@dataclass
class BatchHistory:
    """The manifests and the live states of the changelog, with the partition each state key was written to."""

    manifests: dict[str, BatchManifest] = field(default_factory=dict)
    fold: BatchesFold = field(default_factory=BatchesFold)
    keys: dict[bytes, tuple[int, str | None]] = field(default_factory=dict)  # key -> (partition, batch id)

    def take(self, record: ConsumerRecord[bytes, bytes], topology: Topology) -> None:
        if record.topic == topology.batches:
            try:
                manifest = decode_manifest(record.value)
            except ValueError:
                return
            self.manifests[manifest.batch_id] = manifest
            return
        if record.key is None:
            return
        if not record.value:  # a tombstone: a state forgotten before
            self.keys.pop(record.key, None)
            return
        try:
            state = codec.decode(record.value, RequestState)
        except codec.CodecError:
            return
        self.keys[record.key] = (record.partition, state.batch_id)
        self.fold.apply([state])

    def status(self, batch_id: str) -> BatchStatus:
        manifest = self.manifests.get(batch_id)
        if manifest is None:
            return self.fold.status(batch_id, 0)
        return self.fold.status(batch_id, manifest.submitted, manifest.created_ms)

    def known(self, batch_id: str) -> bool:
        return batch_id in self.manifests or batch_id in self.fold.folds

    def finished_before(self, cutoff_ms: int) -> list[str]:
        """The batches not forgotten yet whose every request ended before ``cutoff_ms``."""
        return sorted(batch_id for batch_id in self.manifests.keys() | self.fold.folds.keys()
                      if not self.forgotten(batch_id) and finished_before(self.status(batch_id), cutoff_ms))

    def forgotten(self, batch_id: str) -> bool:
        manifest = self.manifests.get(batch_id)
        return manifest is not None and manifest.forgotten is not None


class BatchForgetter:
    """Forgets batches of one deployment; each call reads the changelog and the manifests afresh."""

    def __init__(self, kafka: KafkaConnection, topology: Topology, producer_options: Mapping[str, str | bool],
                 clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self._kafka = kafka
        self._topology = topology
        self._producer_options = dict(producer_options)
        self._clock_ms = clock_ms

    async def forget(self, batch_ids: Collection[str], force: bool = False) -> list[Forgetting]:
        """Forget these batches: a finished one (every request ended), or any with ``force``. A batch forgotten
        before has its states that are left (a forced forget's calls in flight) tombstoned again."""
        history = await self._read()
        return await self._forget(history, list(dict.fromkeys(batch_ids)), force)

    async def forget_finished_before(self, cutoff_ms: int) -> list[Forgetting]:
        """Forget every batch whose requests all ended before ``cutoff_ms`` (automatic retention's question too)."""
        history = await self._read()
        return await self._forget(history, history.finished_before(cutoff_ms), force=False)

    async def forget_finished_by_summaries(self, cutoff_ms: int) -> list[Forgetting]:
        """Automatic retention's look: forget every batch whose summed summaries say its requests all ended before
        ``cutoff_ms``, reading no request state. Its manifest and summary keys are written here; its states are
        deleted and tombstoned by the workers that hold them (``app/table_purge``), so ``states`` is 0."""
        manifests: dict[str, BatchManifest] = {}
        view = SummaryView()
        async with TopicReader(self._kafka, [self._topology.summaries, self._topology.batches]) as reader:
            async for chunk in reader.chunks_to_end():
                read_summaries(chunk, self._topology, view)
                for record in chunk:
                    if record.topic == self._topology.batches and record.value:
                        with contextlib.suppress(ValueError):
                            manifest = decode_manifest(record.value)
                            manifests[manifest.batch_id] = manifest
        summed = {batch_id: counts for batch_id, (counts, _at_ms) in view.batches().items()}
        submitted = {batch_id: Submitted(manifest.submitted, manifest.created_ms, manifest.forgotten is not None)
                     for batch_id, manifest in manifests.items()}
        now_ms = self._clock_ms()
        chosen = {status.batch_id: replace(manifests.get(status.batch_id) or BatchManifest(
                      status.batch_id, status.submitted, status.first_started_ms, ""),
                      forgotten=forgotten_at(status, now_ms))
                  for status in finished_by_counts(summed, submitted, cutoff_ms)}
        if chosen:
            await self._write({}, chosen)
        return [Forgetting(batch_id, 0, manifest.forgotten) for batch_id, manifest in chosen.items()]

    async def _read(self) -> BatchHistory:
        history = BatchHistory()
        async with TopicReader(self._kafka, [self._topology.state_changelog, self._topology.batches]) as reader:
            async for chunk in reader.chunks_to_end():
                for record in chunk:
                    history.take(record, self._topology)
        return history

    async def _forget(self, history: BatchHistory, batch_ids: list[str], force: bool) -> list[Forgetting]:
        outcomes: list[Forgetting] = []
        chosen: dict[str, BatchManifest] = {}
        for batch_id in batch_ids:
            if not history.known(batch_id):
                outcomes.append(Forgetting(batch_id, refused=f"no batch {batch_id!r} here (no manifest on "
                                           f"{self._topology.batches} and no request state names it)"))
                continue
            manifest = history.manifests.get(batch_id)
            if manifest is not None and manifest.forgotten is not None:  # what a forced forget left, if anything
                chosen[batch_id] = manifest
                continue
            status = history.status(batch_id)
            why = refusal(status, force)
            if why is not None:
                outcomes.append(Forgetting(batch_id, refused=why))
                continue
            chosen[batch_id] = replace(manifest or BatchManifest(batch_id, status.submitted,
                                                                 history.fold.folds[batch_id].first_created_ms, ""),
                                       forgotten=forgotten_at(status, self._clock_ms()))
        if not chosen:
            return outcomes
        tombstoned = await self._write(history.keys, chosen)
        return outcomes + [Forgetting(batch_id, tombstoned.get(batch_id, 0), manifest.forgotten)
                           for batch_id, manifest in chosen.items()]

    async def _write(self, keys: Mapping[bytes, tuple[int, str | None]],
                     chosen: Mapping[str, BatchManifest]) -> dict[str, int]:
        """The tombstones of the chosen batches' states among ``keys`` (key -> partition, batch id), acknowledged,
        then those of their summaries and the manifests; returns the states tombstoned per batch."""
        counts: dict[str, int] = {}
        producer = kafka_producer(self._kafka, **self._producer_options)
        await producer.start()
        try:
            pending: list[asyncio.Future[object]] = []
            for key, (partition, batch_id) in keys.items():
                if batch_id is None or batch_id not in chosen:
                    continue
                pending.append(await producer.send(self._topology.state_changelog, key=key, value=None,
                                                   partition=partition))
                counts[batch_id] = counts.get(batch_id, 0) + 1
                if len(pending) >= _SENDS_PER_WAIT:
                    await asyncio.gather(*pending)
                    pending.clear()
            await asyncio.gather(*pending)
            for batch_id in chosen:  # its counts leave the summaries (a worker tombstones them too once it knows)
                await asyncio.gather(*[await producer.send(self._topology.summaries, value=None,
                                                           key=encode_summary_key(SummaryKey(batch_id, partition)))
                                       for partition in range(self._topology.partitions)])
            for batch_id, manifest in chosen.items():
                await producer.send_and_wait(self._topology.batches, key=batch_id.encode(),
                                             value=encode_manifest(manifest))
        finally:
            await producer.stop()
        return counts
