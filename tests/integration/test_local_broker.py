"""The broker commands, run as a user runs them: start, status, a second start, stop, start again."""

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
    assert result.returncode == 2
    assert "'java' is not on PATH: install a Java 17 runtime" in result.stderr
