"""Stopping real child processes: SIGTERM, the grace period, SIGKILL, process groups, bare pids; polling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamproc.processes import poll_until, stop_pid, stop_process, stop_processes

# a Python child that ignores SIGTERM, says so, then starts ``sleep 30`` and prints its pid
_STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "30"])
print(child.pid, flush=True)
time.sleep(30)
"""


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; whatever a failed test leaves running is killed."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def spawn(started: list[subprocess.Popen[bytes]], *command: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    started.append(process)
    return process


def stubborn(started: list[subprocess.Popen[bytes]]) -> tuple[subprocess.Popen[bytes], int]:
    """The SIGTERM-ignoring child, once it ignores SIGTERM, and the pid of its ``sleep`` grandchild."""
    process = spawn(started, sys.executable, "-c", _STUBBORN)
    assert process.stdout is not None
    grandchild = int(process.stdout.readline())
    process.stdout.close()
    return process, grandchild


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead, waiting for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_process_that_obeys_sigterm_is_not_killed(started: list[subprocess.Popen[bytes]]) -> None:
    process = spawn(started, "sleep", "30")
    began = time.monotonic()
    assert stop_process(process, 10) == -signal.SIGTERM
    assert time.monotonic() - began < 5
    assert process.returncode == -signal.SIGTERM  # reaped


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(started: list[subprocess.Popen[bytes]]) -> None:
    process, grandchild = stubborn(started)
    began = time.monotonic()
    assert stop_process(process, 0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - began < 5
    assert not gone(grandchild)  # only the process was signalled, not its group
    os.kill(grandchild, signal.SIGKILL)


def test_group_stops_the_whole_process_group(started: list[subprocess.Popen[bytes]]) -> None:
    process, grandchild = stubborn(started)
    assert stop_process(process, 0.5, group=True) == -signal.SIGKILL
    assert poll_until(lambda: gone(grandchild), 5, 0.05)  # the grandchild's SIGTERM ended it at once


def test_an_exited_process_is_only_reaped(started: list[subprocess.Popen[bytes]]) -> None:
    process = spawn(started, sys.executable, "-c", "raise SystemExit(7)")
    assert poll_until(lambda: gone(process.pid), 10, 0.05)
    assert stop_process(process, 10, group=True) == 7
    assert stop_process(process, 10) == 7  # and again: nothing to signal


def test_several_get_sigterm_together(started: list[subprocess.Popen[bytes]]) -> None:
    stubborn_one, grandchild = stubborn(started)
    obedient = spawn(started, "sleep", "30")
    began = time.monotonic()
    assert stop_processes([stubborn_one, obedient], 1.0) == [-signal.SIGKILL, -signal.SIGTERM]
    assert time.monotonic() - began < 5
    os.kill(grandchild, signal.SIGKILL)


def test_a_bare_pid_is_stopped_while_the_caller_says_it_is_alive(started: list[subprocess.Popen[bytes]]) -> None:
    process, grandchild = stubborn(started)
    checks: list[bool] = []

    def alive() -> bool:
        checks.append(not gone(process.pid))  # not reaped by stop_pid: a zombie counts as gone
        return checks[-1]

    stop_pid(process.pid, 0.5, alive=alive, group=True)
    assert gone(process.pid) and checks[-1] is False
    assert process.wait(5) == -signal.SIGKILL
    assert poll_until(lambda: gone(grandchild), 5, 0.05)


def test_a_bare_pid_that_is_not_the_callers_any_more_is_left_alone(started: list[subprocess.Popen[bytes]]) -> None:
    process = spawn(started, "sleep", "30")
    stop_pid(process.pid, 0.5, alive=lambda: False, group=True)
    time.sleep(0.2)
    assert process.poll() is None  # never signalled


def test_poll_until_says_whether_the_condition_came_true() -> None:
    calls: list[float] = []

    def third_time() -> bool:
        calls.append(time.monotonic())
        return len(calls) == 3

    assert poll_until(third_time, 5, 0.05)
    assert len(calls) == 3 and calls[2] - calls[0] >= 0.1
    began = time.monotonic()
    assert not poll_until(lambda: False, 0.3, 0.05)
    assert 0.3 <= time.monotonic() - began < 2


def test_poll_until_passes_an_exception_on() -> None:
    def broken() -> bool:
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="the process exited"):
        poll_until(broken, 5, 0.05)
