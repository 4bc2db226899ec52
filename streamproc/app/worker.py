"""``streamproc worker``: the faust app that turns requests into results or layered failures.

One dispatcher agent per topic (each priority's requests topic, the backlog and every retry tier), each taking
events unacked and handing them to the shared :class:`Dispatcher`; the ``request_state`` table (RocksDB via
rocksdict) is read and written by the :class:`Handler` through the partition of the event being handled.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import ssl
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import faust
import uvloop
from aiokafka.errors import KafkaError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    stop_never,
    wait_exponential,
    wait_random_exponential,
)

from streamproc import codec
from streamproc.app import log_redaction
from streamproc.app.auto_forget import AutoForget
from streamproc.app.batch_summaries import PUBLISH_EVERY_S, BatchSummaries
from streamproc.app.bootstrap import resolve_connection
from streamproc.app.dispatcher import Ack, Dispatcher
from streamproc.app.faust_app import fetch_fits, input_buffer, make_faust_app, under_pressure
from streamproc.app.faust_fixes import watch_skipped_records
from streamproc.app.fetch_pause import FetchPause
from streamproc.app.fleet import FleetMember, FleetTopic
from streamproc.app.forgetting import BatchForgetter
from streamproc.app.handler import Disposition, Handler, HandlerOptions, Record, StateWriteFailed
from streamproc.app.manifest_follower import BatchSizes
from streamproc.app.metrics import LagSource, serve_worker_metrics, watch_worker
from streamproc.app.observe import Observer
from streamproc.app.provider_batch_log import ProviderBatchLog
from streamproc.app.provider_batch_route import ProviderBatchRoute
from streamproc.app.reconciler import ConsumerGroup, Reconciler, ReconcilerLinks
from streamproc.app.result_index import ResultIndex, ResultReuse
from streamproc.app.spend import SpendGate
from streamproc.app.table_purge import TablePurge
from streamproc.app.tenant_hand import TenantHand, load_tenants, scheduled_lane
from streamproc.app.topic_reader import TopicReader
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.app.urgent_records import UrgentRecords
from streamproc.app.written_outcomes import WrittenOutcomes
from streamproc.codec.releases import write_as_release
from streamproc.core import headers
from streamproc.core.decision import Retries
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RequestState
from streamproc.core.model_list import ModelList
from streamproc.core.outcome import ConfigurationProblem
from streamproc.core.request_line import LineLimits
from streamproc.core.request_state import RecordRef
from streamproc.core.retention import check_interval_s
from streamproc.core.retry_policy import Tier, due_within_tier
from streamproc.core.spend_cap import Cap, SpendLedger
from streamproc.core.sweep_scope import SweepScope
from streamproc.core.tenancy import PRIORITIES
from streamproc.core.tenant_pace import TenantPace
from streamproc.core.tenant_share import Lane, more_urgent, reading_yields
from streamproc.core.tenants_file import NO_TENANTS_FILE, Tenants
from streamproc.core.topology import Topology
from streamproc.errors import ExitCode, UserFacingError
from streamproc.kafka.authorization import AUTHORIZATION_ERRORS, not_authorized
from streamproc.kafka.clients import kafka_admin
from streamproc.kafka.connection import KafkaConnection
from streamproc.kafka.diagnose import KafkaRefused, diagnose
from streamproc.kafka.schema_registry import NO_REGISTRY, RegisteredSchemas, SchemaReader, register_schemas
from streamproc.llm.api_key import check_llm_key
from streamproc.llm.deployments import DeploymentCaller
from streamproc.llm.guarded import Guards, long_requests_of
from streamproc.llm.model_list_file import check_routes, deployment_endpoint, load_model_list
from streamproc.llm.provider_batches import AnthropicBatches, OpenAIBatches
from streamproc.settings import Settings

log = logging.getLogger("streamproc.app.worker")

_REBALANCE_POLL_S = 0.2
# a lower priority's record waits at most this long for faust to hand over a more urgent topic's records (design
# §5.11, reading): handing over the rest of one fetch takes well under a second; a partition left unread (paused,
# its agent stuck) must not stop the lower priorities for ever
_UNREAD_YIELD_S = 5.0
_PURGE_INTERVAL_S = 5.0  # how soon a forgotten batch leaves this worker's disk (requests of it are refused at once)


class FaustSink:
    """Sends outcomes through the app's producer and waits until the broker acknowledged each one."""

    def __init__(self, app: faust.App, topology: Topology,
                 encode_outcome: Callable[[InferenceResult | FailureEvent], bytes] = codec.encode,
                 encode_request: Callable[[InferenceRequest], bytes] = codec.encode) -> None:
        self._app = app
        self._topology = topology
        self._encode_outcome = encode_outcome  # STREAMPROC_RECORD_FORMAT: results and failures only (design §3)
        self._encode_request = encode_request  # a retry tier's record: Confluent-framed with a schema registry
        # an ACL taken away mid-run: every later write would fail the same way (the worker stops, design §6)
        self.on_not_authorized: Callable[[BaseException], None] = lambda _exc: None
        self._topics: dict[str, Any] = {
            name: app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                            value_serializer="raw", partitions=count)
            for name, count in topology.all_topics().items()
        }
        for name in topology.inputs:  # ``app.topic`` drops its ``maxsize`` argument (faust 0.15.3); clones copy this
            self._topics[name].maxsize = input_buffer(app.conf.stream_buffer_maxsize)

    def topic(self, name: str) -> Any:
        return self._topics[name]

    async def _send(self, name: str, key: bytes | None, value: bytes | None, hdrs: headers.Headers) -> RecordRef:
        # the producer itself, not the topic's send: the bytes are final, and faust's future-message wrapping
        # cost about 20 us per outcome
        try:
            delivery = await self._app.producer.send(name, key, value, partition=None, timestamp=None, headers=hdrs)
            written = await delivery  # the record is on the broker (acks=all) before the source event is acked
        except AUTHORIZATION_ERRORS as exc:
            self.on_not_authorized(exc)
            raise
        return RecordRef(name, written.offset)

    async def result(self, result: InferenceResult) -> None:
        await self._send(self._topology.results, result.request_id.encode(), self._encode_outcome(result),
                         {headers.REQUEST_ID: result.request_id.encode()})

    async def failure(self, event: FailureEvent, hdrs: headers.Headers) -> None:
        await self._send(self._topology.failed(event.layer), event.request.request_id.encode(),
                         self._encode_outcome(event), hdrs)

    async def retry(self, tier: Tier, request: InferenceRequest, hdrs: headers.Headers) -> RecordRef:
        return await self._send(self._topology.retry(tier), request.request_id.encode(),
                                self._encode_request(request), hdrs)

    async def dead_letter(self, record: Record, hdrs: headers.Headers) -> None:
        await self._send(self._topology.dead_letters, record.key, record.value, hdrs)

    async def rekey(self, record: Record, request_id: str, hdrs: headers.Headers) -> None:
        await self._send(record.topic, request_id.encode(), record.value, hdrs)

    async def resend(self, topic: str, key: bytes | None, value: bytes | None, hdrs: headers.Headers) -> RecordRef:
        """Send a record again: a stranded request's (the reconciler), a sleeping tier record put back, a request
        parked on the backlog; returns where it went."""
        return await self._send(topic, key, value, hdrs)


class TableStore:
    """``request_state`` as typed values (Avro-encoded in RocksDB and in the changelog); every write is told
    to ``scope``, so the reconciler reads only what may have changed.

    A write goes to the partition's RocksDB, then straight to aiokafka for the changelog, in the order of the
    writes (one lock per partition: a key stays in its partition). faust's ``Table.__setitem__`` wraps each
    changelog record in a future message, queues it for a task that hands it over one at a time, and stores
    its changelog offset in RocksDB per record, a large share of a CPU-bound worker's CPU (design §5.1). The
    offsets delivered in one loop pass are stored once, the highest per partition (faust reads it to resume a
    restore there)."""

    def __init__(self, table: Any, producer: Any, scope: SweepScope, summaries: BatchSummaries) -> None:
        self._table = table
        self._producer = producer
        self._scope = scope
        self._summaries = summaries
        self._in_order: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)  # per changelog partition
        self._delivered: dict[Any, int] = {}  # changelog partition -> highest offset acked, not yet stored

    def get(self, request_id: str) -> RequestState | None:
        """Read from the table's store: ``Table.get`` asks RocksDB twice (``in``, then the value), a third of a
        state read's cost, and adds only faust's monitor count of table reads."""
        key = request_id.encode()
        raw = self._table.data.get(key)
        state = codec.decode(raw, RequestState) if raw else None
        self._summaries.read(key, state)
        return state

    async def put(self, state: RequestState) -> None:
        key = state.request_id.encode()
        value = codec.encode(state)
        event = faust.current_event()
        if event is None:
            raise RuntimeError(f"request {state.request_id}: the state table is written only while handling a record")
        partition = event.message.partition
        replaced = self._replaced(key)
        self._table.data[key] = value  # RocksDB now, before any await: a read right after sees it
        self._scope.written(key)
        self._summaries.written(partition, key, replaced, state)
        async with self._in_order[partition]:  # a later write of the key must not reach the changelog first
            try:
                delivery = await self._producer.send(self._table.changelog_topic_name, key, value,
                                                     partition=partition, timestamp=None, headers=None)
            except Exception as exc:  # aiokafka: no leader before its timeout, a record too large, stopped
                raise StateWriteFailed(f"request {state.request_id}: its {state.status.value} state was written "
                                       f"locally but not sent to the changelog: {exc!r}") from exc
        delivery.add_done_callback(self._on_delivered)

    def _replaced(self, key: bytes) -> RequestState | None:
        """The state a write replaces: the one the handler read (no second decode), else the store's."""
        known, state = self._summaries.known(key)
        if known:
            return state
        raw = self._table.data.get(key)
        try:
            return codec.decode(raw, RequestState) if raw else None
        except codec.CodecError:  # the handler reported it when it read it
            return None

    def _on_delivered(self, delivery: asyncio.Future[Any]) -> None:
        if delivery.cancelled() or delivery.exception() is not None:
            log.error("a state changelog write was not delivered: %r", None if delivery.cancelled()
                      else delivery.exception())
            return
        written = delivery.result()
        if not self._delivered:
            asyncio.get_running_loop().call_soon(self._store_delivered)
        tp = written.topic_partition
        self._delivered[tp] = max(written.offset, self._delivered.get(tp, -1))

    def _store_delivered(self) -> None:
        delivered, self._delivered = self._delivered, {}  # taken first: a failed store must not stop later ones
        for tp, offset in delivered.items():
            try:
                self._table.data.set_persisted_offset(tp, offset)
            except Exception:  # a restore of that partition on this disk then reads a few more records
                log.exception("could not store the changelog offset %d of %s", offset, tp)


class _FaustSender:
    """The worker's producer as the provider-batch log sends: awaited until the broker has the record."""

    def __init__(self, app: faust.App) -> None:
        self._app = app

    async def send_and_wait(self, topic: str, key: bytes, value: bytes | None) -> Any:
        return await self._app.producer.send_and_wait(topic, key, value, None, None, None)


def records_in_hand(calls: int) -> int:
    """Records handled at once for ``calls`` LLM calls in flight (the guards' gate bounds the calls): a quarter
    more, for the records between their call's end and their outcome's ack from the broker (linger, acks=all).
    With exactly as many records as calls, the records waiting for their ack would keep calls from starting."""
    return calls + max(1, calls // 4)


class WorkerRuntime:
    """The app and its parts, built once per process."""

    def __init__(self, settings: Settings, kafka: KafkaConnection, replication_factor: int, models: ModelList,
                 observer: Observer | None = None, batch_sizes: BatchSizes | None = None,
                 fleet: FleetMember | None = None, spend: SpendLedger | None = None,
                 registered: RegisteredSchemas | None = None, tenants: Tenants = NO_TENANTS_FILE) -> None:
        self.settings = settings
        self.topology = settings.topology()
        self._tiers = {self.topology.retry(tier): tier for tier in self.topology.tiers}  # topic -> its tier
        self.app = make_faust_app(settings.faust, kafka, settings.app_id, settings.partitions, replication_factor)
        self.app.conf.stream_buffer_maxsize = max(settings.in_flight * 2, 1024)
        self.table = self.app.Table("request_state", key_type=bytes, value_type=bytes,
                                    partitions=settings.partitions, options=_store_options(settings))
        # faust derives serializers from the types (json for bytes); values are our Avro frames, kept as is.
        # The store and the changelog topic are created lazily, so setting them here covers both.
        untyped_table: Any = self.table  # TableT does not declare the serializer attributes
        untyped_table.key_serializer = untyped_table.value_serializer = "raw"
        encode_outcome = (registered.encode if registered is not None
                          else codec.encode_json if settings.record_format == "json" else codec.encode)
        schemas = registered.reader if registered is not None else NO_REGISTRY
        self.sink = FaustSink(self.app, self.topology, encode_outcome,
                              registered.encode if registered is not None else codec.encode)
        self.sink.on_not_authorized = self._on_not_authorized
        self._hand = records_in_hand(settings.in_flight)
        self.dispatcher = Dispatcher(self._hand, on_stuck=self._on_stuck,
                                     waiting_room=self.app.conf.stream_buffer_maxsize)
        # records waiting for their tenant's room hold at most half the waiting room (new requests) and a hand's
        # worth of it (parked ones), so the retry tiers' sleepers keep theirs
        read_ahead = min(settings.tenant_read_ahead, self.app.conf.stream_buffer_maxsize // 2)
        # a tenant's RPM/TPM quota is the fleet's: each worker paces its part (its records spread over all partitions)
        pace = TenantPace(tenants.quotas, (lambda: 1 / fleet.shares.workers) if fleet is not None
                          else lambda: settings.guards.rate.share)
        self._topic_priority = {topic: priority for priority in PRIORITIES
                                for topic in self.topology.priority_topics(priority)}
        self._input_buffers: dict[str, Any] = {}  # input topic -> its agent's buffer (faust's channel queue)
        urgent_topics = {priority: frozenset(topic for other in more_urgent(priority)
                                             for topic in self.topology.priority_topics(other))
                         for priority in PRIORITIES}
        peer_topics = {topic: frozenset(self.topology.priority_topics(priority)) - {topic}
                       for priority in PRIORITIES for topic in self.topology.priority_topics(priority)}
        self.fetch_pause = FetchPause(self.app)
        self.urgent = UrgentRecords(lambda: self.app.consumer, urgent_topics,
                                    lambda: self.tenant_hand.priorities_waiting(),
                                    self._gate_left_idle, self._rebalancing_or_stopping, peer_topics=peer_topics)
        self.tenant_hand = TenantHand(self._hand, read_ahead, tenants.weights,
                                      lambda tenant: pace.holds_back(tenant, time.monotonic()), self.urgent.arriving,
                                      long_requests_of(settings.guards.in_flight))
        self._backlog_places = asyncio.Semaphore(self._hand)
        guards = settings.guards
        self.llm = DeploymentCaller.connect(models, settings.llm_endpoint, connections=guards.in_flight.ceiling,
                                            hedge_ratio=guards.hedge_ratio,
                                            long_requests=long_requests_of(guards.in_flight))
        self.batch_sizes = batch_sizes or BatchSizes()
        self.guards = Guards.from_settings(guards, fleet.metered(self.llm) if fleet is not None else self.llm,
                                           self._expected_first_attempts, models, self._rebalancing_or_stopping)
        self.guards.share_among(tenants.weights, pace)
        self.guards.yield_to_urgent(self.urgent.coming)
        if fleet is not None and self.guards.limiter is not None:  # the fleet sets its shares from now on
            fleet.attach(self.guards.limiter, self.guards.estimator.cost, self._membership, self.guards.out)
        self.result_index = ResultIndex(settings.data_dir / "result-index" / settings.app_id,
                                        kafka, self.topology.results, forgotten=self.batch_sizes.forgotten,
                                        schemas=schemas)
        self.configuration_problem: ConfigurationProblem | None = None
        self._halted = asyncio.Event()
        self._open_lanes: set[tuple[Any, int]] = set()  # (partition, consumer generation) of records taken
        self.sweep_scope = SweepScope()  # the table's writes, for the reconciler
        self.summaries = BatchSummaries(self.table, self.app.producer, self.topology.summaries, self.owned_partitions,
                                        lambda: self.batch_sizes.forgotten_batches, self._restored)
        store = TableStore(self.table, self.app.producer, self.sweep_scope, self.summaries)
        self.table_purge = TablePurge(self.table, self.app.producer, lambda: self.batch_sizes.forgotten_batches,
                                      self.owned_partitions)
        day_cap = None if settings.max_cost_usd_per_day is None else Cap(settings.max_cost_usd_per_day)
        tenant_caps = {tenant: Cap(quota.max_cost_usd_per_day) for tenant, quota in tenants.quotas.items()
                       if quota.max_cost_usd_per_day is not None}
        self.spend = SpendGate(self.batch_sizes.cap, settings.model_prices, self.guards.estimator, day_cap, spend,
                               tenant_caps)
        self.provider_batches = self._provider_batch_route(settings, kafka, schemas)
        self.handler = Handler(self.guards, self.sink, store, Retries(settings.retry_policy()),
                               self._on_configuration_problem, HandlerOptions(
                                   observer=observer, closed=self.batch_sizes.closed,
                                   reuse=ResultReuse(self.result_index, self.batch_sizes.reuses), spend=self.spend,
                                   json_limits=LineLimits(settings.max_body_bytes, settings.default_model),
                                   encode_result=encode_outcome, schemas=schemas, route=self.provider_batches,
                                   deadline=self.batch_sizes.deadline))
        self._register_agents()

    def _provider_batch_route(self, settings: Settings, kafka: KafkaConnection,
                              schemas: SchemaReader) -> ProviderBatchRoute | None:
        """The provider-batch route of the models STREAMPROC_MODEL_ROUTES names and of the requests whose records ask
        for it (``submit --route``); none without a base URL and no routed model (a worker of a model list only,
        whose records asking for the route are then called)."""
        routing = settings.provider_batches
        if not routing.routed_models and not settings.llm_base_url:
            return None
        batch_log = ProviderBatchLog(_FaustSender(self.app), self.topology.provider_batches)
        api = (AnthropicBatches if routing.api == "anthropic" else OpenAIBatches)(settings.llm_endpoint)
        return ProviderBatchRoute(routing, api, batch_log,
                                  lambda: TopicReader(kafka, [self.topology.provider_batches]),
                                  closed=self.batch_sizes.closed,
                                  outcomes=WrittenOutcomes(kafka, self.topology, schemas),
                                  giving_way=self._rebalancing_or_stopping)

    def _membership(self) -> tuple[bool, int]:
        """Whether the group holds this worker's records (a rebalance, or no input partition yet), and the group
        generation it was last given partitions in."""
        generation = self.app.consumer_generation_id
        if getattr(self.app, "rebalancing", False):
            return True, generation
        try:
            assignment = self.app.consumer.assignment()
        except Exception:  # the consumer is not started yet
            return True, generation
        return not any(tp.topic in self.topology.inputs for tp in assignment), generation

    def _restored(self) -> bool:
        """No rebalance under way and the owned partitions restored: faust resumes the streams only then."""
        return self.app.flow_control.is_active() and not getattr(self.app, "rebalancing", False)

    async def _on_revoked(self, *args: Any, **kwargs: Any) -> None:
        """faust's signal: its sender (the app), then the partitions revoked (a set of TPs)."""
        revoked = args[1] if len(args) > 1 else kwargs.get("revoked", ())
        partitions = {tp.partition for tp in revoked if tp.topic == self.topology.requests}
        self.urgent.revoked(revoked)
        self.summaries.revoked(partitions)
        if self.provider_batches is not None:
            self.provider_batches.revoked(partitions)

    def owned_partitions(self) -> set[int]:
        """The partitions of the state table this worker writes now (those of its requests partitions)."""
        try:
            assignment = self.app.consumer.assignment()
        except Exception:  # the consumer is not started yet
            return set()
        return {tp.partition for tp in assignment if tp.topic == self.topology.requests}

    async def _purge_forgotten(self) -> None:
        """Delete forgotten batches' states from this worker's disk and their answers from its result index; only
        once its partitions are restored (a state the restore writes after the purge would stay)."""
        if not self._restored():
            return
        try:
            await self.table_purge.run_once()
            await self.result_index.drop_batches(self.batch_sizes.forgotten_batches)
        except Exception:  # a partition closed by a rebalance under the pass: the next pass does it again
            log.exception("could not purge the forgotten batches; trying again in %.0f s", _PURGE_INTERVAL_S)

    def _expected_first_attempts(self, batch_id: str) -> float:
        """This worker's share of the batch's submitted requests (its share of the requests partitions)."""
        submitted = self.batch_sizes.submitted(batch_id)
        if not submitted:
            return 0.0
        return submitted * len(self.owned_partitions()) / self.settings.partitions

    # -- agents ------------------------------------------------------------------------------------------
    def _register_agents(self) -> None:
        for topic in self.topology.request_topics:  # an agent per priority and tenant group: none is read behind
            # another's flood
            name = "dispatch-requests" + topic.removeprefix(self.topology.requests).replace(".", "-")
            self.app.agent(self.sink.topic(topic), name=name)(self._dispatch)
        self.app.agent(self.sink.topic(self.topology.backlog), name="dispatch-backlog")(self._dispatch_parked)
        for tier in self.topology.tiers:
            self.app.agent(self.sink.topic(self.topology.retry(tier)), name=f"dispatch-retry-{tier.name}")(
                self._dispatch_delayed)
        watch_skipped_records(self.app, self.topology.inputs, self._on_skipped)
        self.app.timer(_PURGE_INTERVAL_S, name="streamproc.app.forgotten-purge")(self._purge_forgotten)
        self.app.timer(PUBLISH_EVERY_S, name="streamproc.app.batch-summaries")(self._publish_summaries)
        self.app.on_partitions_revoked.connect(self._on_revoked)
        self.app.on_before_shutdown.connect(self._last_summaries)

    async def _publish_summaries(self) -> None:
        try:
            await self.summaries.publish_once()
        except Exception:  # a send refused: what changed is written again at the batch's next change
            log.exception("could not publish the batch summaries")

    async def _last_summaries(self, *_args: Any, **_kwargs: Any) -> None:
        """A worker stopping writes what changed since the last pass: with no other worker to rebuild its partitions,
        status would otherwise miss those changes until a worker starts."""
        await self._publish_summaries()

    async def _dispatch(self, stream: Any) -> None:
        await self._consume(stream, self._submit_request)

    async def _dispatch_parked(self, stream: Any) -> None:
        await self._consume(stream, self._submit_parked)

    async def _dispatch_delayed(self, stream: Any) -> None:
        await self._consume(stream, self._submit_delayed)

    async def _consume(self, stream: Any, submit: Callable[[Any, Record, Ack, float | None], Awaitable[None]]) -> None:
        manual = stream.noack()
        buffer = stream.channel.queue  # the agent's input buffer, which faust fills from the fetches
        async for event in manual.events():
            if self._halted.is_set():
                continue  # held: never acked, read again after the operator's fix
            message = event.message
            self._input_buffers.setdefault(message.topic, buffer)
            self.urgent.reached(message.tp, message.offset)
            record = Record(message.topic, message.partition, message.offset, message.key, message.value,
                            headers.as_mapping(message.headers))

            def ack(event: Any = event) -> Any:
                return manual.ack(event)

            lane = (message.tp, message.generation_id)
            self._open_lane(lane)
            await submit(lane, record, ack, message.timestamp)

    async def _submit_request(self, lane: Any, record: Record, ack: Ack, _produced_s: float | None) -> None:
        """A new request: handled if its tenant is under its quota of the hand, else its id is reserved and it waits
        in memory or is parked on the backlog (design §5.11), so the records behind it, another tenant's among them,
        are read on, and none of them takes its id. Read from a priority's topic, it first lets more urgent records
        go first (:meth:`_yield_reading`)."""
        if (priority := self._topic_priority.get(record.topic)) is not None:
            await self._yield_reading(priority, record.topic)
        if record.key is None:  # the handler first writes it again under its id; that copy is the one scheduled
            await self.dispatcher.submit(lane, record.offset, functools.partial(self.handler.handle, record), ack)
            return
        lane_of_hand = scheduled_lane(record.headers)
        long = self.tenant_hand.long_requests.is_long_record(record.headers)
        if self.tenant_hand.may_take(lane_of_hand, long):
            with self.urgent.submitting(lane_of_hand[1]):
                await self.dispatcher.submit(lane, record.offset,
                                             functools.partial(self._handle_held, lane_of_hand, long, record), ack)
            return
        if self.tenant_hand.read_ahead_full(lane_of_hand):
            await self._yield_to_other_groups(record.topic)
        if await self._resume(lane, record, ack):
            return
        try:
            digest = await self.handler.reserve(record)
        except StateWriteFailed as exc:
            await self._hold(lane, record, ack, exc)
            return
        if self.tenant_hand.may_wait(lane_of_hand, long):
            await self._submit_to_wait(lane, record, ack, lane_of_hand, long, None, digest)
        else:
            await self.dispatcher.submit(lane, record.offset, functools.partial(self._park, record, digest), ack,
                                         call=False)

    async def _yield_reading(self, priority: str, topic: str) -> None:
        """Hold off a record of a lower ``priority`` while every slot is taken and more urgent records are in hand or
        waiting (``reading_yields``): its reservation or parking would take the CPU their handling needs, and a slot
        would not be free for it anyway. Hold it off too, for ``_UNREAD_YIELD_S`` at most, while a more urgent topic
        has records that have not reached their agent (``unread_topics``, :meth:`_hold_off`): faust hands the rest
        of this agent's fetch over at once then, instead of at this agent's pace, and reaches them. A rebalance or stop
        ends the wait (the record is then handled as any)."""

        def yields() -> bool:
            return reading_yields(priority, self.tenant_hand.priorities_present(), self.dispatcher.slots_full)

        await self._hold_off(topic, yields, lambda: self.urgent.arriving(priority))

    async def _yield_to_other_groups(self, topic: str) -> None:
        """Hold off a record that would be parked (its tenant's part of the hand and of the read-ahead full), for
        ``_UNREAD_YIELD_S`` at most, while another tenant group's topic of its priority has records that have not
        reached their agent (:meth:`_hold_off`). Reserving and parking a flood paces the worker's loop (some 200
        records a second), and faust hands the fetched records over in the order they were fetched, the flood's first
        (design §5.11, tenant groups)."""
        await self._hold_off(topic, lambda: False, lambda: self.urgent.peers_arriving(topic))

    async def _hold_off(self, topic: str, yields: Callable[[], bool], arriving: Callable[[], bool]) -> None:
        """Hold off a record of ``topic`` while ``yields()``, or while records of other topics are on their way
        (``arriving()``): then for ``_UNREAD_YIELD_S`` from now at most, only while ``topic``'s buffer takes a whole
        fetch (faust waits, for every topic, while it is full, so holding off then would keep the awaited records
        out), and with ``topic``'s partitions not fetched (:class:`FetchPause`), so faust hands the awaited records
        over at once instead of the ones fetched before them. A rebalance or stop ends the wait."""
        until = time.monotonic() + _UNREAD_YIELD_S
        buffer = self._input_buffers.get(topic)
        paused = False
        try:
            while not self._rebalancing_or_stopping():
                if not yields():
                    if not (time.monotonic() < until and (buffer is None or fetch_fits(buffer.qsize(), buffer.maxsize))
                            and arriving()):
                        return
                    if not paused:
                        self.fetch_pause.pause(topic)
                        paused = True
                await self.tenant_hand.changed()
        finally:
            if paused:
                at_mark = buffer is not None and under_pressure(buffer.qsize(), buffer.maxsize)
                self.fetch_pause.resume(topic, at_mark=at_mark, ran_out=time.monotonic() >= until)

    async def _submit_parked(self, lane: Any, record: Record, ack: Ack, _produced_s: float | None) -> None:
        """A parked request: it waits in the waiting room (no slot) until its tenant is under its quota. Its id is
        reserved already, unless an older release parked it (reserving again writes nothing then). Its reading
        yields to more urgent records as a priority's topic does (:meth:`_yield_reading`, by its own priority)."""
        lane_of_hand = scheduled_lane(record.headers)
        await self._yield_reading(lane_of_hand[1], record.topic)
        if await self._resume(lane, record, ack):
            return
        try:
            digest = await self.handler.reserve(record)
        except StateWriteFailed as exc:
            await self._hold(lane, record, ack, exc)
            return
        long = self.tenant_hand.long_requests.is_long_record(record.headers)
        await self._backlog_places.acquire()
        self.tenant_hand.will_wait(lane_of_hand, long)
        await self._submit_to_wait(lane, record, ack, lane_of_hand, long, self._backlog_places, digest)

    async def _resume(self, lane: Any, record: Record, ack: Ack) -> bool:
        """Handle at once, outside the hand, a record that started an attempt a dead worker left in flight (True):
        that worker had admitted it, and a parked copy, another record, would be skipped as a duplicate of the
        attempt, stranding the request until the reconciler's grace ended (design §4, "Reservations")."""
        if not self.handler.redelivered(record):
            return False
        await self.dispatcher.submit(lane, record.offset, functools.partial(self.handler.handle, record), ack)
        return True

    async def _hold(self, lane: Any, record: Record, ack: Ack, why: StateWriteFailed) -> None:
        """A record whose id could not be reserved is held unacked: the dispatcher stops the worker, and the record
        is read again (it must not wait unreserved, or a later record of its id could take the id)."""
        log.error("holding %s[%d]@%d: %s", record.topic, record.partition, record.offset, why)
        await self.dispatcher.submit(lane, record.offset, _held, ack, call=False)

    async def _submit_to_wait(self, lane: Any, record: Record, ack: Ack, lane_of_hand: Lane, long: bool,
                              place: asyncio.Semaphore | None, digest: str | None) -> None:
        """Wait in the waiting room (no slot) until ``lane_of_hand`` has room in the hand, then handle the record;
        woken by a rebalance or stop first, it is parked at the backlog's tail (the worker must not wait for it,
        design §5.7). The record counts as waiting already (``TenantHand.may_wait``/``will_wait``); ``long``: its size
        class in the hand; ``place``:
        released once the wait ends; ``digest``: its input hash, which names the parked copy in its reservation."""
        taken: list[bool] = []

        async def wait() -> None:
            try:
                taken.append(await self.tenant_hand.wait_to_take(lane_of_hand, self._rebalancing_or_stopping, long))
            finally:
                if place is not None:
                    place.release()

        async def work() -> Disposition:
            if taken == [True]:
                return await self._handle_held(lane_of_hand, long, record)
            return await self._park(record, digest)

        try:
            await self.dispatcher.submit(lane, record.offset, work, ack, wait=wait)
        except BaseException:  # not taken into the waiting room: its wait never runs
            self.tenant_hand.stop_waiting(lane_of_hand, long)
            if place is not None:
                place.release()
            raise

    async def _submit_delayed(self, lane: Any, record: Record, ack: Ack, produced_s: float | None) -> None:
        due_ms = self._due_ms(record, produced_s)
        await self.dispatcher.submit(lane, record.offset, functools.partial(self._when_due, record, due_ms),
                                     ack, wait=functools.partial(self._sleep_until, due_ms))

    async def _handle_held(self, lane_of_hand: Lane, long: bool, record: Record) -> Disposition:
        try:
            return await self.handler.handle(record)
        finally:
            self.tenant_hand.give_back(lane_of_hand, long)

    def _open_lane(self, lane: tuple[Any, int]) -> None:
        """A record of a newer consumer generation means a rebalance happened: the older lanes get no more
        records, so the dispatcher may forget them once their acks are released."""
        if lane in self._open_lanes:
            return
        generation = lane[1]
        for old in [known for known in self._open_lanes if known[1] < generation]:
            self.dispatcher.retire(old)
            self._open_lanes.discard(old)
        self._open_lanes.add(lane)

    async def _requeue(self, record: Record, topic: str | None = None) -> RecordRef:
        """Write the record, unchanged, at the tail of ``topic`` (default: its own): a sleeping tier record put
        back, or a request parked on the backlog; a few tries, since the partition waits for it. Returns where it
        went."""
        async for attempt in AsyncRetrying(stop=stop_after_attempt(5), wait=wait_random_exponential(0.2, 5),
                                           reraise=True):
            with attempt:
                return await self.sink.resend(topic or record.topic, record.key, record.value, dict(record.headers))
        raise AssertionError("unreachable: the last try raises")

    async def _park(self, record: Record, digest: str | None) -> Disposition:
        """Park a request on the backlog; its reservation then names the copy (``digest``: its input hash; None: the
        record holds no request to reserve), so the reconciler finds it if the copy is consumed unhandled."""
        parked = await self._requeue(record, self.topology.backlog)
        if digest is not None and record.key is not None:
            await self.handler.name_parked(record.key.decode("utf-8", "replace"), digest, parked)
        return Disposition.ACK

    def _gate_left_idle(self) -> bool:
        """Every dispatcher slot is taken while the gate could start more calls: a call yielding to urgent records
        that hold no slot yet would keep its own from them (a ``high`` record waits for the slot a ``low`` call
        yielding at the gate holds) and leave the gate idle."""
        limit = self.guards.in_flight_limit
        return self.dispatcher.slots_full and limit is not None and self.guards.calls_in_flight < limit

    def _rebalancing_or_stopping(self) -> bool:
        """Whether the worker is giving its records back (faust suspends its flow control for a rebalance, and
        waits for every record in hand before it goes on): what only waits, sleeping tier records and calls not
        yet sent, then makes way (design §5.7)."""
        return not self.app.flow_control.is_active() or bool(self.app.should_stop)

    def _due_ms(self, record: Record, produced_s: float | None) -> int:
        """The record's ``x-due-ts``, at most its tier's delay after it was written (``produced_s``: its Kafka
        timestamp)."""
        produced_ms = round((produced_s or time.time()) * 1000)
        return due_within_tier(headers.read_hop(record.headers).due_ms, produced_ms, self._tiers[record.topic])

    async def _sleep_until(self, due_ms: int) -> None:
        """Sleep until ``due_ms``, or until a rebalance or shutdown starts (it must not wait for sleepers)."""
        while (wait_s := (due_ms - time.time() * 1000) / 1000) > 0:
            if self._rebalancing_or_stopping():
                return
            await asyncio.sleep(min(wait_s, _REBALANCE_POLL_S))

    async def _when_due(self, record: Record, due_ms: int) -> Disposition:
        """Handle a tier record once due; woken early by a rebalance or stop, put it back at the tail of its
        topic instead (its ack still goes through the ordered lane like any other)."""
        if time.time() * 1000 < due_ms:
            await self._requeue(record)
            return Disposition.ACK
        return await self.handler.handle(record)

    # -- configuration problems --------------------------------------------------------------------------
    def _on_configuration_problem(self, problem: ConfigurationProblem) -> None:
        if self._halted.is_set():
            return
        self.configuration_problem = problem
        self._halted.set()
        log.critical("STOPPING: the LLM endpoint refused the configuration (%s, HTTP %s): %s. %s",
                     problem.code, problem.http_status, problem.message, _what_to_fix(problem))
        asyncio.get_running_loop().create_task(self._halt(ExitCode.CONFIGURATION))

    def _on_not_authorized(self, exc: BaseException) -> None:
        """The cluster took a permission away: stop with the refusal (nothing unwritten is acked; the held
        records are read again once the ACL is back)."""
        if self._halted.is_set():
            return
        self._halted.set()
        log.critical("STOPPING: %s", not_authorized(exc, "Write"))
        asyncio.get_running_loop().create_task(self._halt(ExitCode.CONFIGURATION))

    def _on_stuck(self, lane: object, offset: int, why: str) -> None:
        """A record that can never be acked would stop its partition's commits for good: stop the worker
        instead (loudly), so that the record is read again, by this worker restarted or another one."""
        self._stop_to_read_again(f"the record at offset {offset} of {lane} could neither be handled nor its "
                                 f"outcome written ({why})")

    def _on_skipped(self, topic: str, partition: int, first: int, last: int) -> None:
        """faust skipped records it cannot be made to read again (``faust_fixes`` fix 5): never committed
        past, they would stop the partition's commits for good; a restart reads them from the committed offset."""
        self._stop_to_read_again(f"the consumer skipped offsets {first}..{last} of {topic}[{partition}]")

    def _stop_to_read_again(self, what: str) -> None:
        if self._halted.is_set():
            return
        self._halted.set()
        log.critical("STOPPING: %s; exiting so that it is read again instead of stalling its partition", what)
        asyncio.get_running_loop().create_task(self._halt(ExitCode.FAILED))

    async def _halt(self, exit_code: int) -> None:
        """Let the other in-flight calls finish, commit what is acked, and exit without acking the rest."""
        try:
            await asyncio.wait_for(self.dispatcher.wait_idle(), self.settings.llm_timeout_s + 5)
            await self.app.producer.flush()
            await self.app.commit(set(self.app.consumer.assignment()))
        except Exception:
            log.exception("while stopping")
        logging.shutdown()
        os._exit(exit_code)


async def _held() -> Disposition:
    """The work of a record held unacked: the dispatcher stops the worker, and the record is read again."""
    return Disposition.HOLD


def _store_options(settings: Settings) -> dict[str, Any]:
    """faust's RocksDB options for the state table: bounded memory per partition (scripts/bench state)."""
    mb = 1024 * 1024
    return {"driver": "rocksdict", "write_buffer_size": round(settings.state_write_buffer_mb * mb),
            "max_write_buffer_number": 2, "block_cache_size": round(settings.state_block_cache_mb * mb)}


def _describe(models: ModelList, settings: Settings) -> str:
    """The endpoint, or each deployment of the model list and where it is."""
    if models.serves_any_model:
        return str(settings.llm_base_url)
    return "; ".join(f"{d.key} at {d.api_base or settings.llm_base_url} (weight {d.weight:g})"
                     for d in models.deployments)


def _what_to_fix(problem: ConfigurationProblem) -> str:
    if problem.http_status == 401:
        return "Fix STREAMPROC_LLM_API_KEY, then start the worker again; nothing was marked failed."
    if problem.http_status == 404:
        return "The model or URL does not exist: fix the requests' model or STREAMPROC_LLM_BASE_URL."
    if problem.code == "insufficient_quota":
        return "The account is out of quota: add credit, then start the worker again."
    return "Fix the account or endpoint settings, then start the worker again; nothing was marked failed."


async def wait_for_broker(kafka: KafkaConnection, give_up_after_s: float | None = None) -> None:
    """Retry with backoff (0.5 s doubling up to 10 s) until the cluster answers, saying so, rather than crash
    on a late broker; after ``give_up_after_s`` the last :class:`KafkaError` is raised."""

    def warn(state: RetryCallState) -> None:
        assert state.outcome is not None
        log.warning("Kafka at %s is not reachable (%s); retrying in %.1fs", kafka.describe(), state.outcome.exception(),
                    state.upcoming_sleep)

    retrying = AsyncRetrying(retry=retry_if_exception_type(KafkaError), wait=wait_exponential(multiplier=0.5, max=10.0),
                             stop=stop_never if give_up_after_s is None else stop_after_delay(give_up_after_s),
                             before_sleep=warn, reraise=True)
    await retrying(_list_topics, kafka)


async def _list_topics(kafka: KafkaConnection) -> None:
    admin = kafka_admin(kafka, request_timeout_ms=5000)
    try:
        await admin.start()
        await admin.list_topics()
    except (KafkaError, ssl.SSLError) as exc:
        # a refusal (credentials, TLS, a plaintext client on a TLS port) would fail every retry: stop and say why
        failure = await diagnose(kafka)
        if failure is not None and failure.lasting:
            raise KafkaRefused(failure.reason) from exc
        raise
    finally:
        await admin.close()


def run_worker(settings: Settings, loglevel: str = "INFO") -> int:
    """Run a worker until SIGTERM/SIGINT; returns the process exit code."""
    logging.basicConfig(level=loglevel, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore"):  # httpx logs every request at INFO: a line (and CPU) per LLM call
        logging.getLogger(noisy).setLevel(logging.WARNING)
    write_as_release(settings.upgrade_from)  # during a rolling upgrade, what the older workers read (design §6)
    if settings.schema_registry is not None and settings.record_format == "json":
        # the registry decides the framing (Confluent Avro): JSON asked for as well would be silently ignored
        raise UserFacingError("STREAMPROC_RECORD_FORMAT=json and STREAMPROC_SCHEMA_REGISTRY_URL are both set: with a "
                              "schema registry results are written in the Confluent wire format (Avro); unset one")
    models = load_model_list(settings.models_file, settings.llm_endpoint)  # no endpoint at all stops here
    check_routes(models, settings.guards.routes)
    try:
        tenants = load_tenants(settings.tenants_file)
    except ValueError as bad:
        raise UserFacingError(str(bad)) from None
    # a refused key, or one bound for plain http elsewhere, stops here
    keys = [check_llm_key(deployment_endpoint(deployment, settings.llm_endpoint)) for deployment in models.deployments]
    kafka = resolve_connection(settings)
    password = kafka.sasl_password.get_secret_value() if kafka.sasl_password else None
    registry_access = settings.schema_registry
    registry_password = (registry_access.password.get_secret_value()
                         if registry_access is not None and registry_access.password else None)
    log_redaction.install(secret for secret in (*keys, password, registry_password) if secret)
    topology = settings.topology()
    registered = None
    if registry_access is not None:  # an incompatible schema stops the start here, before anything is written
        registered = register_schemas(registry_access, topology)
        log.info("schema registry %s: subjects <topic>-value registered, ids %s", registry_access.url,
                 ", ".join(f"{record_type.__name__} {schema_id}" for record_type, schema_id in registered.ids.items()))
    try:  # before anything else, so that a taken port fails fast
        metrics = (serve_worker_metrics(settings.worker_metrics_port, settings.worker_metrics_host,
                                        settings.model_prices, [settings.default_model, *models.models(),
                                                                *models.keys()],
                                        settings.metrics_tenants or sorted(tenants.named))
                   if settings.worker_metrics_port else None)
    except OSError as exc:
        log.critical("STOPPING: cannot serve /metrics on %s:%d (%s); change STREAMPROC_WORKER_METRICS_PORT",
                     settings.worker_metrics_host, settings.worker_metrics_port, exc)
        return ExitCode.CONFIGURATION
    if settings.event_loop == "uvloop":  # every loop made from here on: faust's consumer thread's too
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(wait_for_broker(kafka))
    replication = loop.run_until_complete(ensure_pipeline_topics(kafka, topology, settings.durability.replication))
    batch_sizes = BatchSizes()
    loop.run_until_complete(batch_sizes.load(kafka, topology.batches))
    spend = SpendLedger()  # the fleet tells it the others' spend, the handler charges it this worker's
    fleet = (FleetMember(FleetTopic(kafka, topology.fleet, settings.app_id, settings.durability.producer_options()),
                         spend=spend) if settings.guards.rate.follows_fleet else None)
    if fleet is not None:
        loop.run_until_complete(fleet.load())
    runtime = WorkerRuntime(settings, kafka, models=models, observer=metrics, batch_sizes=batch_sizes,
                            replication_factor=replication.factor, fleet=fleet, spend=spend, registered=registered,
                            tenants=tenants)

    async def follow_batch_sizes() -> None:  # no parameters: faust passes the app to a task that takes one
        await batch_sizes.follow(kafka, topology.batches)

    runtime.app.task(follow_batch_sizes)
    if fleet is not None:  # from the start, before the group is joined: the others make room while this one starts
        beating = loop.create_task(fleet.run())

        async def stop_beating(*_args: Any, **_kwargs: Any) -> None:  # once its calls are done: then say it stops
            beating.cancel()
            await asyncio.gather(beating, return_exceptions=True)

        runtime.app.on_before_shutdown.connect(stop_beating)
    if metrics is not None:
        metrics.track_guards(runtime.guards)
        if fleet is not None:
            metrics.track_fleet(lambda: fleet.shares)
        metrics.track_hedges(lambda: runtime.llm.hedged)
        metrics.track_resends(lambda: runtime.guards.resent_after_429)
        metrics.track_spend(runtime.spend)
        watch_worker(metrics, runtime.app, LagSource(kafka, settings.app_id,
                                                     topology.inputs),
                     in_flight=lambda: runtime.dispatcher.in_flight,
                     stall_after_s=topology.tiers[-1].delay_ms / 1000 + settings.llm_timeout_s)
    if settings.retain_finished_ms is not None:  # the owner of partition 0 forgets what finished long enough ago
        forgetter = BatchForgetter(kafka, topology, settings.durability.producer_options())
        retention = AutoForget(forgetter, settings.retain_finished_ms, lambda: 0 in runtime.owned_partitions())
        runtime.app.timer(check_interval_s(settings.retain_finished_ms), name="streamproc.app.auto-forget")(
            retention.run_once)
    if settings.reconcile_interval_s > 0:
        links = ReconcilerLinks(runtime.sweep_scope, metrics.on_redriven if metrics is not None else None,
                                runtime.guards.restore_spent)
        Reconciler(runtime.app, runtime.table, runtime.sink.resend, ConsumerGroup(topology, kafka, settings.app_id),
                   settings.reconcile_grace_s, links).run_every(settings.reconcile_interval_s)
    log.info("worker %s: %d partitions, %d in flight, tiers %s, LLM %s", settings.app_id, settings.partitions,
             settings.in_flight, ",".join(t.name for t in topology.tiers), _describe(models, settings))
    guards = settings.guards
    rate, in_flight, routes = guards.rate, guards.in_flight, guards.routes
    log.info("guards: rate limits %s RPM / %s TPM per model (share %s), in flight %d..%d from %d (latency "
             "gradient), breaker %s, retry budget %g %% + %d, context windows %s, fallbacks %s, context fallbacks %s",
             f"{rate.rpm:g}" if rate.rpm else "learned", f"{rate.tpm:g}" if rate.tpm else "learned",
             f"from the fleet, worker {fleet.worker} starting at {fleet.shares.default:g}" if fleet is not None
             else f"{rate.share:g}, fixed",
             in_flight.floor, in_flight.ceiling, in_flight.start, "on" if guards.breaker else "OFF",
             guards.retry_budget.ratio * 100, guards.retry_budget.minimum, routes.context_windows or "none",
             routes.model_fallbacks or "none", routes.context_fallbacks or "none")
    worker = faust.Worker(runtime.app, loop=loop, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else 0
    return 0


def main() -> None:
    sys.exit(run_worker(Settings()))
