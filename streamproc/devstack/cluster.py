"""A local Kafka cluster of N KRaft nodes (``streamproc broker start --nodes 3``), one JVM per node, for tests and
benchmarks that need replication: a broker can die while the others keep every acknowledged record.

Each node is a :class:`LocalBroker` under ``<data dir>/kafka-cluster/node-<i>``, a combined broker+controller and a
voter of the quorum, with a small heap. The layout (the ports of every node, the cluster id) is kept in
``cluster.json``, so that a node stopped alone (a fault test) comes back at the same address with the same id.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from streamproc.devstack.broker import (
    BrokerStatus,
    LocalBroker,
    LocalKafkaError,
    free_port,
    locked,
    new_cluster_id,
    node_properties,
)
from streamproc.kafka.local_address import (
    LAYOUT_FILE,
    ClusterLayout,
    NodePorts,
    cluster_home,
    node_home,
    port_accepts,
    read_layout,
)
from streamproc.settings import Settings


@dataclass(frozen=True)
class ClusterStatus:
    """Every node's status; ``bootstrap`` names all nodes (clients find the live ones) while any runs."""

    nodes: tuple[BrokerStatus, ...]
    layout: ClusterLayout | None
    version: str

    @property
    def running(self) -> bool:
        return any(node.running for node in self.nodes)

    @property
    def bootstrap(self) -> str | None:
        return self.layout.bootstrap if self.running and self.layout is not None else None

    def as_json(self) -> dict[str, object]:
        """``broker status --json``: the cluster's fields and each node's, as a single broker reports them."""
        return {"running": self.running, "bootstrap": self.bootstrap, "version": self.version,
                "nodes": [node.as_json() for node in self.nodes]}

    def describe(self) -> str:
        if not self.running:
            return "stopped"
        running = sum(node.running for node in self.nodes)
        lines = [f"running: Kafka {self.version} cluster, {running} of {len(self.nodes)} nodes up, "
                 f"bootstrap {self.bootstrap}"]
        assert self.layout is not None
        for node_id, (node, ports) in enumerate(zip(self.nodes, self.layout.nodes, strict=True), start=1):
            state = f"pid {node.pid}" if node.running else "stopped"
            lines.append(f"  node {node_id}: {state} at 127.0.0.1:{ports.port}")
        return "\n".join(lines)


class LocalCluster:
    """N local KRaft nodes under ``<data dir>/kafka-cluster``; every method is safe to call in any state."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = cluster_home(settings.data_dir)
        self.layout_file = self.home / LAYOUT_FILE

    def exists(self) -> bool:
        """A cluster was created in this data dir (running or not)."""
        return self.layout_file.exists()

    def layout(self) -> ClusterLayout | None:
        return read_layout(self.home)

    def node(self, node_id: int) -> LocalBroker:
        return LocalBroker(self.settings, home=node_home(self.home, node_id),
                           heap_mb=self.settings.local_kafka_node_heap_mb)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """Start/stop of the cluster and its nodes, one process at a time."""
        return locked(self.home)

    def status(self) -> ClusterStatus:
        layout = self.layout()
        count = len(layout.nodes) if layout is not None else 0
        return ClusterStatus(tuple(self.node(i).status() for i in range(1, count + 1)), layout,
                             self.settings.local_kafka_version)

    # -- start -------------------------------------------------------------------------------------------
    def _new_layout(self, nodes: int, previous: ClusterLayout | None) -> ClusterLayout:
        """The previous layout when all its ports are free (same addresses across restarts), else ports from
        the settings (node i: port + 2(i-1), controller port + 2(i-1)), else free ones."""
        cluster_id = previous.cluster_id if previous is not None else new_cluster_id()
        if previous is not None and len(previous.nodes) == nodes and not self._taken(previous.nodes):
            return previous
        port, controller_port = self.settings.local_kafka_port, self.settings.local_kafka_controller_port
        if port and controller_port:
            wanted = tuple(NodePorts(port + 2 * i, controller_port + 2 * i) for i in range(nodes))
            every = [p for node in wanted for p in (node.port, node.controller_port)]
            taken = self._taken(wanted)
            if len(set(every)) != len(every) or taken:
                raise LocalKafkaError(
                    f"the cluster's ports {sorted(every)} overlap or are taken ({taken or 'overlap'}); set "
                    "STREAMPROC_LOCAL_KAFKA_PORT and STREAMPROC_LOCAL_KAFKA_CONTROLLER_PORT apart (or both to 0 "
                    "for free ones)")
            return ClusterLayout(cluster_id, wanted)
        chosen: list[int] = []
        while len(chosen) < 2 * nodes:
            candidate = free_port()
            if candidate not in chosen:
                chosen.append(candidate)
        return ClusterLayout(cluster_id, tuple(NodePorts(chosen[2 * i], chosen[2 * i + 1]) for i in range(nodes)))

    @staticmethod
    def _taken(nodes: tuple[NodePorts, ...]) -> list[int]:
        return [p for node in nodes for p in (node.port, node.controller_port) if port_accepts(p)]

    def start(self, nodes: int, timeout: float = 180.0) -> ClusterStatus:
        """Start every node that is not running and return once all accept connections."""
        if nodes < 1:
            raise LocalKafkaError("a cluster needs at least one node")
        with self._locked():
            if LocalBroker(self.settings).status().running:
                raise LocalKafkaError("the single local broker of this data dir is running: stop it first "
                                      "(`streamproc broker stop`) or use another STREAMPROC_DATA_DIR")
            layout = self.layout()
            if layout is not None and len(layout.nodes) != nodes:
                raise LocalKafkaError(
                    f"this data dir holds a {len(layout.nodes)}-node cluster ({self.home}): start it with "
                    f"--nodes {len(layout.nodes)}, or stop it and remove that directory, or use another "
                    "STREAMPROC_DATA_DIR")
            if not self.status().running:
                layout = self._new_layout(nodes, layout)
                self.layout_file.write_text(layout.to_json())
            assert layout is not None
            self._start_nodes(layout, [i for i in range(1, nodes + 1) if not self.node(i).status().running],
                              timeout)
            return self.status()

    def start_node(self, node_id: int, timeout: float = 180.0) -> ClusterStatus:
        """Start one node (stopped alone before) at its old address; the others must be running for it to
        join the quorum."""
        with self._locked():
            layout = self._require_node(node_id)
            if not self.node(node_id).status().running:
                self._start_nodes(layout, [node_id], timeout)
            return self.status()

    def _start_nodes(self, layout: ClusterLayout, node_ids: list[int], timeout: float) -> None:
        """Launch the nodes first, then wait for each: a node is ready only once a quorum of voters runs."""
        launched = []
        for node_id in node_ids:
            node = self.node(node_id)
            node.kill_stale()
            ports = layout.nodes[node_id - 1]
            if self._taken((ports,)):
                raise LocalKafkaError(f"node {node_id}'s ports {ports.port}/{ports.controller_port} are taken by "
                                      "another program; stop the cluster and start it again (it then picks others)")
            proc = node.launch(node_properties(node_id, layout.nodes, node.data_dir), ports.port,
                               ports.controller_port, cluster_id=layout.cluster_id)
            launched.append((node, proc, ports.port))
        for node, proc, port in launched:
            node.await_ready(proc, port, timeout)

    def _require_node(self, node_id: int) -> ClusterLayout:
        layout = self.layout()
        if layout is None:
            raise LocalKafkaError("no local cluster in this data dir: start one with `streamproc broker start "
                                  "--nodes 3`")
        if not 1 <= node_id <= len(layout.nodes):
            raise LocalKafkaError(f"the cluster has nodes 1 to {len(layout.nodes)}, not {node_id}")
        return layout

    # -- stop --------------------------------------------------------------------------------------------
    def stop(self) -> bool:
        """Stop every node (controlled shutdown, all at once); returns whether any was running."""
        with self._locked():
            layout = self.layout()
            nodes = [self.node(i) for i in range(1, len(layout.nodes) + 1)] if layout is not None else []
            # all at once: the last node stopped alone would wait for a quorum that is gone
            was_running = [node.request_stop() for node in nodes]
            for node in nodes:
                node.stop(grace=30.0)
            return any(was_running)

    def stop_node(self, node_id: int) -> bool:
        """Stop one node (controlled shutdown); the others keep serving. Returns whether it was running."""
        with self._locked():
            self._require_node(node_id)
            return self.node(node_id).stop()


def local_kafka(settings: Settings) -> LocalBroker | LocalCluster:
    """The local Kafka of this data dir: the cluster when one was created here, else the single broker."""
    cluster = LocalCluster(settings)
    return cluster if cluster.exists() else LocalBroker(settings)


def start_local_kafka(settings: Settings, nodes: int | None, node: int | None,
                      timeout: float) -> BrokerStatus | ClusterStatus:
    """``broker start``: one node of the cluster, a cluster of ``nodes``, or (no ``nodes``) whatever this data
    dir holds, the single broker by default."""
    cluster = LocalCluster(settings)
    if node is not None:
        return cluster.start_node(node, timeout)
    if nodes is None and cluster.exists():
        layout = cluster.layout()
        nodes = len(layout.nodes) if layout is not None else 1
    if nodes is not None and nodes > 1:
        return cluster.start(nodes, timeout)
    if cluster.status().running:
        raise LocalKafkaError("a local cluster of this data dir is running: stop it first (`streamproc broker "
                              "stop`) or use another STREAMPROC_DATA_DIR")
    return LocalBroker(settings).start(timeout)


def stop_local_kafka(settings: Settings, node: int | None) -> bool:
    """``broker stop``: one node of the cluster, or whatever runs in this data dir; whether anything ran."""
    cluster = LocalCluster(settings)
    if node is not None:
        return cluster.stop_node(node)
    return local_kafka(settings).stop()
