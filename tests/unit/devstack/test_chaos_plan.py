"""The pure parts of a chaos run besides the tally: the fault schedule, metrics parsing, deep JSON, poison."""

from __future__ import annotations

import json
import random

import pytest
from aiokafka.partitioner import DefaultPartitioner

from streamproc import codec
from streamproc.core.events import InferenceRequest
from streamproc.core.topology import Topology, parse_tiers
from streamproc.devstack.chaos.config import ChaosConfig, RunNames
from streamproc.devstack.chaos.facts import partition_of
from streamproc.devstack.chaos.fault_schedule import FaultKind, due, plan_faults, spread
from streamproc.devstack.chaos.poison import Expect, PoisonKind, big_body_candidates, build_direct, build_submitted
from streamproc.devstack.chaos.proxy import deep_body_answer, deep_content_answer
from streamproc.devstack.chaos.worker_metrics import HEDGED, REDRIVEN, MetricsLedger, parse_metrics

NAMES = RunNames("chaos-test")
TOPOLOGY = Topology("chaos-test", 8, parse_tiers("1s,2s,4s"), "chaos-test-app")


def test_faults_are_spread_over_the_batch_and_kills_alternate() -> None:
    plan = plan_faults(workers=2, kills=5, kill_pause_s=5, broker_restarts=1, broker_down_s=5, outage_s=30)
    kills = [f for f in plan if f.kind is FaultKind.KILL_WORKER]
    assert [f.worker for f in kills] == [0, 1, 0, 1, 0]
    assert [f.at_fraction for f in kills] == spread(5) == [0.05, 0.2125, 0.375, 0.5375, 0.7]
    [restart] = [f for f in plan if f.kind is FaultKind.RESTART_BROKER]
    assert restart.at_fraction == 0.4562  # halfway between the third and the fourth kill
    assert [f.kind for f in plan].count(FaultKind.LLM_OUTAGE) == 1
    assert [f.at_fraction for f in plan] == sorted(f.at_fraction for f in plan)
    assert len({f.at_fraction for f in plan}) == len(plan)  # no two faults at once
    assert all(0 < f.at_fraction <= 0.7 for f in plan)


def test_with_two_kills_the_restart_falls_between_them_well_before_the_last() -> None:
    plan = plan_faults(workers=2, kills=2, kill_pause_s=3, broker_restarts=1, broker_down_s=3, outage_s=10)
    assert [(f.kind, f.at_fraction) for f in plan] == [
        (FaultKind.KILL_WORKER, 0.05), (FaultKind.LLM_OUTAGE, 0.3), (FaultKind.RESTART_BROKER, 0.375),
        (FaultKind.POISON_WAVE, 0.6), (FaultKind.KILL_WORKER, 0.7)]


def test_no_outage_and_no_kills_plan_nothing_of_them() -> None:
    plan = plan_faults(workers=2, kills=0, kill_pause_s=5, broker_restarts=0, broker_down_s=5, outage_s=0)
    assert [f.kind for f in plan] == [FaultKind.POISON_WAVE]


def test_a_fault_is_due_at_its_progress_or_after_the_longest_gap() -> None:
    (fault, *_) = plan_faults(workers=2, kills=1, kill_pause_s=5, broker_restarts=0, broker_down_s=5, outage_s=0)
    assert not due(fault, progress=0.1, since_previous_s=5, max_gap_s=60)
    assert due(fault, progress=fault.at_fraction, since_previous_s=0, max_gap_s=60)
    assert due(fault, progress=0.0, since_previous_s=60, max_gap_s=60)


def test_config_refuses_kills_without_a_second_worker() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        ChaosConfig(workers=1, kills=1)


def test_metrics_give_in_flight_stalled_partitions_and_redrives() -> None:
    text = "\n".join([
        "# TYPE streamproc_in_flight gauge", "streamproc_in_flight 17.0",
        "# TYPE streamproc_partition_stalled gauge",
        'streamproc_partition_stalled{partition="3",topic="t.requests"} 1.0',
        'streamproc_partition_stalled{partition="4",topic="t.requests"} 0.0',
        "# TYPE streamproc_requests_redriven counter",
        'streamproc_requests_redriven_total{topic="t.retry.1s"} 2.0',
        'streamproc_requests_redriven_total{topic="t.retry.2s"} 1.0',
        "# TYPE streamproc_hedged_calls_total counter", "streamproc_hedged_calls_total 4.0", ""])
    reading = parse_metrics(text)
    assert reading.in_flight == 17
    assert reading.stalled == {("t.requests", 3)}
    assert reading.redriven == 3
    assert reading.counters[HEDGED] == 4
    absent = parse_metrics("# TYPE streamproc_in_flight gauge\nstreamproc_in_flight 0.0\n")
    assert absent.redriven is None and absent.stalled == frozenset()
    unused = parse_metrics("# HELP streamproc_requests_redriven_total Stranded.\n"
                           "# TYPE streamproc_requests_redriven_total counter\n")
    assert unused.redriven == 0  # exported, never incremented: no sample yet


def test_redrives_sum_the_last_reading_of_every_incarnation() -> None:
    ledger = MetricsLedger()
    text = "# TYPE streamproc_requests_redriven counter\nstreamproc_requests_redriven_total {n}\n"
    assert ledger.total(REDRIVEN) is None
    for worker, incarnation, value in ((0, 1, 2), (0, 1, 5), (0, 2, 1), (1, 1, 4)):  # worker 0 restarted at 5
        ledger.add(worker, incarnation, parse_metrics(text.format(n=value)), 1.0)
    assert ledger.total(REDRIVEN) == 10
    assert ledger.total(HEDGED) is None


def test_deep_answers_are_valid_json_nested_beyond_the_parser() -> None:
    with pytest.raises(RecursionError):
        json.loads(deep_body_answer(10_000))
    content = json.loads(deep_content_answer(10_000))["choices"][0]["message"]["content"]
    with pytest.raises(RecursionError):
        json.loads(content)
    assert json.loads(deep_body_answer(5))["deep"] == [[[[[]]]]]


def test_direct_poison_covers_every_kind_with_its_expectation() -> None:
    records = build_direct(TOPOLOGY, NAMES, 1, 2, [7, 8], random.Random(1), 1_000_000)
    kinds = {r.poison.kind for r in records}
    assert kinds == {PoisonKind.RANDOM_KEYED, PoisonKind.RANDOM_UNKEYED, PoisonKind.CONFLUENT_SCHEMA_ID,
                     PoisonKind.UNKNOWN_FINGERPRINT, PoisonKind.TIER_FAR_FUTURE, PoisonKind.TIER_NEGATIVE_DUE,
                     PoisonKind.DUPLICATE_PRODUCED}
    for record in records:
        if record.key is None:
            assert record.poison.expect is Expect.DEAD_LETTER
        if record.poison.kind is PoisonKind.CONFLUENT_SCHEMA_ID:
            assert record.value[:1] == codec.CONFLUENT_MAGIC
        if record.poison.kind is PoisonKind.UNKNOWN_FINGERPRINT:
            with pytest.raises(codec.CodecError):
                codec.decode(record.value, InferenceRequest)
        if record.poison.kind in (PoisonKind.TIER_FAR_FUTURE, PoisonKind.TIER_NEGATIVE_DUE):
            assert record.topic.startswith("chaos-test.retry.")
            due_ms = int(dict(record.headers)["x-due-ts"])
            assert (due_ms > 1_000_000) == (record.poison.kind is PoisonKind.TIER_FAR_FUTURE)
            assert due_ms != 0
    duplicates = [r for r in records if r.poison.kind is PoisonKind.DUPLICATE_PRODUCED]
    assert [r.key for r in duplicates] == [b"chaos-test-batch/ticket-7", b"chaos-test-batch/ticket-8"]


def test_big_body_starts_at_the_asked_size_and_shrinks() -> None:
    sizes = [len(json.loads(codec.decode(c.value, InferenceRequest).body_json)["messages"][0]["content"])
             for c in big_body_candidates(TOPOLOGY, NAMES, 1, 10 * 1024 * 1024)]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] > 10_000_000 and sizes[-1] < 1_000_000


def test_submitted_poison_holds_one_custom_id_twice() -> None:
    submitted = build_submitted(NAMES, 2, 1, [3])
    custom_ids = [json.loads(line)["custom_id"] for line in submitted.lines]
    assert custom_ids.count(submitted.duplicated_custom_id) == 2
    assert "ticket-3" in custom_ids
    assert all(p.request_id and p.request_id.startswith(f"{submitted.batch_id}/") for p in submitted.poison)


def test_partition_of_is_the_default_partitioners() -> None:
    for key in ("ticket-1", "b/ticket-2", "chaos-x-batch/ticket-1694"):
        assert partition_of(key, 8) == DefaultPartitioner()(key.encode(), list(range(8)), list(range(8)))


def test_tenants_split_the_batch_the_first_a_flood() -> None:
    assert ChaosConfig(requests=3000).tenant_sizes() == [3000]
    assert ChaosConfig(requests=3000, tenants=2).tenant_sizes() == [2250, 750]
    assert ChaosConfig(requests=1000, tenants=3).tenant_sizes() == [750, 125, 125]
    names = RunNames("run")
    assert names.tenant_batch_id(0) == names.batch_id and names.tenant_batch_id(1) == "run-batch-team-b"
    with pytest.raises(ValueError, match="too few"):
        ChaosConfig(requests=10, tenants=4)


def test_with_priorities_the_flood_is_submitted_low_and_the_other_tenants_high() -> None:
    config = ChaosConfig(requests=1000, tenants=3, priorities=True)
    assert [config.tenant_priority(i) for i in range(3)] == ["low", "high", "high"]
    assert ChaosConfig(tenants=2).tenant_priority(1) is None
    with pytest.raises(ValueError, match="at least 2 tenants"):
        ChaosConfig(priorities=True)
