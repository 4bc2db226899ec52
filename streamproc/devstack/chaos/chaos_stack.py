"""The processes of one chaos run: its own broker on fixed ports, the mock LLM server, the proxy in front
of it, and the worker slots that are killed and started again.

The broker gets fixed ports (picked free once) so that a restart comes back at the same bootstrap address
and every client reconnects by itself. Workers run in their own sessions: a Ctrl-C reaches only the run,
which then stops them itself, in order, rather than having them race the clean-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.errors import KafkaError

from streamproc.devstack.broker import LocalBroker, free_port
from streamproc.devstack.chaos.config import ChaosConfig, RunNames
from streamproc.devstack.chaos.proxy import LLMProxy
from streamproc.errors import ExitCode, UserFacingError
from streamproc.kafka.clients import kafka_admin
from streamproc.kafka.connection import KafkaConnection
from streamproc.mockllm.runner import MockLLMProcess
from streamproc.processes import stop_processes
from streamproc.settings import Settings


class ChaosError(UserFacingError):
    """The run itself could not go on (a command it needs failed); the message says which and why."""

    exit_code = ExitCode.FAILED


def clean_env() -> dict[str, str]:
    """This process's environment without any STREAMPROC_* setting: children get exactly the run's."""
    return {k: v for k, v in os.environ.items() if not k.startswith("STREAMPROC_")}


@dataclass
class WorkerSlot:
    """One worker of the group, across its restarts (each start is a new incarnation with a fresh metrics
    port, so a port the dead process still held can never block the restart)."""

    index: int
    env: dict[str, str]
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    metrics_port: int = 0
    started_at: float = 0.0
    killing: bool = False  # a planned kill is in progress: its exit is not a crash
    exits: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.incarnation += 1
        self.metrics_port = free_port()
        env = {**self.env, "STREAMPROC_DATA_DIR": str(self.data_dir),
               "STREAMPROC_WORKER_METRICS_PORT": str(self.metrics_port)}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"==== chaos: worker {self.index} start #{self.incarnation} at {time.strftime('%X')} ====\n"
                      .encode())
            log.flush()
            self.process = subprocess.Popen([sys.executable, "-m", "streamproc", "worker"], env=env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, no commit."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.exits.append(self.process.returncode)
        with open(self.log_path, "ab") as log:
            log.write(f"==== chaos: worker {self.index} SIGKILLed at {time.strftime('%X')} ====\n".encode())

    def last_words(self, lines: int = 8) -> str:
        """What the latest incarnation said before it ended: its CRITICAL lines and exception messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        last = text.rsplit("==== chaos: worker", 1)[-1].splitlines()
        said = [line for line in last if "CRITICAL" in line or line.startswith(("faust.", "aiokafka.", "kafka."))
                or (line[:1].isalpha() and "Error" in line.split(":", 1)[0])]
        return "\n".join(line[:300] for line in (said or last)[-lines:])


class ChaosStack:
    """Starts and stops everything a run needs; :meth:`stop` is safe in any state (also half started)."""

    def __init__(self, config: ChaosConfig, names: RunNames, work_dir: Path) -> None:
        self.config = config
        self.names = names
        self.work_dir = work_dir
        port, controller_port = free_port(), free_port()
        while controller_port == port:
            controller_port = free_port()
        self.broker = LocalBroker(Settings(data_dir=work_dir / "broker", local_kafka_port=port,
                                           local_kafka_controller_port=controller_port))
        self.bootstrap = f"127.0.0.1:{port}"
        self.kafka = KafkaConnection(bootstrap=self.bootstrap)
        self.mock: MockLLMProcess | None = None
        self.proxy: LLMProxy | None = None
        self.workers: list[WorkerSlot] = []
        self._broker_started = False

    # -- start and stop ----------------------------------------------------------------------------------
    def start_broker(self) -> None:
        self._broker_started = True
        status = self.broker.start()
        if status.bootstrap != self.bootstrap:
            raise ChaosError(f"the broker came up at {status.bootstrap}, not {self.bootstrap}")

    def start_llm(self) -> None:
        config = self.config
        rpm = ("--rpm", str(config.mock_rpm)) if config.mock_rpm else ()
        self.mock = MockLLMProcess.start("--profile", config.mock_profile, "--seed", str(config.seed), *rpm,
                                         env=clean_env())
        self.proxy = LLMProxy(self.mock.root, config.deep_json_depth).start()

    def start_workers(self, **settings: str) -> None:
        """Start the worker slots; ``settings`` are more ``STREAMPROC_*`` variables (by their lower-case name)."""
        env = self.pipeline_env()
        env.update({f"STREAMPROC_{name.upper()}": value for name, value in settings.items()})
        assert self.proxy is not None
        env.update({
            "STREAMPROC_LLM_BASE_URL": self.proxy.url,
            "STREAMPROC_KAFKA_SESSION_TIMEOUT_S": f"{self.config.session_timeout_s:g}",
            # the rate limits are the account's: each worker paces to its share of them
            "STREAMPROC_LLM_LIMIT_SHARE": f"{1 / self.config.workers:.4f}",
        })
        if self.config.llm_timeout_s:
            env["STREAMPROC_LLM_TIMEOUT_S"] = f"{self.config.llm_timeout_s:g}"
        if self.config.in_flight:
            env["STREAMPROC_IN_FLIGHT"] = str(self.config.in_flight)
        for index in range(self.config.workers):
            slot = WorkerSlot(index, env, self.work_dir / f"worker-{index}", self.work_dir / f"worker-{index}.log")
            self.workers.append(slot)
            slot.start()

    def stop(self) -> None:
        """Workers first (SIGTERM, then SIGKILL after a grace), then the LLM side, then the broker."""
        running = [w.process for w in self.workers if w.process is not None and w.process.poll() is None]
        for worker in self.workers:
            worker.killing = True
        with contextlib.suppress(Exception):
            stop_processes(running, 20.0, group=True)
        if self.proxy is not None:
            with contextlib.suppress(Exception):
                self.proxy.stop()
        if self.mock is not None:
            with contextlib.suppress(Exception):
                self.mock.stop()
        if self._broker_started:
            with contextlib.suppress(Exception):
                self.broker.stop(grace=30.0)

    async def wait_for_topics(self, topics: list[str], timeout_s: float = 180.0) -> None:
        """Until the workers created every topic (they do at start-up; poison is produced straight to them)."""
        deadline = time.monotonic() + timeout_s
        missing = set(topics)
        while True:
            admin = kafka_admin(self.kafka, request_timeout_ms=10_000)
            try:
                await admin.start()
                missing = set(topics) - set(await admin.list_topics())
            except KafkaError:
                pass
            finally:
                await admin.close()
            if not missing:
                return
            if time.monotonic() > deadline:
                raise ChaosError(f"the workers did not create {sorted(missing)} within {timeout_s:.0f}s")
            await asyncio.sleep(1.0)

    # -- faults ------------------------------------------------------------------------------------------
    def restart_broker(self, down_s: float) -> float:
        """Stop the broker (a controlled shutdown), wait, start it on the same ports and data; returns how long
        it was unreachable."""
        began = time.monotonic()
        self.broker.stop()
        time.sleep(down_s)
        self.start_broker()
        return time.monotonic() - began

    def outage(self, seconds: float) -> None:
        assert self.mock is not None
        self.mock.post("/control/outage", {"seconds": seconds})

    # -- the command line, as a user would run it ----------------------------------------------------------
    def pipeline_env(self) -> dict[str, str]:
        """The settings every process of the run shares: broker, names, partitions, tiers."""
        env = clean_env()
        env.update({
            "STREAMPROC_KAFKA_BOOTSTRAP": self.bootstrap,
            "STREAMPROC_TOPIC_PREFIX": self.names.topic_prefix,
            "STREAMPROC_APP_ID": self.names.app_id,
            "STREAMPROC_PARTITIONS": str(self.config.partitions),
            "STREAMPROC_RETRY_TIERS": self.config.retry_tiers,
            "STREAMPROC_DATA_DIR": str(self.work_dir / "cli"),
        })
        return env

    async def cli(self, *args: str, timeout_s: float = 300.0) -> tuple[int, str]:
        """Run ``streamproc ARGS`` against the run's broker; returns the exit code and its output."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamproc", *args, env=self.pipeline_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = await asyncio.wait_for(process.communicate(), timeout_s)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
        assert process.returncode is not None
        return process.returncode, out.decode(errors="replace")
