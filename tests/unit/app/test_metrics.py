"""Worker metrics: the observer moves the right series, and the real handler calls it at the right places."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from streamproc.app.handler import Disposition, Handler, Record
from streamproc.app.metrics import LagWatcher, WorkerMetrics
from streamproc.app.observe import NullObserver, Observer, guarded
from streamproc.core.lag import PartitionLag
from streamproc.core.retry_policy import RetryPolicy
from tests.unit.app.test_handler import (
    CONTEXT_TOO_LONG,
    READ_TIMEOUT,
    REQUESTS,
    DictStore,
    RecordingSink,
    Reply,
    ScriptedCaller,
    answer,
    make_request,
    submission,
)


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
    metrics.on_started()
    metrics.on_started()
    metrics.on_llm_call(0.3)
    metrics.on_llm_call(12.0)
    metrics.on_result()
    metrics.on_failure("transport", "timeout", False)
    metrics.on_failure("transport", "timeout", False)
    metrics.on_failure("business", "context_length_exceeded", True)
    metrics.on_retry("5s")
    metrics.on_skip("already_succeeded")

    assert value(registry, "streamproc_requests_started_total") == 2
    assert value(registry, "streamproc_results_total") == 1
    assert value(registry, "streamproc_failures_total", layer="transport", code="timeout", terminal="false") == 2
    assert value(registry, "streamproc_failures_total", layer="business", code="context_length_exceeded",
                 terminal="true") == 1
    assert value(registry, "streamproc_retries_total", tier="5s") == 1
    assert value(registry, "streamproc_skipped_total", reason="already_succeeded") == 1
    assert value(registry, "streamproc_llm_latency_seconds_count") == 2
    assert value(registry, "streamproc_llm_latency_seconds_sum") == pytest.approx(12.3)
    assert value(registry, "streamproc_llm_latency_seconds_bucket", le="0.5") == 1
    assert value(registry, "streamproc_llm_latency_seconds_bucket", le="15.0") == 2


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
    watcher = LagWatcher(metrics, "unused:9092", "g", ["llm.requests"], lambda: [("llm.requests", 0),
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
    for family in ("requests_started_total", "results_total", "failures_total", "retries_total", "skipped_total",
                   "llm_latency_seconds", "in_flight", "consumer_lag"):
        assert f"# TYPE streamproc_{family} " in text, family


def test_default_registry_is_private_with_process_metrics() -> None:
    first, second = WorkerMetrics(), WorkerMetrics()  # two instances do not clash
    assert first.registry is not second.registry
    names = {metric.name for metric in first.registry.collect()}
    assert "python_gc_objects_collected" in names and "streamproc_results" in names


# --- the handler drives the observer -----------------------------------------------------------------------


def rig(replies: list[Reply], observer: Observer) -> tuple[Handler, RecordingSink]:
    log: list[str] = []
    sink = RecordingSink(log)
    handler = Handler(ScriptedCaller(replies), sink, DictStore(log), RetryPolicy(), lambda problem: None,
                      observer=observer)
    return handler, sink


async def test_handler_reports_a_success_and_a_duplicate(metrics: WorkerMetrics,
                                                         registry: CollectorRegistry) -> None:
    handler, _ = rig([answer("spam", latency_ms=250)], metrics)
    request = make_request()
    assert await handler.handle(submission(request)) is Disposition.ACK
    assert await handler.handle(submission(request, offset=101)) is Disposition.ACK  # a redelivery

    assert value(registry, "streamproc_requests_started_total") == 1
    assert value(registry, "streamproc_results_total") == 1
    assert value(registry, "streamproc_llm_latency_seconds_sum") == pytest.approx(0.25)
    assert value(registry, "streamproc_skipped_total", reason="already_succeeded") == 1


async def test_handler_reports_a_retry_and_its_failure_event(metrics: WorkerMetrics,
                                                             registry: CollectorRegistry) -> None:
    handler, sink = rig([READ_TIMEOUT], metrics)
    await handler.handle(submission(make_request()))

    [(event, _)] = sink.failures
    [sent] = sink.retries
    assert value(registry, "streamproc_failures_total", layer=event.layer.value, code=event.error_code,
                 terminal="false") == 1
    assert value(registry, "streamproc_retries_total", tier=sent.tier.name) == 1
    assert value(registry, "streamproc_llm_latency_seconds_sum") == pytest.approx(30.0)
    assert value(registry, "streamproc_results_total") == 0


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
    assert value(registry, "streamproc_requests_started_total") == 0


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
