"""Start whatever the configuration lacks: the built-in broker, worker processes, and the mock LLM server
when it is asked for by name (never by default: a real file must not get fake answers by accident).

``run`` and the demo use it so that one command works on a fresh machine; everything it started is
stopped again on exit, and everything that was configured is left alone.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import click

from streamproc.devstack.broker import LocalBroker
from streamproc.mockllm.runner import MockLLMProcess
from streamproc.processes import stop_processes
from streamproc.settings import Settings


@dataclass
class LocalStack:
    """The effective settings (with the addresses of what was started) and the processes to stop."""

    settings: Settings
    mock_profile: str | None = None  # a profile name: the mock LLM server answers, whatever URL is configured
    workers: int | None = None  # None: one worker when the broker is local, else none
    mock: MockLLMProcess | None = None
    worker_processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    started_broker: LocalBroker | None = None

    def __enter__(self) -> LocalStack:
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        settings = self.settings
        updates: dict[str, object] = {}
        # a client properties file names its cluster (bootstrap.servers), as -b does
        configured_cluster = bool(settings.kafka_bootstrap or settings.kafka_client_properties)
        if not configured_cluster:
            broker = LocalBroker(settings)
            if not broker.status().running:
                click.echo("no STREAMPROC_KAFKA_BOOTSTRAP: starting the built-in Kafka broker...", err=True)
                self.started_broker = broker
            updates["kafka_bootstrap"] = broker.start().bootstrap
        if self.mock_profile is not None:
            ignored = f" instead of {settings.llm_base_url}" if settings.llm_base_url else ""
            click.secho(f"WARNING: --mock-llm: using the built-in MOCK LLM server (profile {self.mock_profile})"
                        f"{ignored}; its answers are fake", err=True, fg="yellow", bold=True)
            self.mock = MockLLMProcess.start("--profile", self.mock_profile, "--seed", "1")
            updates["llm_base_url"] = self.mock.url
        self.settings = settings.model_copy(update=updates)
        count = self.workers if self.workers is not None else (0 if configured_cluster else 1)
        for index in range(count):
            self.worker_processes.append(self._start_worker(index, count))

    def _start_worker(self, index: int, count: int) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        # the rate limits are the account's: without a fixed share the workers derive theirs from the fleet
        if self.settings.llm_limit_share is not None:
            env["STREAMPROC_LLM_LIMIT_SHARE"] = str(self.settings.llm_limit_share / count)
        if self.settings.kafka_bootstrap:
            env["STREAMPROC_KAFKA_BOOTSTRAP"] = self.settings.kafka_bootstrap
        if self.settings.kafka_client_properties:  # --command-config reaches the workers too
            env["STREAMPROC_KAFKA_CLIENT_PROPERTIES"] = str(self.settings.kafka_client_properties)
        if self.settings.llm_base_url:
            env["STREAMPROC_LLM_BASE_URL"] = self.settings.llm_base_url
        if self.mock is not None:  # the mock answers instead of any configured endpoint, a model list's too
            env.pop("STREAMPROC_MODELS_FILE", None)
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        env["STREAMPROC_DATA_DIR"] = str(self.settings.data_dir / f"worker-{index}")
        log_path = self.worker_log(index)
        click.echo(f"starting worker {index} (log: {log_path})", err=True)
        with open(log_path, "ab") as log:
            return subprocess.Popen([sys.executable, "-m", "streamproc", "worker"], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def worker_log(self, index: int) -> Path:
        return self.settings.data_dir / f"worker-{index}.log"

    def workers_alive(self) -> bool:
        return all(process.poll() is None for process in self.worker_processes)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        stop_processes(self.worker_processes, 90)
        if self.mock is not None:
            self.mock.stop()
        if self.started_broker is not None:
            with contextlib.suppress(Exception):
                self.started_broker.stop()
