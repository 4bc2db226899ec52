"""A committed offset that stays put while records wait behind it is a stall, reported once."""

from __future__ import annotations

import pytest

from streamproc.core.lag import PartitionLag
from streamproc.core.stalls import StallWatch


def row(committed: int | None, end: int, partition: int = 0, topic: str = "llm.requests") -> PartitionLag:
    return PartitionLag("g", topic, partition, committed, end)


def test_a_partition_that_does_not_commit_while_records_wait_is_stalled_once() -> None:
    watch = StallWatch(threshold_s=100)
    assert watch.observe([row(5, 50)], 0.0) == []
    assert watch.observe([row(5, 60)], 100.0) == []  # exactly the threshold: a slow head record may take it
    [stall] = watch.observe([row(5, 70)], 101.0)
    assert (stall.topic, stall.partition, stall.committed, stall.lag, stall.since) == ("llm.requests", 0, 5, 65, 0.0)
    assert watch.observe([row(5, 80)], 200.0) == []  # still stalled, not reported again
    assert set(watch.stalled) == {("llm.requests", 0)}


def test_progress_or_an_empty_backlog_is_not_a_stall() -> None:
    watch = StallWatch(threshold_s=10)
    for second in range(0, 100, 5):
        assert watch.observe([row(second, second + 50, partition=0), row(7, 7, partition=1)], float(second)) == []
    assert watch.stalled == {}


def test_a_stall_ends_when_the_offset_moves_and_a_revoked_partition_is_forgotten() -> None:
    watch = StallWatch(threshold_s=10)
    watch.observe([row(None, 9)], 0.0)
    assert len(watch.observe([row(None, 9)], 11.0)) == 1  # never committed, records waiting
    watch.observe([row(3, 9)], 12.0)
    assert watch.stalled == {}
    watch.observe([row(3, 9)], 30.0)
    assert watch.stalled != {}
    watch.observe([], 31.0)  # the partition went to another worker
    assert watch.stalled == {}


def test_excused_time_does_not_count_towards_a_stall_but_a_wedge_still_shows() -> None:
    watch = StallWatch(threshold_s=10)
    watch.observe([row(5, 50)], 0.0)
    watch.excuse(8.0)  # e.g. the broker was down for 8 s
    assert watch.observe([row(5, 50)], 15.0) == []  # 15 s without a commit, 8 of them excused
    [stall] = watch.observe([row(5, 50)], 19.0)
    assert stall.since == 8.0
    watch.observe([row(6, 50)], 20.0)
    watch.excuse(5.0)
    assert watch.observe([row(6, 50)], 30.0) == []
    assert len(watch.observe([row(6, 50)], 36.0)) == 1


def test_the_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError):
        StallWatch(0)
