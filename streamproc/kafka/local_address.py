"""Where the built-in Kafka of a data dir listens, and whether it runs, as the files ``streamproc broker start``
keeps there say: ``broker.json`` (a broker's pid and ports) in each broker's home, and ``cluster.json`` (every
node's ports) in a local cluster's.

The worker and the commands find the local broker here without importing the dev stack that starts it;
``devstack/broker`` and ``devstack/cluster`` write these files and read them back through this module.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

STATE_FILE = "broker.json"
LAYOUT_FILE = "cluster.json"


def cluster_home(data_dir: Path) -> Path:
    """Where the local cluster of a data dir lives (node ``i`` in ``node-<i>``)."""
    return data_dir / "kafka-cluster"


def node_home(cluster: Path, node_id: int) -> Path:
    return cluster / f"node-{node_id}"


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@dataclass(frozen=True)
class NodePorts:
    """Where one node listens: clients on ``port``, the KRaft quorum on ``controller_port``."""

    port: int
    controller_port: int


@dataclass(frozen=True)
class ClusterLayout:
    """The cluster's id and where each node listens (node i is ``nodes[i - 1]``)."""

    cluster_id: str
    nodes: tuple[NodePorts, ...]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def to_json(self) -> str:
        return json.dumps({"cluster_id": self.cluster_id,
                           "nodes": [[node.port, node.controller_port] for node in self.nodes]})

    @classmethod
    def from_json(cls, text: str) -> ClusterLayout:
        data = json.loads(text)
        return cls(str(data["cluster_id"]), tuple(NodePorts(int(p), int(c)) for p, c in data["nodes"]))


def read_layout(cluster: Path) -> ClusterLayout | None:
    """The layout of the cluster in ``cluster``; None when none was created there."""
    try:
        return ClusterLayout.from_json((cluster / LAYOUT_FILE).read_text())
    except FileNotFoundError:
        return None


def read_broker_state(home: Path) -> dict[str, int]:
    """What the last launch of the broker in ``home`` recorded (pid, port, controller_port); empty when none."""
    try:
        state = json.loads((home / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {k: int(v) for k, v in state.items() if isinstance(v, int)}


def is_broker_of(home: Path, pid: int) -> bool:
    """True if ``pid`` is alive and is the broker of *this* directory: a recycled pid, or another
    streamproc broker that got it, must never be taken for ours (and killed)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"kafka.Kafka" in cmdline and str(home / "server.properties").encode() in cmdline


@dataclass(frozen=True)
class RunningBroker:
    pid: int
    port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def running_broker(home: Path) -> RunningBroker | None:
    """The broker of ``home`` when it runs and accepts connections; None otherwise."""
    state = read_broker_state(home)
    pid, port = state.get("pid"), state.get("port")
    if pid is None or port is None or not is_broker_of(home, pid) or not port_accepts(port):
        return None
    return RunningBroker(pid, port)


def local_bootstrap(broker_home: Path, cluster: Path) -> str | None:
    """The address of the local Kafka: the cluster's in ``cluster`` when one was created there (every node,
    while any runs: clients find the live ones), else the single broker's in ``broker_home``; None when
    nothing runs."""
    layout = read_layout(cluster)
    if layout is not None:
        homes = (node_home(cluster, node_id) for node_id in range(1, len(layout.nodes) + 1))
        return layout.bootstrap if any(running_broker(home) for home in homes) else None
    broker = running_broker(broker_home)
    return broker.bootstrap if broker is not None else None
