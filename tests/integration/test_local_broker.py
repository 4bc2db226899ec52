"""The broker commands, run as a user runs them: start, status, a second start, stop, start again; a cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def streamproc(data_dir: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAMPROC_DATA_DIR": str(data_dir), "STREAMPROC_LOCAL_KAFKA_PORT": "0",
           "STREAMPROC_LOCAL_KAFKA_CONTROLLER_PORT": "0"}
    env.pop("STREAMPROC_KAFKA_BOOTSTRAP", None)
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "streamproc", *args], env=env, capture_output=True,
                          text=True, timeout=180, check=False)


def pid_of(status_line: str) -> int:
    return int(status_line.split(" pid ")[1].split()[0])


def test_start_status_restart_stop(tmp_path: Path) -> None:
    started = streamproc(tmp_path, "broker", "start")
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout.startswith("running: Kafka 3.9.2 pid ")
        first_pid = pid_of(started.stdout)

        status = streamproc(tmp_path, "broker", "status")
        assert status.returncode == 0 and status.stdout == started.stdout

        again = streamproc(tmp_path, "broker", "start")  # a no-op: same process
        assert again.returncode == 0 and pid_of(again.stdout) == first_pid

        bootstrap = streamproc(tmp_path, "broker", "status", "--bootstrap").stdout.strip()
        assert bootstrap.startswith("127.0.0.1:")

        assert streamproc(tmp_path, "broker", "stop").stdout.strip() == "stopped"
        stopped = streamproc(tmp_path, "broker", "status")
        assert stopped.returncode == 1 and stopped.stdout.strip() == "stopped"
        assert streamproc(tmp_path, "broker", "stop").stdout.strip() == "not running"

        restarted = streamproc(tmp_path, "broker", "start")
        assert restarted.returncode == 0, restarted.stderr
        assert pid_of(restarted.stdout) != first_pid
        # same address across restarts, so clients reconnect by themselves
        assert streamproc(tmp_path, "broker", "status", "--bootstrap").stdout.strip() == bootstrap
    finally:
        streamproc(tmp_path, "broker", "stop")


def test_start_after_crash_and_stop_after_crash(tmp_path: Path) -> None:
    started = streamproc(tmp_path, "broker", "start")
    try:
        assert started.returncode == 0, started.stderr
        os.kill(pid_of(started.stdout), signal.SIGKILL)
        assert streamproc(tmp_path, "broker", "status").returncode == 1
        assert streamproc(tmp_path, "broker", "stop").stdout.strip() == "not running"

        restarted = streamproc(tmp_path, "broker", "start")  # the crashed broker's data dir is reused
        assert restarted.returncode == 0, restarted.stderr
        assert restarted.stdout.startswith("running:")
    finally:
        streamproc(tmp_path, "broker", "stop")


def test_missing_java_is_explained(tmp_path: Path) -> None:
    result = streamproc(tmp_path, "broker", "start", path=str(Path(sys.executable).parent))
    assert result.returncode == 3  # configuration refused: a tool is missing
    assert "'java' is not on PATH: install a Java 17 runtime" in result.stderr


def node_pids(status: str) -> dict[int, int | None]:
    """``node N: pid P at ...`` lines of a cluster status -> {N: P, or None when stopped}."""
    pids: dict[int, int | None] = {}
    for line in status.splitlines():
        if line.startswith("  node "):
            node, state = line.strip().removeprefix("node ").split(": ", 1)
            pids[int(node)] = int(state.split()[1]) if state.startswith("pid ") else None
    return pids


def test_a_three_node_cluster_starts_stops_one_node_and_brings_it_back(tmp_path: Path) -> None:
    started = streamproc(tmp_path, "broker", "start", "--nodes", "3")
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout.startswith("running: Kafka 3.9.2 cluster, 3 of 3 nodes up, bootstrap 127.0.0.1:")
        first = node_pids(started.stdout)
        assert sorted(first) == [1, 2, 3] and all(first.values())
        bootstrap = streamproc(tmp_path, "broker", "status", "--bootstrap").stdout.strip()
        assert len(bootstrap.split(",")) == 3

        assert streamproc(tmp_path, "broker", "stop", "--node", "2").stdout.strip() == "stopped"
        degraded = streamproc(tmp_path, "broker", "status")
        assert degraded.returncode == 0 and "2 of 3 nodes up" in degraded.stdout
        assert node_pids(degraded.stdout) == {1: first[1], 2: None, 3: first[3]}
        assert streamproc(tmp_path, "broker", "status", "--bootstrap").stdout.strip() == bootstrap

        again = streamproc(tmp_path, "broker", "start", "--node", "2")  # same address, the others untouched
        assert again.returncode == 0, again.stderr
        back = node_pids(again.stdout)
        assert back[1] == first[1] and back[3] == first[3] and back[2] not in (None, first[2])
        assert streamproc(tmp_path, "broker", "status", "--bootstrap").stdout.strip() == bootstrap

        single = streamproc(tmp_path, "broker", "start", "--nodes", "1")
        assert single.returncode != 0 and "a local cluster of this data dir is running" in single.stderr
    finally:
        assert streamproc(tmp_path, "broker", "stop").stdout.strip() == "stopped"
    assert streamproc(tmp_path, "broker", "status").returncode != 0
    assert streamproc(tmp_path, "broker", "stop").stdout.strip() == "not running"
