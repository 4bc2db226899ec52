"""Pure parts of the local broker and cluster: their config, cluster ids, layout and status."""

from __future__ import annotations

from pathlib import Path

from streamproc.devstack.broker import BrokerStatus, new_cluster_id, node_properties, server_properties
from streamproc.devstack.cluster import ClusterStatus
from streamproc.kafka.local_address import ClusterLayout, NodePorts


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


def test_three_node_config_makes_every_node_a_voter_and_replicates_internal_topics() -> None:
    nodes = [NodePorts(19092, 19093), NodePorts(19094, 19095), NodePorts(19096, 19097)]
    props = dict(line.split("=", 1) for line in node_properties(2, nodes, Path("/d2")).splitlines() if line)
    assert props["node.id"] == "2"
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19094,CONTROLLER://127.0.0.1:19095"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19094"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "default.replication.factor"):
        assert props[key] == "3"
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"


def test_cluster_layout_survives_its_file_and_names_every_node() -> None:
    layout = ClusterLayout("AAAAAAAAAAAAAAAAAAAAAA", (NodePorts(1, 2), NodePorts(3, 4), NodePorts(5, 6)))
    assert ClusterLayout.from_json(layout.to_json()) == layout
    assert layout.bootstrap == "127.0.0.1:1,127.0.0.1:3,127.0.0.1:5"


def test_a_cluster_with_one_node_down_still_gives_every_address() -> None:
    layout = ClusterLayout("c", (NodePorts(1, 2), NodePorts(3, 4)))
    up, down = BrokerStatus(True, 10, "127.0.0.1:1", "3.9.2"), BrokerStatus(False, None, None, "3.9.2")
    status = ClusterStatus((up, down), layout, "3.9.2")
    assert status.running and status.bootstrap == "127.0.0.1:1,127.0.0.1:3"
    assert status.describe().splitlines() == [
        "running: Kafka 3.9.2 cluster, 1 of 2 nodes up, bootstrap 127.0.0.1:1,127.0.0.1:3",
        "  node 1: pid 10 at 127.0.0.1:1", "  node 2: stopped at 127.0.0.1:3"]
    stopped = ClusterStatus((down, down), layout, "3.9.2")
    assert (stopped.running, stopped.bootstrap, stopped.describe()) == (False, None, "stopped")
