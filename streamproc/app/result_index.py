"""The answers that succeeded, by input hash: what ``--reuse-results`` answers from (design §4, "Result reuse").

Each worker keeps it in its own RocksDB (rocksdict, under the data dir), as a view of the results topic: every
result called for (not reused) is put under its input hash, the first answer of a hash stays, and the offsets
read so far are stored beside them, so a restarted worker reads only the results written since.

Why not a faust table: a table partition holds the keys of its own partition, and the request that reuses an
answer lives on another partition than the request that got it (its id differs), often on another worker; a
lookup by input hash must see every partition. faust's GlobalTable would, but faust documents that it can leave
an app in an endless recovery loop, and it would add a recovery phase to every worker start inside the
machinery the project already patches (``faust_fixes``). The results topic is the record of what succeeded
anyway; reading it is all the index needs.

The index is read only for batches that opted in, and brought up to date only when a lookup misses: it then
reads the results topic up to its end, so everything answered before the request was handled counts, and
lookups that miss together share one read. A worker that never reuses never reads the results topic.

A forgotten batch's answers are dropped from the index (``drop_batches``) and never indexed again: its results stay on
the topic for exports, but the deployment no longer answers from them. Dropping reads the whole index, since it is
keyed by input hash; a batch is forgotten rarely. An input whose first answer was dropped is called again, even if
a later batch also got an answer to it (only the first answer was indexed).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from aiokafka.structs import TopicPartition
from rocksdict import Options, Rdict

from streamproc import codec
from streamproc.app.topic_reader import TopicReader
from streamproc.core.events import InferenceRequest, InferenceResult
from streamproc.core.reuse import indexable, reuse_wanted, reused_result
from streamproc.kafka.connection import KafkaConnection
from streamproc.kafka.schema_registry import NO_REGISTRY, SchemaReader

log = logging.getLogger(__name__)

_OFFSETS = b"\x00offsets"  # {partition: the next offset to read}, as JSON (input hashes are hex, never this)
_DROPPED = b"\x00dropped"  # [the forgotten batches whose answers were dropped], as JSON
_YIELD_EVERY = 500  # entries read between two yields to the event loop when a batch is dropped


def _never(batch_id: str | None) -> bool:
    return False


class ResultIndex:
    """input hash -> the first result called for it, read from the results topic into a local RocksDB."""

    def __init__(self, path: Path, kafka: KafkaConnection, results_topic: str,
                 forgotten: Callable[[str | None], bool] = _never,
                 schemas: SchemaReader = NO_REGISTRY) -> None:
        self._path = path
        self._schemas = schemas  # the registry's, for Confluent-framed results
        self._forgotten = forgotten  # batch id -> it was forgotten: its answers are not indexed
        self._db: Rdict | None = None  # opened at the first lookup: a worker that never reuses never opens it
        self._offsets: dict[int, int] = {}
        self._kafka = kafka
        self._topic = results_topic
        self._reading = asyncio.Lock()
        self._next_read: asyncio.Future[None] | None = None

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    async def get(self, digest: str) -> InferenceResult | None:
        """The answer indexed for ``digest`` so far (no read of the topic)."""
        raw = self._store().get(digest.encode())
        return None if raw is None else await self._decode(raw)

    async def _decode(self, raw: bytes | None) -> InferenceResult:
        await self._schemas.fetch_ahead(raw)
        return codec.decode(raw, InferenceResult, schema_lookup=self._schemas.lookup)

    def _store(self) -> Rdict:
        if self._db is None:
            self._path.mkdir(parents=True, exist_ok=True)
            self._db = Rdict(str(self._path), Options(raw_mode=True))  # bytes in and out: the records as on the topic
            stored = self._db.get(_OFFSETS)
            self._offsets = {} if stored is None else {int(part): int(at) for part, at in json.loads(stored).items()}
        return self._db

    async def find(self, digest: str) -> InferenceResult | None:
        """The answer for ``digest``, counting every result on the topic when the call began; None when there is
        none, or when the topic could not be read (the request is then called: reuse saves calls, it never
        costs a request)."""
        try:
            found = await self.get(digest)
            if found is None:
                await self.catch_up()
                found = await self.get(digest)
        except Exception as exc:  # a broker problem, a locked store: answer without reuse, never fail the request
            log.warning("result index: could not look up %s (%s: %s); calling instead of reusing", digest,
                        type(exc).__name__, exc)
            return None
        return found

    async def catch_up(self) -> None:
        """Return once a read of the results topic that began after this call reached its end. Callers that come
        while a read runs share the next one."""
        if self._next_read is None:
            self._next_read = asyncio.ensure_future(self._read_after_current())
        await asyncio.shield(self._next_read)

    async def _read_after_current(self) -> None:
        async with self._reading:
            self._next_read = None  # who comes from now on needs a read that starts later than this one
            await self._read_new()

    async def _read_new(self) -> None:
        self._store()  # its offsets first
        start = {TopicPartition(self._topic, partition): offset for partition, offset in self._offsets.items()}
        async with TopicReader(self._kafka, [self._topic], start) as reader:
            async for chunk in reader.chunks_to_end():
                for record in chunk:
                    await self._add(record.value)
                    self._offsets[record.partition] = max(self._offsets.get(record.partition, 0), record.offset + 1)
                self._store()[_OFFSETS] = json.dumps(self._offsets).encode()  # after the answers: a crash rereads some

    async def _add(self, value: bytes | None) -> None:
        try:
            result = await self._decode(value)
        except codec.CodecError:
            return  # a foreign record: answers nothing
        key, store = result.input_hash.encode(), self._store()
        if indexable(result) and not self._forgotten(result.batch_id) and store.get(key) is None:
            store[key] = value  # the first answer of an input stays its answer

    async def drop_batches(self, batch_ids: Collection[str]) -> int:
        """Drop the answers of forgotten batches (those not dropped before: the index remembers which were); returns
        how many. An index never opened holds none to drop."""
        if self._db is None and not self._path.exists():
            return 0
        store = self._store()
        done = set(json.loads(store.get(_DROPPED) or b"[]"))
        batches = set(batch_ids) - done
        if not batches:
            return 0
        dropped = []
        for index, (key, raw) in enumerate(store.items(), 1):
            if key not in (_OFFSETS, _DROPPED):
                try:
                    if (await self._decode(raw)).batch_id in batches:
                        dropped.append(key)
                except codec.CodecError:
                    pass
            if index % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
        for key in dropped:
            store.delete(key)
        store[_DROPPED] = json.dumps(sorted(done | batches)).encode()
        return len(dropped)


class ResultReuse:
    """What the handler asks before a call: an earlier answer to this very input, when the record's batch opted in."""

    def __init__(self, index: ResultIndex, batch_reuses: Callable[[str | None], bool]) -> None:
        self._index = index
        self._batch_reuses = batch_reuses  # batch id -> its manifest asks for reuse

    async def answer(self, request: InferenceRequest, record_headers: Mapping[str, bytes], digest: str,
                     now_ms: int) -> InferenceResult | None:
        """The result event answering ``request`` from the index, or None (no opt-in, or nothing to reuse)."""
        if not reuse_wanted(record_headers, self._batch_reuses(request.batch_id)):
            return None
        original = await self._index.find(digest)
        return None if original is None else reused_result(original, request, digest, now_ms)
