"""Prometheus metrics of a worker, served on ``/metrics`` (``STREAMPROC_WORKER_METRICS_PORT``; 0 = off).

:class:`WorkerMetrics` is the handler's :class:`~streamproc.app.observe.Observer`: counters and the latency
histogram move when the corresponding record is on the broker. ``in_flight`` reads the dispatcher when
scraped. ``consumer_lag`` is refreshed every few seconds by :class:`LagWatcher` from the broker (the
group's committed offsets and the log-end offsets, as ``streamproc lag`` reads them) for the partitions
assigned to *this* worker, so summing over all workers gives the group's lag without double counting.

Every series is prefixed ``streamproc_`` and follows Prometheus' conventions (counters end ``_total``, times
are in seconds, a state is a label):

* ``llm_calls_total{model,outcome}``: LLM calls that came back (every attempt; ``outcome`` is ``success`` or
  the failure's layer); ``llm_latency_seconds{model,outcome}``: their latency (histogram);
  ``llm_tokens_total{model,type}``: tokens the provider counted (``type`` ``input`` or ``output``, as
  OpenTelemetry's ``gen_ai.token.type``), refused and cut-off answers included;
  ``estimated_cost_usd_total{model}``: those tokens at the prices of ``STREAMPROC_MODEL_PRICES`` (models
  listed there only; a provider batch's line at the batch discount); ``deployment_calls_total{deployment,outcome}``:
  the same calls by the deployment of the model list that answered (``STREAMPROC_MODELS_FILE``; its deployments
  are configured labels);
* ``results_total``; ``failures_total{layer,code,terminal}`` (dead letters count as
  ``business``/``unreadable_record``); ``retries_total{tier}``; ``skipped_total{reason}``;
  ``deferred_total{tier}`` (parked by an open breaker); ``requests_redriven_total{why}`` (stranded requests
  whose record the reconciler sent again);
* ``in_flight``: records being handled; ``consumer_lag{topic,partition}``; ``partition_stalled{topic,partition}``;
* ``consumer_lag_updated_timestamp_seconds``: when ``consumer_lag`` was last read successfully;
* guards: ``circuit_breaker_state{model,state}`` (1 for the breaker's state, 0 for the other two of
  ``closed``, ``half_open``, ``open``), ``model_paused{model}``, ``tenant_paused{tenant,model}``,
  ``adaptive_in_flight_limit``,
  ``deployment_in_flight_limit{deployment}`` (the model list's), ``rate_limit_requests_per_second{model}`` /
  ``rate_limit_tokens_per_second{model}`` (the limits paced under, after the share), ``rate_limit_pace{model}``
  (the fraction of them sent at now),
  ``rate_limit_429_share{model}`` (429s naming no bucket, last 100 calls), ``fallbacks_total{model,fallback,reason}``,
  ``retry_budget_exhausted_total``, ``token_estimate_ratio``; ``hedged_calls_total`` (the client's hedges),
  ``rate_limited_resends_total`` (calls the pace sent again in place after a 429);
* the fleet (workers that derive their share, design §5.8): ``rate_limit_share{model}`` (this worker's share of
  each model's limits), ``fleet_workers`` (the live workers it counts, itself included);
* spend caps (design §5.9): ``budget_left_usd{cap}`` and ``budget_left_tokens{cap}`` (what is left under each
  cap this worker charged a call to, as it sees the fleet's spend; ``cap`` is ``day`` or ``batch:<id>``; a kind
  the cap does not bound has no series), ``calls_held_by_cap_total{cap}`` (calls parked at a cap, ``cap``
  ``batch`` or ``day``).

A ``model`` label is bounded (:class:`~streamproc.core.model_labels.ModelLabels`): the models the settings
name keep their names, so do the first 50 others seen, and any later one is ``other`` (a gauge of ``other``
counts its models: breakers in each state, models paused; its rate limits are left out).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streamproc.app.lag_reader import LagError, LagReader
from streamproc.app.observe import LlmCall
from streamproc.app.spend import SpendGate
from streamproc.core.fleet_share import FleetShares
from streamproc.core.guards.breaker import BreakerState
from streamproc.core.guards.rate_limits import NO_LIMITS
from streamproc.core.lag import PartitionLag
from streamproc.core.model_labels import OTHER, ModelLabels
from streamproc.core.spend_cap import BATCH, DAY, TENANT_DAY, way_price
from streamproc.core.stalls import StallWatch
from streamproc.core.tenancy import TenantLabels
from streamproc.kafka.connection import KafkaConnection
from streamproc.llm.guarded import Guards

log = logging.getLogger(__name__)

NAMESPACE = "streamproc"
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
LAG_REFRESH_S = 10.0


class WorkerMetrics:
    """The worker's metrics in one registry; implements :class:`streamproc.app.observe.Observer`."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 prices: Mapping[str, tuple[float, float]] | None = None, models: Iterable[str] = (),
                 tenants: Iterable[str] = ()) -> None:
        """``prices``: USD per million input and output tokens, per model (``STREAMPROC_MODEL_PRICES``);
        ``models``: the other models the settings name (their labels are kept, see the module docstring);
        ``tenants``: the tenants named in labels (``STREAMPROC_METRICS_TENANTS``, else those of
        ``STREAMPROC_TENANTS_FILE``; none: the first 20 seen)."""
        if registry is None:  # a private registry with the usual process metrics (a second instance is fine)
            registry = CollectorRegistry()
            for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                registry.register(collector)
        self.registry = registry
        common: dict[str, Any] = {"namespace": NAMESPACE, "registry": registry}
        self._prices = dict(prices or {})
        self.models = ModelLabels([*self._prices, *models])
        calls = ["model", "outcome"]
        self.calls = Counter("llm_calls", "LLM calls that came back, by the model called and outcome (success or "
                             "the failure's layer); every attempt counts.", calls, **common)
        self.latency = Histogram("llm_latency_seconds", "Latency of LLM calls, by model and outcome.", calls,
                                 buckets=LATENCY_BUCKETS, **common)
        self.deployment_calls = Counter("deployment_calls", "LLM calls that came back, by the deployment of the "
                                        "model list that answered and outcome (with a model list only).",
                                        ["deployment", "outcome"], **common)
        self.tokens = Counter("llm_tokens", "Tokens the provider counted, by model and type (input or output); "
                              "refused and cut-off answers count too.", ["model", "type"], **common)
        self.cost = Counter("estimated_cost_usd", "Estimated cost in US dollars of the tokens, by model, at the "
                            "prices of STREAMPROC_MODEL_PRICES (models listed there only).", ["model"], **common)
        self.results = Counter("results", "Results written to the results topic.", **common)
        self.failures = Counter("failures", "Failure events written, by layer, error code and terminality.",
                                ["layer", "code", "terminal"], **common)
        self.retries = Counter("retries", "Retry records written, by retry tier.", ["tier"], **common)
        self.skipped = Counter("skipped", "Records acked without a call (duplicates), by reason.", ["reason"],
                               **common)
        self.deferred = Counter("deferred", "Records parked unanswered in a retry tier because their model's "
                                "circuit breaker was open or the model is paused, by tier.", ["tier"], **common)
        self.redriven = Counter("requests_redriven", "Stranded requests (their record handled, their state still "
                                "waiting) whose record the reconciler sent again, by why.", ["why"], **common)
        self.tenants = TenantLabels(tenants)
        self.ended = Counter("requests_ended", "Requests that ended, by tenant (those of STREAMPROC_METRICS_TENANTS "
                             "or else of STREAMPROC_TENANTS_FILE, else the first 20 seen; any other is other), "
                             "priority and outcome (succeeded or failed).",
                             ["tenant", "priority", "outcome"], **common)
        self.in_flight = Gauge("in_flight", "Records this worker is handling now.", **common)
        self.consumer_lag = Gauge("consumer_lag", "Records not yet committed by the group, per partition "
                                  "assigned to this worker.", ["topic", "partition"], **common)
        self.lag_updated = Gauge("consumer_lag_updated_timestamp_seconds",
                                 "Unix time of the last successful consumer_lag reading.", **common)
        self.partition_stalled = Gauge("partition_stalled", "1 while a partition's committed offset has not moved "
                                       "for longer than the slowest retry tier plus the LLM timeout although "
                                       "records wait behind it.", ["topic", "partition"], **common)
        self._lag_labels: set[tuple[str, str]] = set()

    # -- Observer ----------------------------------------------------------------------------------------
    def on_llm_call(self, call: LlmCall) -> None:
        model = self.models.label(call.model)
        self.calls.labels(model, call.outcome).inc()
        if call.deployment:
            self.deployment_calls.labels(self.models.label(call.deployment), call.outcome).inc()
        self.latency.labels(model, call.outcome).observe(max(call.latency_s, 0.0))
        if call.input_tokens:
            self.tokens.labels(model, "input").inc(call.input_tokens)
        if call.output_tokens:
            self.tokens.labels(model, "output").inc(call.output_tokens)
        price = self._prices.get(call.model)
        if price is not None:
            price = way_price(price, call.way)
            self.cost.labels(model).inc((call.input_tokens * price[0] + call.output_tokens * price[1]) / 1e6)

    def on_result(self) -> None:
        self.results.inc()

    def on_failure(self, layer: str, code: str, terminal: bool) -> None:
        self.failures.labels(layer=layer, code=code, terminal="true" if terminal else "false").inc()

    def on_retry(self, tier: str) -> None:
        self.retries.labels(tier=tier).inc()

    def on_skip(self, reason: str) -> None:
        self.skipped.labels(reason=reason).inc()

    def on_deferred(self, tier: str) -> None:
        self.deferred.labels(tier=tier).inc()

    def on_ended(self, tenant: str, priority: str, outcome: str) -> None:
        self.ended.labels(self.tenants.label(tenant), priority, outcome).inc()

    def on_redriven(self, why: str) -> None:
        self.redriven.labels(why=why).inc()

    # -- gauges ------------------------------------------------------------------------------------------
    def track_in_flight(self, count: Callable[[], int]) -> None:
        """``in_flight`` reads ``count()`` at every scrape."""
        self.in_flight.set_function(lambda: float(count()))

    def track_guards(self, guards: Guards) -> None:
        """The guards' state, read at every scrape (see :class:`GuardsCollector`); the models their routes name
        keep their labels."""
        self.models.configure(guards.routes.models())
        self.registry.register(GuardsCollector(guards, self.models, self.tenants))

    def track_fleet(self, shares: Callable[[], FleetShares]) -> None:
        """``rate_limit_share`` and ``fleet_workers`` read ``shares()`` at every scrape."""
        self.registry.register(FleetCollector(shares, self.models))

    def track_spend(self, gate: SpendGate) -> None:
        """``budget_left_*`` and ``calls_held_by_cap_total`` read the spend gate at every scrape."""
        self.registry.register(SpendCollector(gate))

    def track_hedges(self, count: Callable[[], int]) -> None:
        """``hedged_calls_total`` reads ``count()`` at every scrape."""
        self.registry.register(_ReadCounter("hedged_calls", "Calls sent a second time because they ran longer "
                                            "than their model's p99 (hedged requests; the first answer wins).",
                                            count))

    def track_resends(self, count: Callable[[], int]) -> None:
        """``rate_limited_resends_total`` reads ``count()`` at every scrape."""
        self.registry.register(_ReadCounter("rate_limited_resends", "Calls sent again in place after a 429 "
                                            "refused them, within the pace's wait (no failure event records "
                                            "them).", count))

    def set_lag(self, rows: Iterable[PartitionLag], now: float) -> None:
        """Replace the ``consumer_lag`` series: partitions no longer listed (revoked) disappear."""
        labels = set()
        for row in rows:
            key = (row.topic, str(row.partition))
            self.consumer_lag.labels(*key).set(row.lag)
            labels.add(key)
        for gone in self._lag_labels - labels:
            self.consumer_lag.remove(*gone)
            with contextlib.suppress(KeyError):  # only partitions read by the lag watcher have one
                self.partition_stalled.remove(*gone)
        self._lag_labels = labels
        self.lag_updated.set(now)

    def set_stalled(self, rows: Iterable[PartitionLag], stalled: Collection[tuple[str, int]]) -> None:
        for row in rows:
            self.partition_stalled.labels(row.topic, str(row.partition)).set(
                1.0 if (row.topic, row.partition) in stalled else 0.0)

    # -- serving -----------------------------------------------------------------------------------------
    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """``/metrics`` on ``host:port`` from a daemon thread; OSError when the port is taken."""
        start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", host, port)


class _ReadCounter(Collector):
    """A counter whose value is read from a plain integer at scrape time."""

    def __init__(self, name: str, documentation: str, read: Callable[[], int]) -> None:
        self._name, self._documentation, self._read = f"{NAMESPACE}_{name}", documentation, read

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(self._name, self._documentation, value=self._read())


class GuardsCollector(Collector):
    """Reads the worker's :class:`Guards` when scraped, so the guards keep plain counters and no metric objects."""

    def __init__(self, guards: Guards, models: ModelLabels | None = None, tenants: TenantLabels | None = None) -> None:
        self._guards = guards
        self._models = models or ModelLabels()
        self._tenants = tenants or TenantLabels(())

    def _tenants_paused(self) -> Metric:
        tenant_paused = GaugeMetricFamily(f"{NAMESPACE}_tenant_paused", "1 while a tenant is paused on a model "
                                          "because its calls failed alike while other tenants' were answered (its "
                                          "requests of that model wait; one probe per interval); for a label "
                                          "\"other\" the number paused under it.", labels=["tenant", "model"])
        by_label: dict[tuple[str, str], int] = {}
        pauses = self._guards.tenant_pauses
        for tenant, model in pauses.paused() if pauses is not None else ():
            key = (self._tenants.label(tenant), self._models.label(model))
            by_label[key] = by_label.get(key, 0) + 1
        for (tenant, model), count in by_label.items():
            tenant_paused.add_metric([tenant, model], count)
        return tenant_paused

    def collect(self) -> Iterable[Metric]:
        guards = self._guards
        label = self._models.label
        breaker = GaugeMetricFamily(f"{NAMESPACE}_circuit_breaker_state", "Circuit breaker per model: 1 for its "
                                    "state (closed, half_open or open), 0 for the others; for model=\"other\" "
                                    "the number of its breakers in each.", labels=["model", "state"])
        states: dict[tuple[str, BreakerState], float] = {}
        for model, current in guards.breaker_states().items():
            for state in BreakerState:
                key = (label(model), state)
                states[key] = states.get(key, 0.0) + (1.0 if state is current else 0.0)
        for (model, state), value in states.items():
            breaker.add_metric([model, state.value], value)
        yield breaker
        paused = GaugeMetricFamily(f"{NAMESPACE}_model_paused", "1 while a model is paused because its first calls "
                                   "all failed alike (its requests wait; one probe a minute); for "
                                   "model=\"other\" the number of its models paused.", labels=["model"])
        paused_by_label: dict[str, int] = {}
        for model in guards.pauses.paused():
            paused_by_label[label(model)] = paused_by_label.get(label(model), 0) + 1
        for model, count in paused_by_label.items():
            paused.add_metric([model], count)
        yield paused
        yield self._tenants_paused()
        if guards.in_flight_limit is not None:
            yield GaugeMetricFamily(f"{NAMESPACE}_adaptive_in_flight_limit",
                                    "The adaptive (latency-gradient) in-flight limit of LLM calls: with a model "
                                    "list, its deployments' limits within the worker's total.",
                                    value=guards.in_flight_limit)
            per_deployment = GaugeMetricFamily(f"{NAMESPACE}_deployment_in_flight_limit", "The adaptive in-flight "
                                               "limit of each deployment of the model list.", labels=["deployment"])
            for deployment, limit in guards.in_flight_limits().items():
                per_deployment.add_metric([deployment], limit)
            yield per_deployment
        if guards.limiter is not None:  # series per model, once a model was called
            rps = GaugeMetricFamily(f"{NAMESPACE}_rate_limit_requests_per_second",
                                    "Requests/s of each model's limit this worker paces under (its share of the "
                                    "requests/min limit / 60; it sends at rate_limit_pace of it).", labels=["model"])
            tps = GaugeMetricFamily(f"{NAMESPACE}_rate_limit_tokens_per_second",
                                    "Tokens/s of each model's limit this worker paces under (its share of the "
                                    "tokens/min limit / 60; it sends at rate_limit_pace of it).", labels=["model"])
            pace = GaugeMetricFamily(f"{NAMESPACE}_rate_limit_pace", "The fraction of each model's limits this "
                                     "worker sends at now (below 1 after congestion).", labels=["model"])
            refused = GaugeMetricFamily(f"{NAMESPACE}_rate_limit_429_share", "Share of each model's last 100 "
                                        "answered calls refused by a 429 that named no bucket.", labels=["model"])
            for model, pacing in guards.pacing().items():
                if label(model) == OTHER:
                    continue  # no one pace stands for many models
                if pacing.limits.rpm is not None:
                    rps.add_metric([model], pacing.limits.rpm / 60)
                if pacing.limits.tpm is not None:
                    tps.add_metric([model], pacing.limits.tpm / 60)
                if pacing.limits != NO_LIMITS:
                    pace.add_metric([model], pacing.pace)
                if pacing.refused_share is not None:
                    refused.add_metric([model], pacing.refused_share)
            yield from (rps, tps, pace, refused)
        fallbacks = CounterMetricFamily(f"{NAMESPACE}_fallbacks", "Calls sent to a fallback model, by reason.",
                                        labels=["model", "fallback", "reason"])
        counts: dict[tuple[str, str, str], int] = {}
        for (model, fallback, reason), count in guards.fallbacks.items():
            route = (label(model), label(fallback), reason)
            counts[route] = counts.get(route, 0) + count
        for route, count in counts.items():
            fallbacks.add_metric(list(route), count)
        yield fallbacks
        yield CounterMetricFamily(f"{NAMESPACE}_retry_budget_exhausted",
                                  "Retryable failures made terminal because their batch's retry budget was spent.",
                                  value=guards.budget_exhausted)
        yield GaugeMetricFamily(f"{NAMESPACE}_token_estimate_ratio",
                                "Calibration of the prompt-token estimate (provider's count / characters-based).",
                                value=guards.estimator.ratio)


class FleetCollector(Collector):
    """This worker's shares of the rate limits, as the fleet derives them, read when scraped."""

    def __init__(self, shares: Callable[[], FleetShares], models: ModelLabels) -> None:
        self._shares = shares
        self._models = models

    def collect(self) -> Iterable[Metric]:
        current = self._shares()
        share = GaugeMetricFamily(f"{NAMESPACE}_rate_limit_share", "This worker's share of each model's rate "
                                  "limits, derived from the fleet's demand.", labels=["model"])
        for model, value in current.by_model.items():
            if self._models.label(model) != OTHER:  # no one share stands for many models
                share.add_metric([model], value)
        yield share
        yield GaugeMetricFamily(f"{NAMESPACE}_fleet_workers", "Live workers this worker counts in its fleet, "
                                "itself included.", value=current.workers)


class SpendCollector(Collector):
    """What is left under the spend caps and the calls they held, read from the worker's spend gate."""

    def __init__(self, gate: SpendGate) -> None:
        self._gate = gate

    def collect(self) -> Iterable[Metric]:
        usd = GaugeMetricFamily(f"{NAMESPACE}_budget_left_usd", "US dollars left under each spend cap this worker "
                                "charged calls to, as it sees the fleet's spend.", labels=["cap"])
        tokens = GaugeMetricFamily(f"{NAMESPACE}_budget_left_tokens", "Tokens left under each spend cap this worker "
                                   "charged calls to, as it sees the fleet's spend.", labels=["cap"])
        for scope, (cost, count) in self._gate.left().items():
            cap = scope.kind if scope.kind == DAY else f"{scope.kind}:{scope.name}"
            if math.isfinite(cost):
                usd.add_metric([cap], cost)
            if math.isfinite(count):
                tokens.add_metric([cap], count)
        yield usd
        yield tokens
        held = CounterMetricFamily(f"{NAMESPACE}_calls_held_by_cap", "Calls not started because their batch, "
                                   "the day or their tenant's day reached its spend cap (their requests wait), by "
                                   "the kind of cap.",
                                   labels=["cap"])
        for kind in (BATCH, DAY, TENANT_DAY):
            held.add_metric([kind], self._gate.held[kind])
        yield held


@dataclass(frozen=True)
class LagSource:
    """Whose lag a worker reports: the consumer group ``group`` on ``kafka``, on its partitions of ``topics``."""

    kafka: KafkaConnection
    group: str
    topics: Collection[str]


class LagWatcher:
    """Refreshes ``consumer_lag`` for the partitions of the source's topics currently assigned to this worker."""

    def __init__(self, metrics: WorkerMetrics, source: LagSource, assignment: Callable[[], Iterable[tuple[str, int]]],
                 clock: Callable[[], float] | None = None, stall_after_s: float = 660.0,
                 reader: LagReader | None = None) -> None:
        self._metrics = metrics
        self._kafka = source.kafka
        self._group = source.group
        self._topics = frozenset(source.topics)
        self._assignment = assignment
        self._clock = clock or time.time
        self._reader: LagReader | None = reader  # None: connects on the first refresh
        self._failing = False
        self._last_read_at: float | None = None
        self._stalls = StallWatch(stall_after_s)

    async def refresh(self) -> None:
        """One reading; a failure is logged (once until it recovers) and leaves the gauges as they were."""
        try:
            mine = {(topic, partition) for topic, partition in self._assignment() if topic in self._topics}
            if self._reader is None:
                reader = LagReader(self._kafka)
                await reader.start()
                self._reader = reader
            rows = await self._reader.partitions(self._group, mine)
        except Exception as exc:  # never let a metric stop the worker
            if not self._failing:
                log.warning("could not read the consumer lag (%s); will retry", exc)
            self._failing = True
            if not isinstance(exc, LagError):
                await self.close()  # reconnect next time
            return
        now = self._clock()
        if self._failing:
            log.info("reading the consumer lag again")
            if self._last_read_at is not None:
                # The broker was out of reach: no partition could commit, which says nothing about a wedge.
                self._stalls.excuse(now - self._last_read_at)
        self._failing = False
        self._last_read_at = now
        self._metrics.set_lag(rows, now)
        for stall in self._stalls.observe(rows, now):
            log.warning("partition %s[%d] is stalled: its committed offset %s has not moved for %.0f s while %d "
                        "records wait behind it", stall.topic, stall.partition, stall.committed, now - stall.since,
                        stall.lag)
        self._metrics.set_stalled(rows, self._stalls.stalled)

    async def close(self, *args: Any, **kwargs: Any) -> None:
        """Close the clients (also a faust ``on_before_shutdown`` receiver, hence the arguments)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            try:
                await reader.close()
            except Exception:
                log.debug("closing the lag reader", exc_info=True)


def serve_worker_metrics(port: int, host: str, prices: Mapping[str, tuple[float, float]],
                         models: Iterable[str] = (), tenants: Iterable[str] = ()) -> WorkerMetrics:
    """The worker's metrics, already served on ``host:port`` (raises OSError when it cannot listen);
    ``models``: the models the settings name besides ``prices`` (their labels are kept); ``tenants``: the
    tenants labels name."""
    metrics = WorkerMetrics(prices=prices, models=models, tenants=tenants)
    metrics.serve(port, host)
    return metrics


def watch_worker(metrics: WorkerMetrics, app: Any, source: LagSource, in_flight: Callable[[], int],
                 interval_s: float = LAG_REFRESH_S, stall_after_s: float = 660.0) -> LagWatcher:
    """Hook the gauges to a faust app: ``in_flight`` from ``in_flight()``, the lag of ``source`` from a periodic
    timer."""
    metrics.track_in_flight(in_flight)

    def assignment() -> list[tuple[str, int]]:
        return [(tp.topic, tp.partition) for tp in app.consumer.assignment()]

    watcher = LagWatcher(metrics, source, assignment, stall_after_s=stall_after_s)
    app.timer(interval_s, name="streamproc.app.metrics.consumer_lag")(watcher.refresh)
    app.on_before_shutdown.connect(watcher.close)
    return watcher
