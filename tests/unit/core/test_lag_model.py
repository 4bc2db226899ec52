"""Lag arithmetic and the drain estimator: pure, no broker."""

from __future__ import annotations

import pytest

from streamproc.core.lag import DrainEstimator, GroupLag, LagReport, PartitionLag, is_internal_topic

G = "streamproc"
REQ = "llm.requests"
TIER = "llm.retry.5s"
CHANGELOG = "streamproc-request_state-changelog"


def part(topic: str, partition: int, committed: int | None, end: int, start: int = 0) -> PartitionLag:
    return PartitionLag(G, topic, partition, committed, end, start)


# --- lag arithmetic ----------------------------------------------------------------------------------------


def test_lag_is_end_minus_committed() -> None:
    assert part(REQ, 0, 120, 500).lag == 380
    assert part(REQ, 0, 500, 500).lag == 0


def test_a_partition_without_commit_counts_from_the_log_start() -> None:
    assert part(REQ, 0, None, 500, start=100).lag == 400


def test_lag_is_never_negative() -> None:
    assert part(REQ, 0, 510, 500).lag == 0  # committed past the end (e.g. the topic was recreated)


@pytest.mark.parametrize(("topic", "internal"), [
    (CHANGELOG, True), ("streamproc-__assignor-__leader", True), ("f-reply-1234", True),
    ("__consumer_offsets", True), (REQ, False), (TIER, False), ("llm.failed.transport", False),
])
def test_faust_and_kafka_topics_are_internal(topic: str, internal: bool) -> None:
    assert is_internal_topic(topic) is internal


def test_group_total_leaves_internal_topics_out() -> None:
    group = GroupLag(G, (part(REQ, 0, 10, 30), part(TIER, 0, 0, 5), part(CHANGELOG, 0, 0, 1000)))
    assert group.lag == 25


def test_over_lists_the_groups_above_the_limit() -> None:
    report = LagReport((GroupLag("a", (part(REQ, 0, 0, 10),)), GroupLag("b", (part(REQ, 0, 0, 11),))),
                       taken_at=0.0)
    assert [g.group for g in report.over(10)] == ["b"]
    assert report.over(11) == []


# --- DrainEstimator ----------------------------------------------------------------------------------------


def test_no_rate_before_two_samples() -> None:
    estimator = DrainEstimator()
    assert estimator.rate(G) is None
    estimator.add(100.0, {(G, REQ, 0): 10})
    assert estimator.rate(G) is None
    assert estimator.span_s() is None
    assert estimator.estimate_seconds(50, G) is None


def test_rate_per_partition_topic_and_group() -> None:
    estimator = DrainEstimator(window_s=60)
    estimator.add(100.0, {(G, REQ, 0): 10, (G, REQ, 1): 0, (G, TIER, 0): 5})
    estimator.add(110.0, {(G, REQ, 0): 60, (G, REQ, 1): 100, (G, TIER, 0): 15})
    assert estimator.rate(G, REQ, 0) == 5.0
    assert estimator.rate(G, REQ) == 15.0
    assert estimator.rate(G, TIER) == 1.0
    assert estimator.rate(G) == 16.0
    assert estimator.rate("other-group") is None
    assert estimator.rate(G, REQ, 7) is None


def test_estimate_divides_the_lag_by_the_rate() -> None:
    estimator = DrainEstimator()
    estimator.add(0.0, {(G, REQ, 0): 0})
    estimator.add(10.0, {(G, REQ, 0): 100})
    assert estimator.estimate_seconds(500, G, REQ) == 50.0
    assert estimator.estimate_seconds(0, G, REQ) == 0.0


def test_no_estimate_without_progress() -> None:
    estimator = DrainEstimator()
    estimator.add(0.0, {(G, REQ, 0): 40})
    estimator.add(10.0, {(G, REQ, 0): 40})
    assert estimator.rate(G) == 0.0
    assert estimator.estimate_seconds(10, G) is None
    assert estimator.estimate_seconds(0, G) == 0.0  # nothing to drain is known without a rate


def test_arrivals_slow_the_drain_and_a_growing_backlog_has_no_estimate() -> None:
    estimator = DrainEstimator()
    estimator.add(0.0, {(G, REQ, 0): 0}, {(G, REQ, 0): 1000})
    estimator.add(10.0, {(G, REQ, 0): 100}, {(G, REQ, 0): 1050})
    assert estimator.rate(G) == 10.0
    assert estimator.arrival_rate(G) == 5.0
    assert estimator.estimate_seconds(950, G) == 190.0  # net 5 records/s
    growing = DrainEstimator()
    growing.add(0.0, {(G, REQ, 0): 0}, {(G, REQ, 0): 1000})
    growing.add(10.0, {(G, REQ, 0): 100}, {(G, REQ, 0): 1200})
    assert growing.estimate_seconds(1100, G) is None


def test_offsets_going_backwards_count_as_no_progress() -> None:
    estimator = DrainEstimator()
    estimator.add(0.0, {(G, REQ, 0): 500, (G, REQ, 1): 0})
    estimator.add(10.0, {(G, REQ, 0): 0, (G, REQ, 1): 20})  # partition 0 was reset to the beginning
    assert estimator.rate(G, REQ) == 2.0


def test_a_partition_first_committed_in_the_last_sample_is_not_counted() -> None:
    estimator = DrainEstimator()
    estimator.add(0.0, {(G, REQ, 0): 0})
    estimator.add(10.0, {(G, REQ, 0): 50, (G, REQ, 1): 10_000})
    assert estimator.rate(G, REQ) == 5.0
    assert estimator.rate(G, REQ, 1) is None


def test_the_window_keeps_the_newest_sample_that_covers_it() -> None:
    estimator = DrainEstimator(window_s=30)
    for second, offset in [(0, 0), (10, 1000), (20, 1100), (30, 1200), (40, 1300), (50, 1400)]:
        estimator.add(float(second), {(G, REQ, 0): offset})
    # samples at 20..50 remain: the early burst (0 -> 1000 in 10 s) has left the window
    assert estimator.span_s() == 30.0
    assert estimator.rate(G) == 10.0


def test_sparse_samples_still_give_a_rate() -> None:
    estimator = DrainEstimator(window_s=5)
    estimator.add(0.0, {(G, REQ, 0): 0})
    estimator.add(60.0, {(G, REQ, 0): 120})
    assert estimator.rate(G) == 2.0


def test_samples_must_come_in_order() -> None:
    estimator = DrainEstimator()
    estimator.add(10.0, {})
    with pytest.raises(ValueError, match="time order"):
        estimator.add(5.0, {})
    with pytest.raises(ValueError):
        DrainEstimator(window_s=0)


def test_estimated_fills_partition_and_group_figures() -> None:
    first = LagReport((GroupLag(G, (part(REQ, 0, 0, 1000), part(REQ, 1, 0, 100), part(TIER, 0, 0, 10),
                                    part(CHANGELOG, 0, 0, 50))),), taken_at=0.0)
    second = LagReport((GroupLag(G, (part(REQ, 0, 100, 1000), part(REQ, 1, 100, 100), part(TIER, 0, 10, 10),
                                     part(CHANGELOG, 0, 0, 80))),), taken_at=10.0)
    estimator = DrainEstimator()
    for report in (first, second):
        estimator.add(report.taken_at, report.committed(), report.ends())
    report = second.estimated(estimator)
    assert report.interval_s == 10.0
    group = report.group(G)
    by_key = {(p.topic, p.partition): p for p in group.partitions}
    assert by_key[(REQ, 0)].rate == 10.0 and by_key[(REQ, 0)].eta_seconds == 90.0
    assert by_key[(REQ, 1)].eta_seconds == 0.0
    assert by_key[(TIER, 0)].rate == 1.0
    assert by_key[(CHANGELOG, 0)].eta_seconds is None  # arriving, never consumed: shown, not counted
    assert group.lag == 900
    assert group.rate == 21.0  # requests 20/s + tier 1/s; the changelog is left out
    assert group.eta_seconds == pytest.approx(900 / 21)  # the topics share the workers: one pace for all


def estimated_group(before: tuple[PartitionLag, ...], after: tuple[PartitionLag, ...]) -> GroupLag:
    first, second = LagReport((GroupLag(G, before),), taken_at=0.0), LagReport((GroupLag(G, after),), taken_at=10.0)
    estimator = DrainEstimator()
    for report in (first, second):
        estimator.add(report.taken_at, report.committed(), report.ends())
    return second.estimated(estimator).group(G)


def test_group_eta_counts_a_topic_without_commits_at_the_group_pace() -> None:
    group = estimated_group((part(REQ, 0, 0, 100), part(TIER, 0, None, 10)),
                            (part(REQ, 0, 50, 100), part(TIER, 0, None, 10)))
    assert group.lag == 60
    assert group.rate == 5.0
    assert group.eta_seconds == 12.0


def test_group_eta_is_unknown_when_records_arrive_faster_than_they_are_consumed() -> None:
    group = estimated_group((part(REQ, 0, 0, 100), part(TIER, 0, 0, 10)),
                            (part(REQ, 0, 50, 100), part(TIER, 0, 0, 70)))  # 5/s consumed, 6/s retried
    assert group.rate == 5.0
    assert group.eta_seconds is None
