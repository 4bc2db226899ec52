"""Stopping processes the one way: SIGTERM, a grace period, then SIGKILL; and polling a condition until it holds.

A :class:`subprocess.Popen` this process started is waited for and reaped (:func:`stop_process`). A bare pid
it did not start (the built-in broker, started by an earlier command) cannot be waited for: :func:`stop_pid`
polls the caller's ``alive`` check instead, which is also where the caller proves that the pid is still the
process it means to stop (a recycled pid must never be signalled).
"""

from __future__ import annotations

import contextlib
import operator
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from tenacity import Retrying, retry_if_result, stop_after_delay, stop_never, wait_fixed


def stop_process(process: subprocess.Popen[Any], grace_s: float, *, group: bool = False) -> int:
    """SIGTERM ``process`` (its process group with ``group``, for one started in a new session), wait up to
    ``grace_s`` seconds, then SIGKILL it; returns its exit code once reaped. A process that already exited
    is only reaped."""
    return stop_processes([process], grace_s, group=group)[0]


def stop_processes(processes: Sequence[subprocess.Popen[Any]], grace_s: float, *,
                   group: bool = False) -> list[int]:
    """:func:`stop_process` for several at once: all get SIGTERM first, so they shut down in parallel; then
    each is waited for up to ``grace_s`` seconds and killed if still running. Returns their exit codes."""
    for process in processes:
        _signal(process, signal.SIGTERM, group)
    for process in processes:
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL, group)
            process.wait()
    return [process.returncode for process in processes]


def _signal(process: subprocess.Popen[Any], signum: int, group: bool) -> None:
    if process.poll() is not None:
        return  # reaped: its pid (and group id) may belong to another process by now
    if group:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)


def stop_pid(pid: int, grace_s: float, *, alive: Callable[[], bool], group: bool = False) -> None:
    """SIGTERM ``pid`` (the process group it leads with ``group``), wait up to ``grace_s`` seconds for
    ``alive()`` to turn false, then SIGKILL and wait until it does. For a process this one did not start:
    ``alive`` must check that ``pid`` is still that process; nothing is signalled once it says no."""
    kill = os.killpg if group else os.kill
    for signum, wait_s, interval_s in ((signal.SIGTERM, grace_s, 0.2), (signal.SIGKILL, None, 0.1)):
        if not alive():
            return
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signum)
        if poll_until(lambda: not alive(), wait_s, interval_s):
            return


def poll_until(condition: Callable[[], bool], timeout_s: float | None, interval_s: float) -> bool:
    """Call ``condition`` every ``interval_s`` seconds until it returns true (then True) or ``timeout_s``
    seconds passed (then False; None waits for ever). An exception from ``condition`` ends the wait."""
    retrying = Retrying(retry=retry_if_result(operator.not_), wait=wait_fixed(interval_s),
                        stop=stop_never if timeout_s is None else stop_after_delay(timeout_s),
                        retry_error_callback=lambda _state: False)
    return bool(retrying(condition))
