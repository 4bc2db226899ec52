"""How many copies of every topic the deployment creates, decided from the cluster size (design §3, "Durability").

A write acknowledged with ``acks=all`` is on every in-sync replica, and ``min.insync.replicas`` is the
fewest the leader accepts a write with: with 3 replicas and a minimum of 2, one broker may die without
losing an acknowledged record or refusing writes. The same defaults give 1 and 1 on the single built-in
broker, so one configuration is right for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DEFAULT_MAX_FACTOR: Final = 3
"""The automatic replication factor: this many replicas, or one per broker on a smaller cluster."""


class ReplicationUnsatisfiable(ValueError):
    """The cluster has fewer brokers than the replicas asked for, or the minimum exceeds the replicas."""


@dataclass(frozen=True)
class Replication:
    """The replicas of every topic and the in-sync minimum a write needs."""

    factor: int
    min_insync: int

    def topic_configs(self) -> dict[str, str]:
        """The per-topic config that carries the minimum (a broker's default may differ)."""
        return {"min.insync.replicas": str(self.min_insync)}


@dataclass(frozen=True)
class ReplicationRequest:
    """What the settings ask for; 0 means "decide from the cluster" for either number."""

    factor: int = 0
    min_insync: int = 0

    def plan(self, brokers: int) -> Replication:
        """The replication for a cluster of ``brokers``; raises :class:`ReplicationUnsatisfiable` when it
        cannot be met (Kafka itself would refuse the topics, or accept writes with fewer copies than asked)."""
        factor = self.factor or max(1, min(DEFAULT_MAX_FACTOR, brokers))
        if factor > brokers:
            raise ReplicationUnsatisfiable(
                f"replication factor {factor} needs {factor} brokers but the cluster has {brokers}: "
                f"set STREAMPROC_REPLICATION_FACTOR to at most {brokers} (or 0 for min(3, brokers))")
        # one replica may be lost while writes go on, and an acknowledged write is on two brokers once there are 3
        min_insync = self.min_insync or max(1, min(2, factor - 1))
        if min_insync > factor:
            raise ReplicationUnsatisfiable(
                f"min.insync.replicas {min_insync} exceeds the replication factor {factor}: every write would "
                "be refused; set STREAMPROC_MIN_INSYNC_REPLICAS to at most the replication factor")
        return Replication(factor, min_insync)


AUTOMATIC: Final = ReplicationRequest()
"""Both numbers decided from the cluster: the default, right for one broker and for three."""
