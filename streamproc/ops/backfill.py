"""``backfill``: replay terminal failures from the failure topics, idempotently, after a plan.

The plan is pure: the latest terminal failure of each request id that matches the filters, judged against
the request's current state (succeeded since: skip) and the layer's rule (business only on request,
semantic with a repair prompt). A request whose url the worker's endpoint table refuses (core.endpoints) is
never replayed, whether it was read from a topic or from the sink's database. Replays go back onto
``llm.requests`` with ``x-replay: 1``, which lets the state machine restart a ``failed`` request and never a
succeeded one, so running backfill twice is safe.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamproc import codec
from streamproc.app.topic_reader import TopicReader
from streamproc.core import headers
from streamproc.core.endpoints import UrlRefused, endpoint_for
from streamproc.core.events import FailureEvent, InferenceRequest, RequestState
from streamproc.core.topology import Topology
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.kafka.clients import kafka_producer
from streamproc.kafka.connection import KafkaConnection
from streamproc.llm.repair import build_repair_request
from streamproc.ops.progress import Progress
from streamproc.ops.status import decode_records
from streamproc.settings import Durability

REPLAY = "replay"
FORGOTTEN = "skip: batch forgotten"


@dataclass(frozen=True)
class BackfillFilter:
    batch_id: str | None = None
    layers: frozenset[FailureLayer] = frozenset(FailureLayer)
    error_codes: frozenset[str] = frozenset()  # empty: every code
    since_ms: int | None = None
    until_ms: int | None = None
    include_business: bool = False

    def matches(self, failure: FailureEvent) -> bool:
        return ((self.batch_id is None or failure.request.batch_id == self.batch_id)
                and failure.layer in self.layers
                and (not self.error_codes or failure.error_code in self.error_codes)
                and (self.since_ms is None or failure.last_failure_ms >= self.since_ms)
                and (self.until_ms is None or failure.last_failure_ms < self.until_ms))


@dataclass
class BackfillPlan:
    """What backfill will do, by (layer, code): replay or skip with a reason."""

    replays: list[InferenceRequest] = field(default_factory=list)
    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (layer, code, decision)

    @property
    def to_skip(self) -> int:
        return sum(count for (_, _, decision), count in self.counts.items() if decision != REPLAY)

    def rows(self) -> list[dict[str, Any]]:
        return [{"layer": layer, "error_code": code, "decision": decision, "count": count}
                for (layer, code, decision), count in sorted(self.counts.items())]

    def summary(self) -> dict[str, Any]:
        return {"to_replay": len(self.replays), "to_skip": self.to_skip, "rows": self.rows()}


def plan_backfill(failures: Iterable[FailureEvent], statuses: Mapping[str, RequestStatus],
                  selection: BackfillFilter, forgotten: Collection[str] = frozenset()) -> BackfillPlan:
    """The latest matching terminal failure per request id, and what to do with it given the request's
    status now (from the state table, or from the sink's database with ``--from-db``); a request of a
    ``forgotten`` batch is skipped (a worker would refuse it: ``batch_forgotten``)."""
    latest: dict[str, FailureEvent] = {}
    for failure in failures:
        if failure.terminal and selection.matches(failure):
            latest[failure.request.request_id] = failure
    plan = BackfillPlan()
    for request_id, failure in latest.items():
        decision = (FORGOTTEN if failure.request.batch_id in forgotten
                    else _decide(failure, statuses.get(request_id), selection))
        plan.counts[(failure.layer.value, failure.error_code, decision)] += 1
        if decision == REPLAY:
            request = failure.request
            if failure.layer is FailureLayer.SEMANTIC:
                request = build_repair_request(request, "", failure.message)
            plan.replays.append(request)
    return plan


def _decide(failure: FailureEvent, status: RequestStatus | None, selection: BackfillFilter) -> str:
    if isinstance(endpoint_for(failure.request.url), UrlRefused):  # a worker would refuse it again, uncalled
        return "skip: unsupported url"
    if status is RequestStatus.SUCCEEDED:
        return "skip: succeeded since"
    if status in (RequestStatus.IN_FLIGHT, RequestStatus.RETRYING):
        return "skip: already being retried"
    if status is RequestStatus.PENDING:  # a reservation: the record that owns the id waits to be handled (design §4)
        return "skip: waiting to be handled"
    if failure.layer is FailureLayer.BUSINESS and not selection.include_business:
        return "skip: business (fix the input, then --include-business)"
    if not failure.request.body_json:
        return "skip: the original record was undecodable"
    return REPLAY


async def read_forgotten(kafka: KafkaConnection, topology: Topology) -> frozenset[str]:
    """The batches forgotten so far (``streamproc forget``), from their manifests."""
    async with TopicReader(kafka, [topology.batches]) as reader:
        manifests, _ = decode_records(await reader.read_to_end(), topology)
    return frozenset(manifest.batch_id for manifest in manifests if manifest.forgotten is not None)


async def read_for_backfill(kafka: KafkaConnection, topology: Topology, schema_lookup: codec.SchemaLookup | None = None,
                            ) -> tuple[list[FailureEvent], dict[str, RequestStatus]]:
    """Terminal failures of every layer (a Confluent-framed one read with ``schema_lookup``, the registry's), and
    the latest status per request id (the state table's)."""
    failures: list[FailureEvent] = []
    statuses: dict[str, RequestStatus] = {}
    topics = [topology.failed(layer) for layer in FailureLayer]
    async with TopicReader(kafka, [*topics, topology.state_changelog]) as reader:
        async for chunk in reader.chunks_to_end():
            for record in chunk:
                if not record.value:
                    continue
                try:
                    if record.topic == topology.state_changelog:
                        state = codec.decode(record.value, RequestState)
                        statuses[state.request_id] = state.status
                    else:
                        event = codec.decode(record.value, FailureEvent, schema_lookup=schema_lookup)
                        if event.terminal:
                            failures.append(event)
                except codec.CodecError:
                    continue
    return failures, statuses


async def replay(kafka: KafkaConnection, topology: Topology, durability: Durability, plan: BackfillPlan,
                 rate_per_s: float, progress: Progress | None) -> int:
    """Send the plan's replays, at most ``rate_per_s`` a second (a backlog must not hit the provider at once)."""
    producer = kafka_producer(kafka, **durability.producer_options())
    interval = 1.0 / rate_per_s
    started = time.monotonic()
    try:
        await producer.start()
        if progress is not None:
            progress.start(len(plan.replays))
        for index, request in enumerate(plan.replays):
            delay = started + index * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await producer.send(topology.requests, key=request.request_id.encode(), value=codec.encode(request),
                                headers=[(headers.REPLAY, b"1"), (headers.ATTEMPT, b"1")])
            if progress is not None:
                progress.advance(1)
        await producer.flush()
    finally:
        await producer.stop()
    return len(plan.replays)
