"""Finding the local Kafka from its files: a broker counts only while its own process runs and its port
accepts, a cluster gives every node's address while any node runs, and nothing else is taken for either."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streamproc.devstack.broker import free_port
from streamproc.kafka.local_address import (
    LAYOUT_FILE,
    STATE_FILE,
    ClusterLayout,
    NodePorts,
    cluster_home,
    local_bootstrap,
    node_home,
    running_broker,
)

FakeBroker = Callable[[Path, int], None]

# a process whose command line names kafka.Kafka and the home's server.properties, as the broker's does,
# listening on the port given first (it prints once it listens, so the test never sees a closed port)
_FAKE_BROKER = """
import socket, sys, time
server = socket.socket()
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
print("listening", flush=True)
time.sleep(60)
"""


@pytest.fixture
def fake_broker() -> Iterator[FakeBroker]:
    """Start a stand-in broker for a home on a port and record it there as ``broker start`` does."""
    started: list[subprocess.Popen[str]] = []

    def start(home: Path, port: int) -> None:
        home.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen([sys.executable, "-c", _FAKE_BROKER, str(port), "kafka.Kafka",
                                 str(home / "server.properties")], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        (home / STATE_FILE).write_text(json.dumps({"pid": proc.pid, "port": port, "controller_port": 1}))

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_nothing_recorded_means_nothing_runs(tmp_path: Path) -> None:
    assert local_bootstrap(tmp_path / "kafka", cluster_home(tmp_path)) is None


def test_the_running_single_broker_is_found(tmp_path: Path, fake_broker: FakeBroker) -> None:
    port = free_port()
    fake_broker(tmp_path / "kafka", port)
    assert local_bootstrap(tmp_path / "kafka", cluster_home(tmp_path)) == f"127.0.0.1:{port}"


def test_a_recorded_pid_of_another_process_is_not_the_broker(tmp_path: Path, fake_broker: FakeBroker) -> None:
    port = free_port()
    fake_broker(tmp_path / "other", port)  # alive and listening, but the broker of another home
    other = json.loads((tmp_path / "other" / STATE_FILE).read_text())
    home = tmp_path / "kafka"
    home.mkdir()
    (home / STATE_FILE).write_text(json.dumps({"pid": other["pid"], "port": port}))
    assert running_broker(home) is None
    assert local_bootstrap(home, cluster_home(tmp_path)) is None


def test_a_broker_whose_port_is_closed_does_not_run(tmp_path: Path, fake_broker: FakeBroker) -> None:
    home = tmp_path / "kafka"
    fake_broker(home, free_port())
    assert running_broker(home) is not None
    state = json.loads((home / STATE_FILE).read_text())
    (home / STATE_FILE).write_text(json.dumps({**state, "port": free_port()}))
    assert running_broker(home) is None


def test_a_cluster_gives_every_node_while_one_runs(tmp_path: Path, fake_broker: FakeBroker) -> None:
    cluster = cluster_home(tmp_path)
    cluster.mkdir()
    layout = ClusterLayout("c", (NodePorts(free_port(), 1), NodePorts(free_port(), 2)))
    (cluster / LAYOUT_FILE).write_text(layout.to_json())
    fake_broker(tmp_path / "kafka", free_port())  # a single broker of the same data dir is not the cluster
    assert local_bootstrap(tmp_path / "kafka", cluster) is None
    fake_broker(node_home(cluster, 2), layout.nodes[1].port)
    assert local_bootstrap(tmp_path / "kafka", cluster) == layout.bootstrap
