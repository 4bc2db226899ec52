"""The worker processes of one benchmark run: one or several on the same topics, and a scenario that starts one
more or SIGKILLs one while the batch runs (``scripts/bench fleet``'s multi-worker rows).

The workers share nothing but the broker: each has its own data dir and ``/metrics`` port, and the fleet
derives each one's share of the account's limits by itself (design §5.8), so no share is set here.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from aiokafka.errors import KafkaError

from benchmarks.guards import Outcomes
from benchmarks.pipeline import BenchError, Stack, scrape_metrics
from streamproc.devstack.broker import free_port
from streamproc.kafka.clients import kafka_admin
from streamproc.kafka.connection import KafkaConnection

CHANGE_AT = 1 / 3  # a worker joins or is killed once this share of the requests had an outcome


class Change(Enum):
    """What happens to the fleet mid-batch."""

    JOIN = "join"  # one more worker starts
    KILL = "kill"  # the last started worker is SIGKILLed: its records are taken over after a rebalance


@dataclass(frozen=True)
class Scenario:
    """A row of workers: how many start with the batch, and what changes at :data:`CHANGE_AT` of it."""

    name: str
    start: int
    change: Change | None = None

    @property
    def label(self) -> str:
        if self.change is Change.JOIN:
            return f"{self.start} workers, one more joins at 1/3"
        if self.change is Change.KILL:
            return f"{self.start} workers, one SIGKILLed at 1/3"
        return f"{self.start} worker{'s' if self.start > 1 else ''}"


ONE = Scenario("1", 1)
SCENARIOS: Mapping[str, Scenario] = {scenario.name: scenario for scenario in (
    ONE, Scenario("2", 2), Scenario("3", 3), Scenario("join", 2, Change.JOIN), Scenario("kill", 3, Change.KILL))}


@dataclass
class WorkerGroup:
    """Workers with one environment (``env``: the topics, the mock, the settings), each started with its own
    data dir and metrics port. The first is the one :func:`benchmarks.guards.follow` watches, so a kill takes
    the last; a killed worker's metrics are read just before, so its hedges still count."""

    stack: Stack
    name: str
    env: Mapping[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    killed_metrics: list[str] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        number = len(self.processes) + 1
        name = self.name if number == 1 else f"{self.name}-{number}"
        port = free_port()
        env = {**self.env, "STREAMPROC_DATA_DIR": str(self.stack.workdir / f"{name}-data"),
               "STREAMPROC_WORKER_METRICS_PORT": str(port)}
        self.processes.append(self.stack.spawn(name, [sys.executable, "-m", "streamproc", "worker"], env))
        self.ports.append(port)
        return self.processes[-1]

    async def kill(self) -> None:
        if len(self.processes) < 2:
            raise ValueError("the only worker is the one the run watches: nothing to kill")
        victim = self.processes[-1]
        with contextlib.suppress(OSError):  # unread, its hedges are not counted: the sum is then a lower bound
            self.killed_metrics.append(await asyncio.to_thread(scrape_metrics, self.ports[-1]))
        victim.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.wait)

    async def metrics(self) -> tuple[list[str], list[str]]:
        """The ``/metrics`` of every worker still running and of the killed ones (read before the kill), and a
        note for each that could not be read."""
        texts, notes = list(self.killed_metrics), []
        for process, port in zip(self.processes, self.ports, strict=True):
            if process.poll() is None:
                try:
                    texts.append(await asyncio.to_thread(scrape_metrics, port))
                except OSError as exc:
                    notes.append(f"could not read the /metrics of worker pid {process.pid}: {exc}")
        return texts, notes

    def stop(self) -> None:
        for process in self.processes:
            self.stack.stop(process)


async def formed(bootstrap: str, group: str, members: int, timeout_s: float) -> float:
    """Wait until the consumer group ``group`` is stable with ``members`` members (each given its partitions);
    returns the seconds it took. A fleet row measures a fleet at work, not one forming: the batch is produced
    after this, and the join and kill rows' changes come on top."""
    started = time.monotonic()
    seen: object = "no answer"
    admin = kafka_admin(KafkaConnection(bootstrap=bootstrap), request_timeout_ms=5000)
    await admin.start()
    try:
        while time.monotonic() - started < timeout_s:
            try:
                (response,) = await admin.describe_consumer_groups([group])
            except KafkaError:  # no coordinator yet: the group's first member has not asked for one
                response = None
            if response is not None:
                (described,) = response.to_object()["groups"]
                seen = {"state": described.get("state"), "members": len(described.get("members") or []),
                        "error": described.get("error_code")}
                if described.get("state") == "Stable" and len(described.get("members") or []) == members:
                    return time.monotonic() - started
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
    raise BenchError(f"the {members} workers did not form a stable consumer group {group} in {timeout_s:.0f} s "
                     f"(last seen: {seen})")


async def play(scenario: Scenario, outcomes: Outcomes, group: WorkerGroup, announce: list[str]) -> None:
    """The scenario's change, once :data:`CHANGE_AT` of the requests had an outcome: a task beside
    :func:`benchmarks.guards.follow`, which fills ``outcomes``; what it did is appended to ``announce``."""
    if scenario.change is None:
        return
    await outcomes.reached(math.ceil(CHANGE_AT * len(outcomes.expected))).wait()
    if scenario.change is Change.JOIN:
        process = group.start()
        announce.append(f"a worker (pid {process.pid}) joined after {outcomes.done} outcomes")
    else:
        await group.kill()
        announce.append(f"a worker (pid {group.processes[-1].pid}) was SIGKILLed after {outcomes.done} outcomes")
