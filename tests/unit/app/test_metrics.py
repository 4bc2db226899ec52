"""Worker metrics: the observer moves the right series, and the real handler calls it at the right places."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from dataclasses import replace
from typing import cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from streamproc.app.handler import Disposition, Handler, HandlerOptions, Record
from streamproc.app.lag_reader import BrokerUnavailable
from streamproc.app.metrics import LagSource, LagWatcher, WorkerMetrics
from streamproc.app.observe import LlmCall, NullObserver, Observer, guarded
from streamproc.app.spend import SpendGate
from streamproc.core.decision import Retries
from streamproc.core.guards.breaker import BreakerState, CircuitBreaker
from streamproc.core.guards.token_estimate import TokenEstimator
from streamproc.core.lag import PartitionLag
from streamproc.core.outcome import Failure, Success
from streamproc.core.provider_batch_deadline import Way
from streamproc.core.retry_policy import RetryPolicy
from streamproc.core.spend_cap import Cap, Exhausted, Spend, batch_scope, day_scope
from streamproc.core.vocabulary import FailureLayer
from streamproc.kafka.connection import KafkaConnection
from streamproc.llm.client import CallResult
from streamproc.llm.completion import check_completion
from streamproc.llm.guarded import Guards
from streamproc.settings import Settings
from tests.unit.app.test_handler import (
    CONTEXT_TOO_LONG,
    READ_TIMEOUT,
    REQUESTS,
    DictStore,
    RecordingSink,
    Reply,
    ScriptedCaller,
    answer,
    completion_bytes,
    make_request,
    submission,
)
from tests.unit.test_monitoring_config import NeverCalled

UNUSED_KAFKA = KafkaConnection(bootstrap="unused:9092")


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> WorkerMetrics:
    return WorkerMetrics(registry)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_observer_hooks_move_their_series(metrics: WorkerMetrics, registry: CollectorRegistry) -> None:
    metrics.on_llm_call(LlmCall("gpt-a", "success", 0.3, 100, 20))
    metrics.on_llm_call(LlmCall("gpt-a", "transport", 12.0, 0, 0))
    metrics.on_result()
    metrics.on_failure("transport", "timeout", False)
    metrics.on_failure("transport", "timeout", False)
    metrics.on_failure("business", "context_length_exceeded", True)
    metrics.on_retry("5s")
    metrics.on_skip("already_succeeded")

    assert value(registry, "streamproc_llm_calls_total", model="gpt-a", outcome="success") == 1
    assert value(registry, "streamproc_llm_calls_total", model="gpt-a", outcome="transport") == 1
    assert value(registry, "streamproc_results_total") == 1
    assert value(registry, "streamproc_failures_total", layer="transport", code="timeout", terminal="false") == 2
    assert value(registry, "streamproc_failures_total", layer="business", code="context_length_exceeded",
                 terminal="true") == 1
    assert value(registry, "streamproc_retries_total", tier="5s") == 1
    assert value(registry, "streamproc_skipped_total", reason="already_succeeded") == 1
    success, transport = {"model": "gpt-a", "outcome": "success"}, {"model": "gpt-a", "outcome": "transport"}
    assert value(registry, "streamproc_llm_latency_seconds_sum", **success) == pytest.approx(0.3)
    assert value(registry, "streamproc_llm_latency_seconds_bucket", le="0.5", **success) == 1
    assert value(registry, "streamproc_llm_latency_seconds_bucket", le="8.0", **transport) == 0
    assert value(registry, "streamproc_llm_latency_seconds_bucket", le="15.0", **transport) == 1
    assert value(registry, "streamproc_llm_tokens_total", model="gpt-a", type="input") == 100
    assert value(registry, "streamproc_llm_tokens_total", model="gpt-a", type="output") == 20
    assert registry.get_sample_value("streamproc_estimated_cost_usd_total", {"model": "gpt-a"}) is None  # no price


def test_cost_is_estimated_from_the_price_table(registry: CollectorRegistry) -> None:
    metrics = WorkerMetrics(registry, prices={"gpt-a": (2.5, 10.0)})  # USD per million input / output tokens
    metrics.on_llm_call(LlmCall("gpt-a", "success", 1.0, 1000, 200))
    metrics.on_llm_call(LlmCall("gpt-a", "semantic", 1.0, 1000, 500))  # a cut-off answer is paid for too
    metrics.on_llm_call(LlmCall("gpt-b", "success", 1.0, 1000, 200))
    assert value(registry, "streamproc_estimated_cost_usd_total", model="gpt-a") == pytest.approx(
        (2000 * 2.5 + 700 * 10.0) / 1e6)
    assert registry.get_sample_value("streamproc_estimated_cost_usd_total", {"model": "gpt-b"}) is None


def test_a_provider_batch_line_costs_half_a_call(registry: CollectorRegistry) -> None:
    metrics = WorkerMetrics(registry, prices={"gpt-a": (2.5, 10.0)})
    metrics.on_llm_call(LlmCall("gpt-a", "success", 1.0, 1000, 200, way=Way.PROVIDER_BATCH))
    assert value(registry, "streamproc_estimated_cost_usd_total", model="gpt-a") == pytest.approx(
        (1000 * 2.5 + 200 * 10.0) / 2 / 1e6)
    metrics.on_llm_call(LlmCall("gpt-a", "success", 1.0, 1000, 200))  # the same model called: the full price
    assert value(registry, "streamproc_estimated_cost_usd_total", model="gpt-a") == pytest.approx(
        (1000 * 2.5 + 200 * 10.0) * 1.5 / 1e6)


def test_in_flight_is_read_at_scrape_time(metrics: WorkerMetrics, registry: CollectorRegistry) -> None:
    running = [3]
    metrics.track_in_flight(lambda: running[0])
    assert value(registry, "streamproc_in_flight") == 3
    running[0] = 0
    assert value(registry, "streamproc_in_flight") == 0


def test_lag_gauge_follows_the_assignment(metrics: WorkerMetrics, registry: CollectorRegistry) -> None:
    metrics.set_lag([PartitionLag("g", "llm.requests", 0, 10, 50), PartitionLag("g", "llm.requests", 1, None, 7)],
                    now=1000.0)
    assert value(registry, "streamproc_consumer_lag", topic="llm.requests", partition="0") == 40
    assert value(registry, "streamproc_consumer_lag", topic="llm.requests", partition="1") == 7
    assert value(registry, "streamproc_consumer_lag_updated_timestamp_seconds") == 1000.0
    metrics.set_lag([PartitionLag("g", "llm.requests", 1, 7, 7)], now=1010.0)  # partition 0 was revoked
    assert registry.get_sample_value("streamproc_consumer_lag", {"topic": "llm.requests", "partition": "0"}) is None
    assert value(registry, "streamproc_consumer_lag", topic="llm.requests", partition="1") == 0


class StuckReader:
    """A lag reader whose partition 0 never commits past offset 5 while records keep arriving."""

    def __init__(self) -> None:
        self.end = 10

    async def partitions(self, group: str, partitions: object) -> list[PartitionLag]:
        self.end += 10
        return [PartitionLag(group, "llm.requests", 0, 5, self.end),
                PartitionLag(group, "llm.requests", 1, self.end, self.end)]


async def test_a_wedged_partition_is_reported_by_gauge_and_log(metrics: WorkerMetrics, registry: CollectorRegistry,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    watcher = LagWatcher(metrics, LagSource(UNUSED_KAFKA, "g", ["llm.requests"]), lambda: [("llm.requests", 0),
                         ("llm.requests", 1)], clock=lambda: now[0], stall_after_s=60, reader=StuckReader())  # type: ignore[arg-type]
    for second in (0.0, 30.0, 60.0):
        now[0] = second
        await watcher.refresh()
    assert value(registry, "streamproc_partition_stalled", topic="llm.requests", partition="0") == 0
    now[0] = 61.0
    with caplog.at_level("WARNING"):
        await watcher.refresh()
    assert value(registry, "streamproc_partition_stalled", topic="llm.requests", partition="0") == 1
    assert value(registry, "streamproc_partition_stalled", topic="llm.requests", partition="1") == 0
    assert "partition llm.requests[0] is stalled: its committed offset 5 has not moved for 61 s" in caplog.text


def test_exposition_has_every_family(metrics: WorkerMetrics, registry: CollectorRegistry) -> None:
    text = generate_latest(registry).decode()
    for family in ("llm_calls_total", "llm_tokens_total", "estimated_cost_usd_total", "results_total",
                   "failures_total", "retries_total", "skipped_total", "llm_latency_seconds", "in_flight",
                   "consumer_lag"):
        assert f"# TYPE streamproc_{family} " in text, family


def test_default_registry_is_private_with_process_metrics() -> None:
    first, second = WorkerMetrics(), WorkerMetrics()  # two instances do not clash
    assert first.registry is not second.registry
    names = {metric.name for metric in first.registry.collect()}
    assert "python_gc_objects_collected" in names and "streamproc_results" in names


# --- the handler drives the observer -----------------------------------------------------------------------


def sent_to_its_model(reply: Reply) -> Reply:
    """``reply`` saying which model it was sent to, as the real client does."""
    return lambda body: replace(reply(body), model=body["model"])


def rig(replies: list[Reply], observer: Observer) -> tuple[Handler, RecordingSink]:
    log: list[str] = []
    sink = RecordingSink(log)
    handler = Handler(ScriptedCaller(replies), sink, DictStore(log), Retries(RetryPolicy()), lambda problem: None,
                      HandlerOptions(observer=observer))
    return handler, sink


async def test_handler_reports_a_success_and_a_duplicate(metrics: WorkerMetrics,
                                                         registry: CollectorRegistry) -> None:
    handler, _ = rig([sent_to_its_model(answer("spam", latency_ms=250))], metrics)
    request = make_request()
    assert await handler.handle(submission(request)) is Disposition.ACK
    assert await handler.handle(submission(request, offset=101)) is Disposition.ACK  # a redelivery

    model = json.loads(request.body_json)["model"]
    assert value(registry, "streamproc_llm_calls_total", model=model, outcome="success") == 1
    assert value(registry, "streamproc_results_total") == 1
    assert value(registry, "streamproc_llm_latency_seconds_sum", model=model, outcome="success") == pytest.approx(
        0.25)
    assert value(registry, "streamproc_llm_tokens_total", model=model, type="input") == 9  # the answer's usage
    assert value(registry, "streamproc_llm_tokens_total", model=model, type="output") == 3
    assert value(registry, "streamproc_skipped_total", reason="already_succeeded") == 1


async def test_handler_reports_a_retry_and_its_failure_event(metrics: WorkerMetrics,
                                                             registry: CollectorRegistry) -> None:
    handler, sink = rig([READ_TIMEOUT], metrics)
    request = make_request()
    await handler.handle(submission(request))

    [(event, _)] = sink.failures
    [sent] = sink.retries
    assert value(registry, "streamproc_failures_total", layer=event.layer.value, code=event.error_code,
                 terminal="false") == 1
    assert value(registry, "streamproc_retries_total", tier=sent.tier.name) == 1
    model = json.loads(request.body_json)["model"]  # the routing names the model the call went to
    assert value(registry, "streamproc_llm_latency_seconds_sum", model=model, outcome="transport") == pytest.approx(
        30.0)
    assert value(registry, "streamproc_results_total") == 0


async def test_handler_counts_the_tokens_of_a_cut_off_answer(metrics: WorkerMetrics,
                                                              registry: CollectorRegistry) -> None:
    raw = completion_bytes("half an ans", finish_reason="length")
    handler, sink = rig([lambda body: CallResult(check_completion(raw, body), raw, 40, model=body["model"])], metrics)
    request = make_request()
    await handler.handle(submission(request))

    [(event, _)] = sink.failures
    assert event.error_code == "truncated"
    model = json.loads(request.body_json)["model"]
    assert value(registry, "streamproc_llm_calls_total", model=model, outcome="semantic") == 1
    assert value(registry, "streamproc_llm_tokens_total", model=model, type="output") == 3


async def test_handler_reports_a_terminal_failure(metrics: WorkerMetrics, registry: CollectorRegistry) -> None:
    handler, sink = rig([CONTEXT_TOO_LONG], metrics)
    await handler.handle(submission(make_request()))

    [(event, _)] = sink.failures
    assert event.terminal
    assert value(registry, "streamproc_failures_total", layer=event.layer.value, code=event.error_code,
                 terminal="true") == 1
    assert value(registry, "streamproc_retries_total", tier="5s") == 0


async def test_handler_reports_a_dead_letter_as_unreadable(metrics: WorkerMetrics,
                                                           registry: CollectorRegistry) -> None:
    handler, sink = rig([], metrics)
    await handler.handle(Record(REQUESTS, 3, 7, None, b"\x00not avro", {}))

    assert len(sink.dead_letters) == 1
    assert value(registry, "streamproc_failures_total", layer="business", code="unreadable_record",
                 terminal="true") == 1
    assert not any(sample.value for family in registry.collect() if family.name == "streamproc_llm_calls"
                   for sample in family.samples)


class Exploding(NullObserver):
    def on_result(self) -> None:
        raise RuntimeError("metrics are broken")


async def test_a_failing_observer_does_not_change_the_outcome() -> None:
    handler, sink = rig([answer("spam")], Exploding())
    assert await handler.handle(submission(make_request())) is Disposition.ACK
    assert len(sink.results) == 1 and sink.failures == []  # no internal_error for a delivered result


def test_guarded_defaults_to_a_no_op() -> None:
    observer = guarded(None)
    assert isinstance(observer, NullObserver)
    observer.on_failure("transport", "timeout", True)
    assert guarded(observer) is observer


def test_hedged_calls_are_read_from_the_client_at_scrape() -> None:
    metrics = WorkerMetrics(CollectorRegistry())
    hedged = [0]
    metrics.track_hedges(lambda: hedged[0])
    hedged[0] = 3
    assert metrics.registry.get_sample_value("streamproc_hedged_calls_total") == 3


def test_resends_after_a_429_are_read_from_the_guards_at_scrape() -> None:
    metrics = WorkerMetrics(CollectorRegistry())
    resent = [0]
    metrics.track_resends(lambda: resent[0])
    resent[0] = 2
    assert metrics.registry.get_sample_value("streamproc_rate_limited_resends_total") == 2



def test_each_models_limit_pace_and_429_share_are_read_from_the_limiter_at_scrape() -> None:
    guards = Guards.from_settings(Settings(llm_rpm=600).guards, NeverCalled())
    assert guards.limiter is not None
    limiter = guards.limiter.for_model("gpt-a", 0.0)
    for call in range(100):  # a window of calls, 12 refused by a 429 that names no bucket: congestion
        if call % 8 == 0 and call < 96:
            limiter.on_rate_limited({}, 1.0, 1, 1.0, started=1.0)
        else:
            limiter.on_answer(1.0, 1.0)
    metrics = WorkerMetrics(CollectorRegistry())
    metrics.track_guards(guards)
    sample = metrics.registry.get_sample_value
    assert sample("streamproc_rate_limit_requests_per_second", {"model": "gpt-a"}) == 10.0  # the limit, unpaced
    assert sample("streamproc_rate_limit_429_share", {"model": "gpt-a"}) == 0.12
    assert sample("streamproc_rate_limit_pace", {"model": "gpt-a"}) == pytest.approx(limiter.pace)
    assert limiter.pace < 1.0  # the share above 10 % cut it


def breaker_in(state: BreakerState) -> CircuitBreaker:
    """A real breaker driven into ``state``: one failure opens it, asking after ``open_s`` half-opens it."""
    breaker = CircuitBreaker(failure_rate=1.0, window_s=10.0, min_calls=1, open_s=5.0)
    if state is not BreakerState.CLOSED:
        breaker.record(False, now=0.0)
    if state is BreakerState.HALF_OPEN:
        assert breaker.allow(now=6.0)
    assert breaker.state is state
    return breaker


@pytest.mark.parametrize("state", list(BreakerState))
def test_breaker_state_is_a_label(state: BreakerState) -> None:
    guards = Guards.from_settings(Settings().guards, NeverCalled())
    cast("MutableMapping[str, CircuitBreaker]", guards.breakers)["gpt-a"] = breaker_in(state)
    metrics = WorkerMetrics(CollectorRegistry())
    metrics.track_guards(guards)
    for other in BreakerState:
        assert metrics.registry.get_sample_value("streamproc_circuit_breaker_state", {
            "model": "gpt-a", "state": other.value}) == (1.0 if other is state else 0.0)


class BrokerAwayReader(StuckReader):
    """The stuck reader, out of reach while ``away`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.away = False

    async def partitions(self, group: str, partitions: object) -> list[PartitionLag]:
        if self.away:
            raise BrokerUnavailable("could not read offsets from Kafka at unused:9092 (node not ready)")
        return await super().partitions(group, partitions)


async def test_time_the_broker_was_out_of_reach_is_not_a_stall(metrics: WorkerMetrics,
                                                                registry: CollectorRegistry) -> None:
    now = [0.0]
    reader = BrokerAwayReader()
    watcher = LagWatcher(metrics, LagSource(UNUSED_KAFKA, "g", ["llm.requests"]), lambda: [("llm.requests", 0)],
                         clock=lambda: now[0], stall_after_s=60, reader=reader)  # type: ignore[arg-type]
    await watcher.refresh()
    now[0], reader.away = 10.0, True
    for second in (10.0, 30.0, 50.0):  # 50 s without a reading: no commit could have happened either
        now[0] = second
        await watcher.refresh()
    now[0], reader.away = 61.0, False
    await watcher.refresh()
    assert value(registry, "streamproc_partition_stalled", topic="llm.requests", partition="0") == 0
    now[0] = 71.0  # 11 s of the stall clock before the broker went away, 10 s after it came back
    await watcher.refresh()
    assert value(registry, "streamproc_partition_stalled", topic="llm.requests", partition="0") == 0
    now[0] = 122.0  # 61 s of reachable time without a move: a wedge
    await watcher.refresh()
    assert value(registry, "streamproc_partition_stalled", topic="llm.requests", partition="0") == 1


def test_what_is_left_under_the_caps_and_the_calls_they_held_are_read_when_scraped(
        metrics: WorkerMetrics, registry: CollectorRegistry) -> None:
    caps = {"b1": Cap(max_cost_usd=2.0)}
    gate = SpendGate(caps.get, {}, TokenEstimator(), day_cap=Cap(max_tokens=1_000))
    metrics.track_spend(gate)
    charge = gate.ledger.begin([(batch_scope("b1"), caps["b1"]), (day_scope(0), Cap(max_tokens=1_000))],
                               Spend(0.5, 400))
    assert not isinstance(charge, Exhausted)
    gate.held["batch"] += 2
    assert registry.get_sample_value("streamproc_budget_left_usd", {"cap": "batch:b1"}) == 1.5
    assert registry.get_sample_value("streamproc_budget_left_tokens", {"cap": "batch:b1"}) is None  # no token cap
    assert registry.get_sample_value("streamproc_budget_left_tokens", {"cap": "day"}) == 600
    assert registry.get_sample_value("streamproc_calls_held_by_cap_total", {"cap": "batch"}) == 2
    assert registry.get_sample_value("streamproc_calls_held_by_cap_total", {"cap": "day"}) == 0


def test_a_call_of_a_listed_deployment_counts_under_its_name(registry: CollectorRegistry) -> None:
    metrics = WorkerMetrics(registry, models=["gpt", "gpt@1", "gpt@2"])
    metrics.on_llm_call(LlmCall("gpt", "success", 0.2, 5, 3, deployment="gpt@2"))
    metrics.on_llm_call(LlmCall("gpt", "transport", 0.1, 0, 0))  # no model list: no deployment series
    assert value(registry, "streamproc_deployment_calls_total", deployment="gpt@2", outcome="success") == 1
    assert value(registry, "streamproc_llm_calls_total", model="gpt", outcome="success") == 1
    assert registry.get_sample_value("streamproc_deployment_calls_total",
                                     {"deployment": "", "outcome": "transport"}) is None


async def test_ended_requests_are_counted_by_tenant_and_priority_with_bounded_labels(
        registry: CollectorRegistry) -> None:
    metrics = WorkerMetrics(registry, tenants=["team-a"])
    handler, sink = rig([answer("spam"), answer("eggs"), CONTEXT_TOO_LONG], metrics)
    await handler.handle(submission(replace(make_request("r-1"), tenant="team-a", priority="high")))
    await handler.handle(submission(make_request("r-2"), hdrs={"x-tenant": b"team-b"}))  # a header names it
    await handler.handle(submission(make_request("r-3")))
    assert [(r.tenant, r.priority) for r in sink.results] == [("team-a", "high"), ("team-b", "normal")]
    assert value(registry, "streamproc_requests_ended_total", tenant="team-a", priority="high",
                 outcome="succeeded") == 1
    assert value(registry, "streamproc_requests_ended_total", tenant="other", priority="normal",
                 outcome="succeeded") == 1  # team-b is not listed
    assert value(registry, "streamproc_requests_ended_total", tenant="default", priority="normal",
                 outcome="failed") == 1


async def test_a_request_with_an_invalid_tenant_header_ends_as_invalid_tenancy(metrics: WorkerMetrics) -> None:
    handler, sink = rig([answer("spam")], metrics)
    await handler.handle(submission(make_request("r-1"), hdrs={"x-tenant": b"no spaces please"}))
    assert sink.results == [] and len(sink.failures) == 1
    failure, _ = sink.failures[0]
    assert (failure.error_code, failure.terminal) == ("invalid_tenancy", True)
    assert "tenant 'no spaces please' is not a tenant name" in failure.message


def test_a_paused_tenant_is_a_gauge_by_tenant_and_model() -> None:
    guards = Guards.from_settings(Settings().guards, NeverCalled())
    pauses = guards.tenant_pauses
    assert pauses is not None  # on by default
    pauses.record("team-b", "gpt-a", Success("fine", "gpt-a", 1, 1), 0.0, pauses.begin("team-b", "gpt-a"))
    refused = Failure(FailureLayer.BUSINESS, "invalid_value", "HTTP 400: bad", 400)
    for _ in range(5):
        pauses.record("team-a", "gpt-a", refused, 1.0, pauses.begin("team-a", "gpt-a"))
    metrics = WorkerMetrics(CollectorRegistry())
    metrics.track_guards(guards)
    assert metrics.registry.get_sample_value("streamproc_tenant_paused", {"tenant": "team-a", "model": "gpt-a"}) == 1
    assert metrics.registry.get_sample_value("streamproc_tenant_paused", {"tenant": "team-b", "model": "gpt-a"}) is None
