"""``status`` against Kafka: the batch manifest plus the workers' summaries of its counts (core.batch_summary; with
``--verify``, the request-state changelog folded instead, whose cost grows with every request ever made), read
incrementally, and, once the batch has not moved for a while, the workers' consumer group, to say why
(core.batch_stall); and the deployments out of rotation at the live workers, from their fleet beats
(core.deployments_out). And the stream: the requests that name no batch, from the workers' summary of them (with
``--verify`` folded from the changelog; core.stream_status)."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

from aiokafka.structs import ConsumerRecord

from streamproc import codec
from streamproc.app.summary_reader import read_summaries
from streamproc.app.topic_reader import TopicReader
from streamproc.codec.batch_cap import decode_batch_cap
from streamproc.codec.fleet_beat import SPENT_SUFFIX, decode_beat
from streamproc.codec.manifest import BatchManifest, decode_manifest
from streamproc.core.batch_lifecycle import Lifecycle, lifecycle
from streamproc.core.batch_stall import BatchStall, GroupView, diagnose, needs_group
from streamproc.core.batch_status import BatchStatus, StatusFold, counted_status, format_status
from streamproc.core.batch_summary import SummaryView
from streamproc.core.deployments_out import DeploymentOut, FleetOutView, concerning
from streamproc.core.events import RequestState
from streamproc.core.spend_cap import Cap, Spend, spend_json, spend_of
from streamproc.core.stream_status import StreamFold, StreamStatus, stream_status
from streamproc.core.topology import Topology
from streamproc.errors import ExitCode, UserFacingError
from streamproc.kafka.connection import KafkaConnection

GROUP_REFRESH_S = 10.0  # a stalled batch is polled every second by `run`; its group need not be

log = logging.getLogger(__name__)


class UnknownBatchError(UserFacingError):
    """Neither a manifest nor any request state names this batch."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class StatusReport:
    """A batch's counts, and why it waits when it has not moved for ``STREAMPROC_STALL_AFTER_S``."""

    status: BatchStatus
    stall: BatchStall | None = None
    manifest: BatchManifest | None = None  # None for a batch produced without ``submit``
    cap: Cap | None = None  # its spend cap (``submit --max-cost-usd``, ``raise-cap``)
    prices: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # STREAMPROC_MODEL_PRICES
    out: tuple[DeploymentOut, ...] = ()  # deployments out of rotation at the live workers
    summary_at_ms: int | None = None  # when the newest summary counted was written (0: none yet); None: verified

    @property
    def lifecycle(self) -> Lifecycle:
        return lifecycle_of(self.status, self.manifest)

    @property
    def spent(self) -> Spend:
        """What the batch's results cost: a provider batch's line at the batch discount, a call at the full price."""
        return spend_of(self.status.usage, self.prices, self.status.batched_usage)

    def as_json(self) -> dict[str, Any]:
        """``status --json``: the counts' keys, ``spend`` (what its results cost, and its cap), ``stalled`` (null
        while the batch moves or ended), and OpenAI's batch ``status`` with its ``*_at`` times (Unix seconds, null
        until reached; core.batch_lifecycle), and ``deployments_out`` (each deployment out of rotation at the live
        workers: its key, why, and at how many workers)."""
        return {**self.status.as_json(), "spend": spend_json(self.spent, self.cap),
                "stalled": None if self.stall is None else self.stall.as_json(), **self.lifecycle.as_json(),
                "deployments_out": [out.as_json() for out in self.out],
                "counted_from": "changelog" if self.summary_at_ms is None else "summaries",
                "summary_at": None if not self.summary_at_ms else self.summary_at_ms // 1000}

    def format(self) -> str:
        text = format_status(self.status)
        if self.cap is not None:
            spent = self.spent
            text += f"\n{'spend':<10} ${spent.cost_usd:.4f}, {spent.tokens:,} tokens (cap {self.cap.describe()})"
        steps = self.lifecycle
        if steps.cancelling_ms is not None:
            text += f"\n{'cancelled':<10} at {_local(steps.cancelling_ms)}"
        if steps.forgotten_ms is not None:
            text += (f"\n{'forgotten':<10} at {_local(steps.forgotten_ms)}: its states are gone, a request of it is "
                     "refused; its results and failures stay on their topics")
        for out in self.out:
            text += f"\n{'out':<10} {out.describe()}"
        if self.summary_at_ms:
            age_s = max(0.0, time.time() - self.summary_at_ms / 1000)
            text += f"\n{'counted':<10} by the workers, as of {_local(self.summary_at_ms)} ({age_s:.0f} s ago)"
        elif self.summary_at_ms is None:
            text += f"\n{'counted':<10} from every state on the changelog (--verify)"
        return text if self.stall is None else f"{text}\n{'stalled':<10} {self.stall.describe()}"


def _local(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def lifecycle_of(status: BatchStatus, manifest: BatchManifest | None) -> Lifecycle:
    """The batch's OpenAI status and times (``forgotten`` once ``forget`` ran); a batch without a manifest was
    created when a worker first saw it."""
    if manifest is None:
        return lifecycle(status, status.first_started_ms)
    forgotten_ms = None if manifest.forgotten is None else manifest.forgotten.at_ms
    return lifecycle(status, manifest.created_ms, manifest.cancelled_ms, manifest.expires_ms, forgotten_ms)


def status_of(manifest: BatchManifest | None, fold: Callable[[int, int], BatchStatus]) -> BatchStatus:
    """A batch's counts: folded from its states (``fold(submitted, created_ms)``), or as its manifest kept them once
    it was forgotten (its states are gone, or going: the changelog may still hold some before their tombstones)."""
    if manifest is None:
        return fold(0, 0)
    if manifest.forgotten is not None:  # no state left to tell: every request counts as the manifest's tenancy
        kept = manifest.forgotten.status(manifest.batch_id)
        return replace(kept, tenants={manifest.tenant: kept.submitted}, priorities={manifest.priority: kept.submitted})
    return fold(manifest.submitted, manifest.created_ms).with_pending_as(manifest.tenant, manifest.priority)


async def read_status(kafka: KafkaConnection, topology: Topology, batch_id: str, *, stall_after_s: float,
                      prices: Mapping[str, tuple[float, float]] | None = None, verify: bool = False) -> StatusReport:
    """One consistent snapshot of a batch's counts, with the stall diagnosis once it has not moved for
    ``stall_after_s``; its spend at ``prices``. Counted from the workers' summaries, or with ``verify`` from every
    state on the changelog."""
    async with BatchStatusReader(kafka, topology, batch_id, verify=verify) as reader:
        current = await reader.refresh()
        stall = await reader.stall(current, stall_after_s)
        out = await reader.deployments_out()
    if reader.manifest is None and current.submitted == 0:
        raise UnknownBatchError(f"no batch {batch_id!r} here (no manifest on {topology.batches} and "
                                "no request state names it)")
    return StatusReport(current, stall, reader.manifest, reader.cap, prices or {}, concerning(out, current.tenants),
                        reader.summary_at_ms)


async def read_stream_status(kafka: KafkaConnection, topology: Topology, *, hours: int,
                             verify: bool = False) -> StreamStatus:
    """The requests without a batch: their counts, and what arrived and ended in each of the last ``hours``; from
    the workers' summary of the stream, or with ``verify`` folded from every state on the changelog."""
    now_ms = int(time.time() * 1000)
    if not verify:
        view = SummaryView()
        async with TopicReader(kafka, [topology.summaries]) as reader:
            async for chunk in reader.chunks_to_end():
                read_summaries(chunk, topology, view)
        return stream_status(view.batch(None)[0], now_ms, hours)
    fold = StreamFold()
    async with TopicReader(kafka, [topology.state_changelog]) as reader:
        async for chunk in reader.chunks_to_end():
            fold.apply(decode_records(chunk, topology)[1])
    return fold.status(now_ms, hours)


class BatchStatusReader:
    """Keeps a reader open so that each ``refresh`` reads only the changes since the previous one: of the summary
    topic, or with ``verify`` of the state changelog."""

    def __init__(self, kafka: KafkaConnection, topology: Topology, batch_id: str, *, verify: bool = False) -> None:
        self._kafka = kafka
        self._topology = topology
        self._reader = TopicReader(kafka, [topology.state_changelog if verify else topology.summaries,
                                           topology.batches])
        self._fold = StatusFold(batch_id) if verify else None
        self._batch_id = batch_id
        self._summaries = SummaryView()
        self._group: GroupView | None = None
        self._group_read_at = -GROUP_REFRESH_S
        self.manifest: BatchManifest | None = None
        self.cap: Cap | None = None
        self._fleet: TopicReader | None = None  # opened on the first deployments_out
        self._fleet_out = FleetOutView()

    async def __aenter__(self) -> BatchStatusReader:
        await self._reader.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._reader.__aexit__(exc_type, exc, tb)
        if self._fleet is not None:
            await self._fleet.__aexit__(exc_type, exc, tb)

    @property
    def summary_at_ms(self) -> int | None:
        """When the newest summary of the batch was written (0: none yet); None when counted from the changelog."""
        return None if self._fold is not None else self._summaries.batch(self._batch_id)[1]

    async def refresh(self) -> BatchStatus:
        records = await self._reader.read_to_end()
        manifests, states = decode_records(records, self._topology)
        self.cap = decode_caps(records, self._topology).get(self._batch_id, self.cap)
        for manifest in manifests:
            if manifest.batch_id == self._batch_id:
                self.manifest = manifest
        if self._fold is not None:
            self._fold.apply(states)
            return status_of(self.manifest, self._fold.status)
        read_summaries(records, self._topology, self._summaries, self._batch_id)
        counts = self._summaries.batch(self._batch_id)[0]
        return status_of(self.manifest, functools.partial(counted_status, self._batch_id, counts))

    async def deployments_out(self) -> tuple[DeploymentOut, ...]:
        """The deployments out of rotation at the live workers, as their fleet beats say (design §5.10); none when
        the fleet topic cannot be read (a principal without Read on it, a worker with a fixed limit share)."""
        try:
            if self._fleet is None:
                reader = TopicReader(self._kafka, [self._topology.fleet])
                self._fleet = await reader.__aenter__()
            records = await self._fleet.read_to_end()
        except Exception as exc:
            log.debug("the fleet's beats were not read: %s", exc)
            return ()
        for record in records:
            worker = bytes(record.key or b"").decode(errors="replace")
            if not worker or worker.endswith(SPENT_SUFFIX):
                continue
            if record.value is None:
                self._fleet_out.gone(worker)
                continue
            with contextlib.suppress(ValueError):
                self._fleet_out.heard(worker, record.timestamp, decode_beat(worker, record.value).out)
        return self._fleet_out.out(int(time.time() * 1000))

    async def stall(self, status: BatchStatus, stall_after_s: float) -> BatchStall | None:
        """Why the batch waits, once no request ended for ``stall_after_s``; None while it moves."""
        now_ms, after_ms = int(time.time() * 1000), int(stall_after_s * 1000)
        if not needs_group(status, now_ms, after_ms):
            return None
        if time.monotonic() - self._group_read_at >= GROUP_REFRESH_S:
            self._group = await _group_view(self._kafka, self._topology)
            self._group_read_at = time.monotonic()
        return diagnose(status, now_ms, after_ms, self._group)


def decode_records(records: Iterable[ConsumerRecord[Any, Any]],
                   topology: Topology) -> tuple[list[BatchManifest], list[RequestState]]:
    """The manifests and request states among records of the manifests topic and the state changelog, in
    log order; anything else is skipped (the worker reports undecodable state itself)."""
    manifests: list[BatchManifest] = []
    states: list[RequestState] = []
    for record in records:
        if record.topic == topology.batches:
            try:
                manifests.append(decode_manifest(record.value))
            except ValueError:
                continue
        elif record.topic == topology.state_changelog and record.value:
            try:
                states.append(codec.decode(record.value, RequestState))
            except codec.CodecError:
                continue
    return manifests, states


def decode_caps(records: Iterable[ConsumerRecord[Any, Any]], topology: Topology) -> dict[str, Cap]:
    """The latest spend cap of each batch among records of the manifests topic (codec.batch_cap)."""
    caps = {}
    for record in records:
        if record.topic == topology.batches and record.value:
            try:
                batch_cap = decode_batch_cap(record.value)
            except ValueError:
                continue
            caps[batch_cap.batch_id] = batch_cap.cap
    return caps


async def _group_view(kafka: KafkaConnection, topology: Topology) -> GroupView | None:
    """The workers' group: its members and the lag of its inputs; None when the broker did not say (imported
    here: only a batch that stalls needs it)."""
    from streamproc.app.lag_reader import GroupNotFound, LagError, read_lag

    group = topology.app_id
    try:
        report = await read_lag(kafka, [group], {group: topology.inputs})
    except GroupNotFound:
        return GroupView(group, 0, None)  # no worker ever joined
    except LagError:
        return None
    found = report.group(group)
    return GroupView(group, found.members, found.lag)
