"""Pure parts of the local broker: its config and cluster ids."""

from __future__ import annotations

from pathlib import Path

from streamproc.devstack.broker import new_cluster_id, server_properties


def test_single_node_config_uses_loopback_and_replication_one() -> None:
    props = dict(line.split("=", 1) for line in server_properties(19092, 19093, Path("/d")).splitlines() if line)
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "transaction.state.log.min.isr", "min.insync.replicas"):
        assert props[key] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["log.dirs"] == "/d"


def test_cluster_ids_are_kafka_shaped() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 22 and not i.startswith("-") and "=" not in i for i in ids)
