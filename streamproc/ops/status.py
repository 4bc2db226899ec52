"""``status`` against Kafka: the batch manifest plus the request-state changelog, folded incrementally."""

from __future__ import annotations

from types import TracebackType

from streamproc import codec
from streamproc.app.bootstrap import resolve_bootstrap
from streamproc.app.topic_reader import TopicReader
from streamproc.codec.manifest import BatchManifest, decode_manifest
from streamproc.core.batch_status import BatchStatus, StatusFold
from streamproc.core.events import RequestState
from streamproc.core.topology import Topology
from streamproc.errors import UserFacingError
from streamproc.settings import Settings


class UnknownBatchError(UserFacingError):
    """Neither a manifest nor any request state names this batch."""


async def read_status(settings: Settings, batch_id: str) -> BatchStatus:
    """One consistent snapshot of a batch's counts."""
    async with BatchStatusReader(resolve_bootstrap(settings), settings.topology(), batch_id) as reader:
        current = await reader.refresh()
    if reader.manifest is None and current.submitted == 0:
        raise UnknownBatchError(f"no batch {batch_id!r} here (no manifest on {settings.topology().batches} and "
                                "no request state names it)")
    return current


class BatchStatusReader:
    """Keeps a reader open so that each ``refresh`` reads only the changes since the previous one."""

    def __init__(self, bootstrap: str, topology: Topology, batch_id: str) -> None:
        self._topology = topology
        self._reader = TopicReader(bootstrap, [topology.state_changelog, topology.batches])
        self._fold = StatusFold(batch_id)
        self.manifest: BatchManifest | None = None

    async def __aenter__(self) -> BatchStatusReader:
        await self._reader.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._reader.__aexit__(exc_type, exc, tb)

    async def refresh(self) -> BatchStatus:
        states: list[RequestState] = []
        for record in await self._reader.read_to_end():
            if record.topic == self._topology.batches:
                try:
                    manifest = decode_manifest(record.value)
                except ValueError:
                    continue
                if manifest.batch_id == self._fold.batch_id:
                    self.manifest = manifest
            elif record.value:
                try:
                    states.append(codec.decode(record.value, RequestState))
                except codec.CodecError:
                    continue  # not ours to judge: the worker reports undecodable state itself
        self._fold.apply(states)
        return self._fold.status(self.manifest.submitted if self.manifest else 0)
