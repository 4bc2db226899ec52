"""The built-in single-node Apache Kafka broker (KRaft), assembled from Maven Central jars, run with plain java.

Machines without Docker still get a real broker: the jars are fetched once with Maven and cached outside
the work tree; start/stop/status are idempotent and survive crashes and stale data directories.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from streamproc.errors import UserFacingError
from streamproc.kafka.local_address import (
    STATE_FILE,
    NodePorts,
    is_broker_of,
    port_accepts,
    read_broker_state,
    running_broker,
)
from streamproc.processes import poll_until, stop_pid, stop_process
from streamproc.settings import Settings

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streamproc</groupId>
  <artifactId>local-kafka</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{version}</version>
    </dependency>
    <!-- the broker's POM brings no logging binding: without one it runs but logs nothing -->
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>
    <dependency><groupId>ch.qos.reload4j</groupId><artifactId>reload4j</artifactId><version>1.2.25</version></dependency>
  </dependencies>
</project>
"""

_LOG4J = """log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka=INFO
log4j.logger.org.apache.kafka=INFO
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
"""

_READY_MARK = "Kafka Server started"
_COMPLETE_MARK = ".complete"


class LocalKafkaError(UserFacingError):
    """The local broker could not be fetched, started or stopped; the message says what to do."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str | None
    version: str

    def describe(self) -> str:
        if self.running:
            return f"running: Kafka {self.version} pid {self.pid} at {self.bootstrap}"
        return "stopped"

    def as_json(self) -> dict[str, object]:
        """``broker status --json``."""
        return dataclasses.asdict(self)


def require_tool(name: str, what_to_install: str) -> str:
    """Return the path of ``name`` or raise with the package to install."""
    path = shutil.which(name)
    if path is None:
        raise LocalKafkaError(f"'{name}' is not on PATH: install {what_to_install} to run the local broker")
    return path


def ensure_jars(settings: Settings) -> Path:
    """Fetch the broker's jars from Maven Central once; later calls are offline and instant."""
    return fetch_jars(_POM.format(version=settings.local_kafka_version), settings.local_stack.kafka_jars_dir,
                      "kafka_2.13-*.jar", f"Kafka {settings.local_kafka_version}")


def fetch_jars(pom_text: str, libs: Path, expected: str, what: str, *mvn_args: str) -> Path:
    """Copy the runtime dependencies of ``pom_text`` into ``libs`` once (a jar matching ``expected`` must come);
    the directory appears whole or not at all, so an interrupted fetch is redone."""
    if (libs / _COMPLETE_MARK).exists():
        return libs
    require_tool("java", "a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)")
    mvn = require_tool("mvn", "Maven (Debian: apt-get install maven)")
    libs.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=libs.parent) as work:
        pom = Path(work) / "pom.xml"
        pom.write_text(pom_text)
        staged = Path(work) / "libs"
        proc = subprocess.run(
            [mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputDirectory={staged}", *mvn_args],
            capture_output=True, text=True, check=False,
        )
        if proc.returncode != 0 or not any(staged.glob(expected)):
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            raise LocalKafkaError(f"Maven could not fetch the {what} jars:\n" + "\n".join(tail))
        (staged / _COMPLETE_MARK).write_text(what)
        if libs.exists():
            shutil.rmtree(libs)
        staged.rename(libs)
    return libs


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, never starting with '-'."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_properties(port: int, controller_port: int, log_dir: Path) -> str:
    """Broker+controller on loopback with every replication setting a single node can satisfy."""
    return node_properties(1, [NodePorts(port, controller_port)], log_dir)


def node_properties(node_id: int, nodes: Sequence[NodePorts], log_dir: Path) -> str:
    """Node ``node_id`` (1-based) of a cluster of combined broker+controller nodes on loopback, every node a voter
    of the KRaft quorum; Kafka's internal topics get min(3, nodes) replicas and a minimum of 2 in sync once
    there are 3 (on one node: 1 and 1, which its defaults of 3 and 2 would break)."""
    own = nodes[node_id - 1]
    return "\n".join([
        f"listeners=PLAINTEXT://127.0.0.1:{own.port},CONTROLLER://127.0.0.1:{own.controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{own.port}",
        "inter.broker.listener.name=PLAINTEXT",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        *quorum_properties(node_id, [node.controller_port for node in nodes], log_dir),
        "",
    ])


def quorum_properties(node_id: int, controller_ports: Sequence[int], log_dir: Path) -> list[str]:
    """Everything of a node's config but its listeners: its place in the quorum, its log dir, and replication
    that ``len(controller_ports)`` nodes can satisfy."""
    replicas = min(3, len(controller_ports))
    min_isr = max(1, min(2, replicas - 1))
    voters = ",".join(f"{i}@127.0.0.1:{port}" for i, port in enumerate(controller_ports, start=1))
    return [
        "process.roles=broker,controller",
        f"node.id={node_id}",
        f"controller.quorum.voters={voters}",
        f"log.dirs={log_dir}",
        "num.partitions=1",
        f"default.replication.factor={replicas}",
        f"min.insync.replicas={min_isr}",
        f"offsets.topic.replication.factor={replicas}",
        "offsets.topic.num.partitions=1",
        f"transaction.state.log.replication.factor={replicas}",
        f"transaction.state.log.min.isr={min_isr}",
        "transaction.state.log.num.partitions=1",
        "group.initial.rebalance.delay.ms=0",
        "log.cleaner.dedupe.buffer.size=16777216",
        "auto.create.topics.enable=false",
    ]


@contextlib.contextmanager
def locked(home: Path) -> Iterator[None]:
    """Serialise start/stop of what lives in ``home`` between processes (two test sessions, a user and the demo)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class LocalBroker:
    """One KRaft broker under ``home`` (``settings.local_stack.kafka_dir`` unless it is a node of a local cluster);
    every method is safe to call in any state."""

    def __init__(self, settings: Settings, home: Path | None = None, heap_mb: int | None = None) -> None:
        self.settings = settings
        self.home = home or settings.local_stack.kafka_dir
        self.heap_mb = heap_mb or settings.local_kafka_heap_mb
        self.data_dir = self.home / "data"
        self.logs_dir = self.home / "logs"
        self.state_file = self.home / STATE_FILE
        self.log_file = self.logs_dir / "kafka.out"

    # -- state -------------------------------------------------------------------------------------------
    def _write_state(self, **state: int) -> None:
        self.state_file.write_text(json.dumps(state))

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return locked(self.home)

    def status(self) -> BrokerStatus:
        running = running_broker(self.home)
        return BrokerStatus(
            running=running is not None,
            pid=running.pid if running is not None else None,
            bootstrap=running.bootstrap if running is not None else None,
            version=self.settings.local_kafka_version,
        )

    # -- start -------------------------------------------------------------------------------------------
    def _choose_ports(self, previous: dict[str, int]) -> tuple[int, int]:
        """Configured ports, or (for 0) the previous run's ports when free, so the address survives restarts."""
        chosen = []
        for key, configured in (("port", self.settings.local_kafka_port),
                                ("controller_port", self.settings.local_kafka_controller_port)):
            if configured:
                if port_accepts(configured):
                    raise LocalKafkaError(
                        f"port {configured} on 127.0.0.1 is taken by another program; "
                        f"set STREAMPROC_LOCAL_KAFKA_{key.upper()} to a free port (or 0 for any)"
                    )
                chosen.append(configured)
            elif previous.get(key) and not port_accepts(previous[key]):
                chosen.append(previous[key])
            else:
                chosen.append(free_port())
        return chosen[0], chosen[1]

    def _format_storage(self, classpath: str, java: str, properties: Path, cluster_id: str | None,
                        format_args: Sequence[str] = ()) -> None:
        """Format the log dir with ``cluster_id`` (a cluster's nodes share one), else with the id it has; a dir
        that cannot be formatted (another cluster's, half-written) is wiped and redone. ``format_args`` go to
        the StorageTool too (the secure broker's SCRAM users)."""
        meta = self.data_dir / "meta.properties"
        formatted_id = None
        if meta.exists():
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    formatted_id = line.split("=", 1)[1].strip()
        if cluster_id and formatted_id and formatted_id != cluster_id:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            formatted_id = None
        for attempt in range(2):
            cmd = [java, "-cp", classpath, "kafka.tools.StorageTool", "format",
                   "-t", cluster_id or formatted_id or new_cluster_id(), "-c", str(properties), "--ignore-formatted",
                   *format_args]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                  env={**os.environ, "KAFKA_LOG4J_OPTS": ""})
            if proc.returncode == 0:
                return
            if attempt == 0:
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self.data_dir.mkdir(parents=True, exist_ok=True)
                formatted_id = None
                continue
            raise LocalKafkaError(f"kafka StorageTool format failed: {(proc.stdout + proc.stderr).strip()}")

    def start(self, timeout: float = 120.0) -> BrokerStatus:
        """Start the broker and return once it accepts connections; a no-op when it already runs."""
        with self._locked():
            current = self.status()
            if current.running:
                return current
            self.kill_stale()
            port, controller_port = self._choose_ports(read_broker_state(self.home))
            proc = self.launch(server_properties(port, controller_port, self.data_dir), port, controller_port)
            self.await_ready(proc, port, timeout)
            return self.status()

    def launch(self, properties_text: str, port: int, controller_port: int,
               cluster_id: str | None = None, format_args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        """Write the config, format the log dir and start the JVM in its own session; returns at once (a cluster
        starts every node before any can be ready: a node opens its port only once the quorum has a leader)."""
        java = require_tool("java", "a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)")
        libs = ensure_jars(self.settings)
        classpath = str(libs / "*")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        properties = self.home / "server.properties"
        properties.write_text(properties_text)
        log4j = self.home / "log4j.properties"
        log4j.write_text(_LOG4J)
        self._format_storage(classpath, java, properties, cluster_id, format_args)
        heap = f"{self.heap_mb}m"
        cmd = [java, f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
               f"-Dkafka.logs.dir={self.logs_dir}", f"-Dlog4j.configuration=file:{log4j}",
               "-cp", classpath, "kafka.Kafka", str(properties)]
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self._write_state(pid=proc.pid, port=port, controller_port=controller_port)
        return proc

    def await_ready(self, proc: subprocess.Popen[bytes], port: int, timeout: float) -> None:
        """Wait until the broker accepts connections on ``port``; stop it and raise with its log if it exits
        or ``timeout`` s pass first."""

        def port_open() -> bool:
            if proc.poll() is not None:
                raise LocalKafkaError(f"the broker exited with {proc.returncode}:\n{self._log_tail()}")
            return port_accepts(port)

        if not poll_until(port_open, timeout, interval_s=0.2):
            stop_process(proc, 10, group=True)
            raise LocalKafkaError(
                f"the broker did not open port {port} within {timeout:.0f}s:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    # -- stop --------------------------------------------------------------------------------------------
    def kill_stale(self) -> None:
        """A broker left behind whose port is closed (hung, half-started) is killed before a new start."""
        pid = read_broker_state(self.home).get("pid")
        if pid is not None and is_broker_of(self.home, pid):
            self._terminate(pid, grace=10)

    def _terminate(self, pid: int, grace: float) -> None:
        """SIGTERM the broker's process group, SIGKILL after ``grace`` s; only while ``pid`` is still ours."""
        stop_pid(pid, grace, alive=lambda: is_broker_of(self.home, pid), group=True)

    def request_stop(self) -> bool:
        """SIGTERM the broker without waiting (a cluster stops its nodes together); returns whether it ran."""
        pid = read_broker_state(self.home).get("pid")
        if pid is None or not is_broker_of(self.home, pid):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        return True

    def stop(self, grace: float = 60.0) -> bool:
        """Stop the broker (controlled shutdown, SIGKILL after ``grace`` s); returns whether one was running."""
        with self._locked():
            pid = read_broker_state(self.home).get("pid")
            was_running = pid is not None and is_broker_of(self.home, pid)
            if was_running and pid is not None:
                self._terminate(pid, grace)
            state = read_broker_state(self.home)
            state.pop("pid", None)
            self._write_state(**state)
            return was_running
