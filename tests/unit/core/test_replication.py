"""The replication plan: min(3, brokers) replicas and a minimum of 2 in sync by default, refusals explained."""

from __future__ import annotations

import pytest

from streamproc.core.replication import AUTOMATIC, Replication, ReplicationRequest, ReplicationUnsatisfiable


@pytest.mark.parametrize(("brokers", "expected"), [
    (1, Replication(1, 1)),  # the built-in broker: as before, one copy, writes need only the leader
    (2, Replication(2, 1)),  # one broker may die and writes go on
    (3, Replication(3, 2)),  # the usual production setting: one broker may die, every write is on two
    (5, Replication(3, 2)),
])
def test_automatic_replication_follows_the_cluster_size(brokers: int, expected: Replication) -> None:
    assert AUTOMATIC.plan(brokers) == expected


def test_explicit_numbers_are_kept() -> None:
    assert ReplicationRequest(factor=3, min_insync=3).plan(4) == Replication(3, 3)
    assert ReplicationRequest(factor=2).plan(3) == Replication(2, 1)
    assert ReplicationRequest(min_insync=1).plan(3) == Replication(3, 1)


def test_more_replicas_than_brokers_is_refused_with_what_to_set() -> None:
    with pytest.raises(ReplicationUnsatisfiable,
                       match=r"replication factor 3 needs 3 brokers but the cluster has 1: set "
                             r"STREAMPROC_REPLICATION_FACTOR to at most 1"):
        ReplicationRequest(factor=3).plan(1)


def test_a_minimum_above_the_replicas_is_refused() -> None:
    with pytest.raises(ReplicationUnsatisfiable, match=r"min\.insync\.replicas 2 exceeds the replication factor 1"):
        ReplicationRequest(min_insync=2).plan(1)


def test_the_minimum_travels_as_a_topic_config() -> None:
    assert Replication(3, 2).topic_configs() == {"min.insync.replicas": "2"}
