"""``scripts/bench``: throughput and memory of the whole pipeline, all figures from one run (issue 4).

Starts a private Kafka broker (temporary data dir, free ports), the mock LLM server and worker processes,
and measures:

1. latency-bound: mock latency fixed at 1 s, no faults, N requests, in-flight 256 -> requests/s and the
   fraction of the ideal in-flight / latency (target >= 0.85);
2. CPU-bound: mock latency 0 -> requests/s of the full pipeline (worker: consume, call, produce the result,
   RocksDB state), and of a bare aiokafka -> httpx -> aiokafka loop (``benchmarks.baseline``) over the same
   requests, against the same mock, with the same in-flight bound and acks=all; their throughput ratio
   (target >= 0.6) and the worker's CPU per request as a multiple of the loop's (target <= 0.8);
3. the worker's peak RSS during run 1 (``VmHWM``, target <= 400 MB).

A warm-up run (not reported) comes first: a freshly started broker spends most of a core on JIT compilation
for its first minute of load, which would be charged to whichever run came first. Throughput is measured
from the first LLM call (``completed_ms - latency_ms`` of the earliest result) to the moment the reader has
seen the last result on the results topic, so the worker's start-up (topic checks, group join, table
recovery) is not counted. Every request is on the requests topic before the worker starts: the batch case.
CPU use of every process (and of the rest of the machine: other people's jobs) is printed per run.

A missed target is a warning, not a failure; the exit code is 0 when every run converged, 1 when one did
not, 130 on Ctrl-C or SIGTERM (everything started is stopped and the temporary directory removed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from streamproc import codec
from streamproc.app.topics import ensure_topics
from streamproc.core.events import InferenceRequest, InferenceResult
from streamproc.core.topology import Topology
from streamproc.core.vocabulary import FailureLayer
from streamproc.devstack.broker import LocalBroker, free_port
from streamproc.kafka.connection import KafkaConnection
from streamproc.mockllm import MockLLMProcess
from streamproc.processes import stop_process
from streamproc.settings import DEFAULT_KAFKA_VERSION, Settings

ROOT = Path(__file__).resolve().parent.parent
RETRY_TIERS = "5s,30s,2m,10m"
TARGET_LATENCY_FRACTION = 0.85
TARGET_CPU_RATIO = 0.6
TARGET_RSS_MB = 400.0
TARGET_CPU_PER_REQUEST = 0.8  # the worker's CPU per request, at most this multiple of the bare loop's
OTHER_LOAD_WARNING = 0.2  # cores used by processes the benchmark did not start
SAMPLE_EVERY_S = 0.2
VERBOSE = False  # --verbose: per-run timelines


class BenchError(RuntimeError):
    """A run that did not converge, or a process that did not start: the figures would be meaningless."""


# ---- the requests ----------------------------------------------------------------------------------------


def chat_request(batch_id: str, i: int) -> InferenceRequest:
    """A realistic small chat request: one short user message, max_tokens 256."""
    body = {
        "model": "mock-small",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": (
            f"Summarise support ticket #{i} in one sentence: the parcel arrived two days late, the box was "
            "damaged and the customer asks whether a refund or a replacement is possible.")}],
    }
    return InferenceRequest(request_id=f"{batch_id}-{i:06d}", body_json=json.dumps(body), batch_id=batch_id,
                            submitted_ms=time.time_ns() // 1_000_000)


async def produce_requests(bootstrap: str, topic: str, requests: Iterable[InferenceRequest]) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    count = 0
    try:
        for request in requests:
            await producer.send(topic, key=request.request_id.encode(), value=codec.encode(request))
            count += 1
        await producer.flush()
    finally:
        await producer.stop()
    return count


# ---- processes -------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Children get SIGTERM if the benchmark itself dies without cleaning up (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Stack:
    """Everything the benchmark starts; :meth:`close` stops it all and removes the temporary directory."""

    def __init__(self, keep: bool) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="streamproc-bench-"))
        self.keep = keep
        self.broker: LocalBroker | None = None
        self.processes: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    def start_broker(self) -> tuple[str, int | None]:
        self.broker = LocalBroker(Settings(data_dir=self.workdir / "broker", local_kafka_port=0,
                                           local_kafka_controller_port=0))
        status = self.broker.start()
        if status.bootstrap is None:
            raise BenchError(f"the private broker did not start: {status.describe()}")
        return status.bootstrap, status.pid

    def spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.log_path(name), "wb")  # noqa: SIM115 - closed in stop()
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, cwd=ROOT, start_new_session=True, preexec_fn=preexec)
        self.processes.append((name, process, log))
        return process

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self, process: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
        code = stop_process(process, timeout)
        for entry in [e for e in self.processes if e[1] is process]:
            entry[2].close()
            self.processes.remove(entry)
        return code

    def start_mock(self, name: str, latency_s: float) -> tuple[str, int]:
        """A clean-profile mock LLM server: its base URL (``http://127.0.0.1:PORT/v1``) and pid."""
        process = self.spawn(name, [sys.executable, "-m", "streamproc", "mock-llm", "--port", "0", "--profile",
                                    "clean", "--latency", f"{latency_s:g}"])
        deadline = time.monotonic() + 30
        marker = "listening on "
        while time.monotonic() < deadline:
            text = self.log_path(name).read_text(errors="replace")
            if marker in text:
                return text.split(marker, 1)[1].split()[0], process.pid
            if process.poll() is not None:
                break
            time.sleep(0.05)
        raise BenchError(f"the mock LLM server did not start:\n{self.log_tail(name)}")

    def close(self) -> None:
        for _name, process, _log in reversed(list(self.processes)):
            with contextlib.suppress(Exception):
                self.stop(process, timeout=30)
        if self.broker is not None:
            with contextlib.suppress(Exception):
                self.broker.stop()
        if self.keep:
            print(f"kept {self.workdir} (logs, broker data)", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


def worker_env(bootstrap: str, prefix: str, llm_url: str, data_dir: Path, in_flight: int,
               partitions: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("STREAMPROC_")}
    env.update({
        "STREAMPROC_KAFKA_BOOTSTRAP": bootstrap,
        "STREAMPROC_LLM_BASE_URL": llm_url,
        "STREAMPROC_TOPIC_PREFIX": prefix,
        "STREAMPROC_APP_ID": f"{prefix}-app",
        "STREAMPROC_DATA_DIR": str(data_dir),
        "STREAMPROC_PARTITIONS": str(partitions),
        "STREAMPROC_IN_FLIGHT": str(in_flight),
        "STREAMPROC_RETRY_TIERS": RETRY_TIERS,
    })
    return env


# ---- watching ----------------------------------------------------------------------------------------------


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads) so far, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _machine_busy_s() -> float:
    """CPU seconds spent busy by the whole machine so far (all CPUs; steal counts as busy)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


@dataclass
class Sampler:
    """CPU time of the benchmark's processes and of the whole machine, and the peak RSS of the one under test.

    ``pids`` names the processes to account for (the one under test first); whatever the machine spends
    beyond them is "other": other people's jobs on a shared machine, which slow every figure down.
    """

    pids: dict[str, int]
    samples: list[tuple[float, dict[str, float], float]] = field(default_factory=list)  # (time, cpu by name, machine)
    peak_rss_kb: int = 0  # VmHWM of the first process: the kernel's own high-water mark of its resident set

    def sample(self) -> None:
        main_pid = next(iter(self.pids.values()))
        try:
            for line in Path(f"/proc/{main_pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_kb = max(self.peak_rss_kb, int(line.split()[1]))
        except OSError:
            pass
        cpu = {name: used for name, pid in self.pids.items() if (used := process_cpu_s(pid)) is not None}
        self.samples.append((time.time(), cpu, _machine_busy_s()))

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Average cores used between two wall times, per process name, plus "other" and "machine"."""
        if len(self.samples) < 2:
            return {}
        first = min(self.samples, key=lambda s: abs(s[0] - start))
        last = min(self.samples, key=lambda s: abs(s[0] - end))
        wall = last[0] - first[0]
        if wall <= 0:
            return {}
        used = {name: (last[1][name] - first[1][name]) / wall for name in last[1] if name in first[1]}
        machine = (last[2] - first[2]) / wall
        return {**used, "other": max(0.0, machine - sum(used.values())), "machine": machine}


class MockWatch:
    """Samples the mock's ``in_flight`` (what the worker really keeps in flight)."""

    def __init__(self, llm_url: str) -> None:
        self.root = llm_url.removesuffix("/v1")
        self.samples: list[tuple[float, int]] = []

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.root}/stats", timeout=10) as response:
            result: dict[str, Any] = json.load(response)
            return result

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.root}/control/reset", data=b"{}", method="POST",
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10):
            pass

    async def run(self) -> None:
        while True:
            with contextlib.suppress(OSError, ValueError):
                stats = await asyncio.to_thread(self.stats)
                self.samples.append((time.time(), int(stats.get("in_flight", 0))))
            await asyncio.sleep(0.5)

    def mean_in_flight(self, start: float, end: float) -> float:
        inside = [n for t, n in self.samples if start <= t <= end]
        return statistics.fmean(inside) if inside else 0.0


@dataclass
class Observed:
    """What a reader saw on the results (and failure) topics of one run."""

    expected: int
    spawned: float  # wall time the worker (or baseline) process was started
    results: dict[str, InferenceResult] = field(default_factory=dict)
    duplicates: int = 0
    failures: int = 0
    last_seen: float = 0.0  # wall time the reader had every expected result

    @property
    def first_call(self) -> float:
        return min(r.completed_ms - r.latency_ms for r in self.results.values()) / 1000

    @property
    def seconds(self) -> float:
        return self.last_seen - self.first_call

    @property
    def rate(self) -> float:
        return len(self.results) / self.seconds

    def timeline(self) -> str:
        """Calls started per second since the first call (to see ramps, stalls and tails)."""
        start = self.first_call
        counts: dict[int, int] = {}
        for r in self.results.values():
            second = int((r.completed_ms - r.latency_ms) / 1000 - start)
            counts[second] = counts.get(second, 0) + 1
        return " ".join(str(counts.get(s, 0)) for s in range(max(counts, default=-1) + 1))

    def latency_ms(self, quantile: float) -> float:
        values = sorted(r.latency_ms for r in self.results.values())
        return float(values[min(len(values) - 1, int(quantile * len(values)))])


async def watch_results(bootstrap: str, results_topic: str, failure_topics: list[str], expected: int,
                        spawn: Callable[[], subprocess.Popen[bytes]], timeout_s: float,
                        watch: Callable[[int], Sampler]) -> tuple[Observed, Sampler]:
    """Start the reader, then the process under test; read until every expected result arrived."""
    consumer = AIOKafkaConsumer(results_topic, *failure_topics, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        process = spawn()
        observed = Observed(expected, time.time())
        sampler = watch(process.pid)
        raw: dict[bytes, bytes] = {}
        next_sample = 0.0
        deadline = time.monotonic() + timeout_s
        while len(raw) < expected:
            batches = await consumer.getmany(timeout_ms=100, max_records=10_000)
            now = time.time()
            for tp, messages in batches.items():
                for message in messages:
                    if tp.topic != results_topic:
                        observed.failures += 1
                    elif message.key in raw:
                        observed.duplicates += 1
                    else:
                        raw[message.key] = message.value
            if len(raw) >= expected:
                observed.last_seen = now
            if now >= next_sample:
                sampler.sample()
                next_sample = now + SAMPLE_EVERY_S
            if process.poll() is not None and len(raw) < expected:
                raise BenchError(f"the process under test exited ({process.returncode}) after {len(raw)} of "
                                 f"{expected} results")
            if time.monotonic() > deadline:
                raise BenchError(f"only {len(raw)} of {expected} results after {timeout_s:.0f}s")
        sampler.sample()
    finally:
        await consumer.stop()
    for value in raw.values():
        result = codec.decode(value, InferenceResult)
        observed.results[result.request_id] = result
    return observed, sampler


def counter_total(metrics_text: str, family: str, exclude: Mapping[str, str] | None = None) -> int | None:
    """The sum of a counter's ``_total`` samples in a Prometheus exposition, leaving out samples whose labels
    match ``exclude``; None when the exposition has no such counter."""
    for found in text_string_to_metric_families(metrics_text):
        if found.name == family:
            return int(sum(sample.value for sample in found.samples if sample.name.endswith("_total") and not (
                exclude and all(sample.labels.get(key) == value for key, value in exclude.items()))))
    return None


def scrape_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def calls_explained(port: int) -> dict[str, int] | None:
    """Why a worker made more calls than requests, from its metrics: hedges (a second call beside one that ran
    past its model's p99) and calls that failed (each retried); None when the metrics could not be read."""
    try:
        text = scrape_metrics(port)
    except OSError:
        return None
    return {"hedged": counter_total(text, "streamproc_hedged_calls") or 0,
            "failed calls": counter_total(text, "streamproc_llm_calls", exclude={"outcome": "success"}) or 0}


# ---- the runs ----------------------------------------------------------------------------------------------


@dataclass
class RunReport:
    name: str  # also the log file's name
    observed: Observed
    mock_calls: int
    cores: dict[str, float]  # average cores used during the measured window, by process, "other", "machine"
    peak_rss_mb: float
    mean_mock_in_flight: float | None = None
    calls_explained: Mapping[str, int] | None = None  # the worker's calls beyond one per request, by why

    @property
    def unexplained_calls(self) -> int:
        """LLM calls at the mock beyond one per request and beyond what the worker's metrics explain."""
        return self.mock_calls - self.observed.expected - sum((self.calls_explained or {}).values())

    @property
    def cpu_ms_per_request(self) -> float:
        """CPU of the process under test per request (its first entry in ``cores``)."""
        under_test = next(iter(self.cores.values()), 0.0)
        return under_test * self.observed.seconds * 1000 / len(self.observed.results)

    def describe(self) -> str:
        o = self.observed
        parts = [f"{self.name}: {len(o.results)} results in {o.seconds:.2f}s = {o.rate:.1f} req/s",
                 f"start-up {o.first_call - o.spawned:.1f}s (excluded)",
                 f"LLM latency p50 {o.latency_ms(0.5):.0f} ms p99 {o.latency_ms(0.99):.0f} ms",
                 f"LLM calls {self.mock_calls}"
                 + ("" if self.calls_explained is None else
                    " (" + ", ".join(f"{why} {count}" for why, count in self.calls_explained.items()) + ")")]
        if self.mean_mock_in_flight is not None:
            parts.append(f"mean in flight at the mock {self.mean_mock_in_flight:.0f}")
        parts.append(f"CPU {self.cpu_ms_per_request:.2f} ms/request")
        parts.append("cores used: " + ", ".join(f"{name} {used:.2f}" for name, used in self.cores.items()))
        if VERBOSE:
            parts.append(f"calls started per second: {o.timeline()}")
        if o.duplicates or o.failures:
            parts.append(f"duplicates {o.duplicates}, failure events {o.failures}")
        return "\n  ".join(parts)


@dataclass
class Bench:
    stack: Stack
    bootstrap: str
    run_id: str
    in_flight: int
    partitions: int
    broker_pid: int | None  # None: a given cluster, not ours to account for
    worker_settings: dict[str, str] = field(default_factory=dict)  # STREAMPROC_* of every worker (--worker-setting)
    _zero_mock: tuple[str, int] | None = None

    def topology(self, name: str) -> Topology:
        """The run's own topics and consumer group (app id = prefix + "-app"), as the worker will see them."""
        prefix = f"bench-{self.run_id}-{name}"
        return Settings(kafka_bootstrap=self.bootstrap, topic_prefix=prefix, app_id=f"{prefix}-app",
                                    partitions=self.partitions, retry_tiers=RETRY_TIERS).topology()

    def sampler(self, under_test: str, mock_pid: int) -> Callable[[int], Sampler]:
        def make(pid: int) -> Sampler:
            pids = {under_test: pid, "mock": mock_pid, "bench": os.getpid()}
            if self.broker_pid is not None:
                pids["broker"] = self.broker_pid
            return Sampler(pids)

        return make

    async def pipeline(self, name: str, topology: Topology, llm_url: str, mock_pid: int, requests: int,
                       timeout_s: float, sample_mock: bool, settings: dict[str, str] | None = None,
                       wrap: list[str] | None = None) -> RunReport:
        """The worker over ``requests`` records already on the requests topic, with these ``STREAMPROC_*``
        settings besides the benchmark's own, its command after ``wrap`` (a profiler) if given."""
        mock = MockWatch(llm_url)
        mock.reset()
        env = worker_env(self.bootstrap, topology.prefix, llm_url, self.stack.workdir / f"{name}-data",
                         self.in_flight, self.partitions)
        metrics_port = free_port()  # a variant may turn the metrics off (worker_metrics_port=0): nothing explained
        env["STREAMPROC_WORKER_METRICS_PORT"] = str(metrics_port)
        env.update({**self.worker_settings, **(settings or {})})
        command = [*(wrap or []), sys.executable, "-m", "streamproc", "worker"]
        worker: list[subprocess.Popen[bytes]] = []

        def spawn() -> subprocess.Popen[bytes]:
            worker.append(self.stack.spawn(name, command, env))
            return worker[0]

        sampler = asyncio.create_task(mock.run()) if sample_mock else None
        try:
            observed, watch = await watch_results(
                self.bootstrap, topology.results, [topology.failed(layer) for layer in FailureLayer], requests,
                spawn, timeout_s, self.sampler("worker", mock_pid))
            explained = await asyncio.to_thread(calls_explained, metrics_port)
        except BenchError as exc:
            raise BenchError(f"{name}: {exc}\n--- worker log ({self.stack.log_path(name)}):\n"
                             f"{self.stack.log_tail(name)}") from exc
        finally:
            if sampler is not None:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            for process in worker:
                self.stack.stop(process)
        return RunReport(
            name, observed, int(mock.stats()["calls"]), watch.cores(observed.first_call, observed.last_seen),
            watch.peak_rss_kb / 1024,
            mean_mock_in_flight=mock.mean_in_flight(observed.first_call, observed.last_seen) if sample_mock
            else None,
            calls_explained=explained,
        )

    async def baseline(self, name: str, topology: Topology, llm_url: str, mock_pid: int, requests: int,
                       timeout_s: float) -> RunReport:
        """The bare loop over the same requests topic, in its own consumer group, to its own results topic."""
        mock = MockWatch(llm_url)
        mock.reset()
        results_topic = f"{topology.prefix}.baseline-results"
        await ensure_topics(KafkaConnection(bootstrap=self.bootstrap), {results_topic: self.partitions})
        env = {key: value for key, value in os.environ.items() if not key.startswith("STREAMPROC_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        command = [sys.executable, "-m", "benchmarks.baseline", "--bootstrap", self.bootstrap,
                   "--topic", topology.requests, "--group", f"{topology.prefix}-baseline",
                   "--results-topic", results_topic, "--llm-url", llm_url, "--in-flight", str(self.in_flight),
                   "--expected", str(requests)]
        process: list[subprocess.Popen[bytes]] = []

        def spawn() -> subprocess.Popen[bytes]:
            process.append(self.stack.spawn(name, command, env))
            return process[0]

        try:
            observed, watch = await watch_results(self.bootstrap, results_topic, [], requests, spawn, timeout_s,
                                                  self.sampler("baseline", mock_pid))
        except BenchError as exc:
            raise BenchError(f"{name}: {exc}\n--- log:\n{self.stack.log_tail(name)}") from exc
        finally:
            for p in process:
                self.stack.stop(p)
        return RunReport(name, observed, int(mock.stats()["calls"]),
                         watch.cores(observed.first_call, observed.last_seen), watch.peak_rss_kb / 1024)

    def zero_latency_mock(self) -> tuple[str, int]:
        """The latency-0 mock of the warm-up and the CPU-bound runs (started once)."""
        if self._zero_mock is None:
            self._zero_mock = self.stack.start_mock("mock-cpu", 0.0)
        return self._zero_mock

    async def warm_up(self, requests: int) -> None:
        """A pipeline run that is not reported: a fresh broker spends a core on JIT compilation for a while."""
        topology = self.topology("warmup")
        await ensure_topics(KafkaConnection(bootstrap=self.bootstrap), topology.all_topics())
        llm_url, mock_pid = self.zero_latency_mock()
        await produce_requests(self.bootstrap, topology.requests, (chat_request("warm", i) for i in range(requests)))
        report = await self.pipeline("worker-warmup", topology, llm_url, mock_pid, requests, 120 + requests / 20,
                                     False)
        print(f"warm-up (not counted): {len(report.observed.results)} requests at {report.observed.rate:.0f} req/s",
              flush=True)

    async def latency_bound(self, requests: int, latency_s: float) -> RunReport:
        topology = self.topology("latency")
        await ensure_topics(KafkaConnection(bootstrap=self.bootstrap), topology.all_topics())
        llm_url, mock_pid = self.stack.start_mock("mock-latency", latency_s)
        await produce_requests(self.bootstrap, topology.requests,
                               (chat_request("lat", i) for i in range(requests)))
        ideal_s = requests / self.in_flight * latency_s
        report = await self.pipeline("worker-latency", topology, llm_url, mock_pid, requests, 120 + 5 * ideal_s,
                                     True)
        print(report.describe(), flush=True)
        return report

    async def cpu_bound(self, requests: int) -> tuple[RunReport, RunReport]:
        topology = self.topology("cpu")
        await ensure_topics(KafkaConnection(bootstrap=self.bootstrap), topology.all_topics())
        llm_url, mock_pid = self.zero_latency_mock()
        await produce_requests(self.bootstrap, topology.requests, (chat_request("cpu", i) for i in range(requests)))
        timeout_s = 120 + requests / 20  # even at 20 req/s it converges
        pipeline = await self.pipeline("worker-cpu", topology, llm_url, mock_pid, requests, timeout_s, False)
        print(pipeline.describe(), flush=True)
        baseline = await self.baseline("baseline-cpu", topology, llm_url, mock_pid, requests, timeout_s)
        print(baseline.describe(), flush=True)
        return pipeline, baseline


# ---- the report ----------------------------------------------------------------------------------------------


def table(rows: Sequence[tuple[str, ...]],
          header: tuple[str, ...] = ("measurement", "result", "target", "status")) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in [header, *rows]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def report(args: argparse.Namespace, latency: RunReport, pipeline: RunReport, baseline: RunReport) -> list[str]:
    fraction = latency.observed.rate / (args.in_flight / args.latency)
    rss = latency.peak_rss_mb or 0.0
    ratio = pipeline.observed.rate / baseline.observed.rate
    cpu = pipeline.cpu_ms_per_request / baseline.cpu_ms_per_request
    ok = {"fraction": fraction >= TARGET_LATENCY_FRACTION, "ratio": ratio >= TARGET_CPU_RATIO,
          "rss": rss <= TARGET_RSS_MB, "cpu": cpu <= TARGET_CPU_PER_REQUEST}

    def mark(key: str) -> str:
        return "met" if ok[key] else "MISSED"

    ideal = args.in_flight / args.latency
    rows = [
        (f"latency-bound: mock {args.latency:g} s, {args.latency_requests} req, in-flight {args.in_flight}",
         f"{latency.observed.rate:.1f} req/s = {fraction:.3f} of ideal {ideal:.0f} req/s",
         f">= {TARGET_LATENCY_FRACTION}", mark("fraction")),
        (f"worker peak RSS (VmHWM) at {args.in_flight} in flight", f"{rss:.0f} MB", f"<= {TARGET_RSS_MB:.0f} MB",
         mark("rss")),
        (f"CPU-bound pipeline: mock 0 s, {args.cpu_requests} req",
         f"{pipeline.observed.rate:.0f} req/s ({pipeline.cpu_ms_per_request:.2f} ms worker CPU/req)", "", ""),
        ("CPU-bound baseline: aiokafka -> httpx -> aiokafka",
         f"{baseline.observed.rate:.0f} req/s ({baseline.cpu_ms_per_request:.2f} ms CPU/req)", "", ""),
        ("CPU-bound ratio pipeline / baseline", f"{ratio:.2f}", f">= {TARGET_CPU_RATIO}", mark("ratio")),
        ("worker CPU per request / the baseline's", f"{cpu:.2f}x", f"<= {TARGET_CPU_PER_REQUEST}x", mark("cpu")),
    ]
    print()
    print(f"streamproc benchmark: {os.cpu_count()} CPUs, Python {platform.python_version()}, Kafka "
          f"{DEFAULT_KAFKA_VERSION} ({'given broker' if args.bootstrap else 'private broker'}), "
          f"{args.partitions} partitions, in-flight {args.in_flight}, mock profile clean")
    print(table(rows))
    cpus = os.cpu_count() or 1
    for run in (latency, pipeline, baseline):
        print(f"cores used during {run.name} (of {cpus}): "
              + ", ".join(f"{name} {used:.2f}" for name, used in run.cores.items()))
    warnings = []
    if not ok["fraction"]:
        warnings.append(f"latency-bound throughput {fraction:.3f} of ideal is below the target "
                        f"{TARGET_LATENCY_FRACTION} (mean in flight at the mock: "
                        f"{latency.mean_mock_in_flight or 0:.0f} of {args.in_flight})")
    if not ok["rss"]:
        warnings.append(f"worker peak RSS {rss:.0f} MB is above the target {TARGET_RSS_MB:.0f} MB")
    if not ok["ratio"]:
        warnings.append(f"CPU-bound ratio {ratio:.2f} is below the target {TARGET_CPU_RATIO}")
    if not ok["cpu"]:
        warnings.append(f"the worker's CPU per request is {cpu:.2f}x the bare loop's, above the target "
                        f"{TARGET_CPU_PER_REQUEST}x")
    warnings += shared_and_unclean(latency, pipeline, baseline)
    for warning in warnings:
        print(f"WARNING: {warning}")
    return warnings


def shared_and_unclean(*runs: RunReport) -> list[str]:
    """Warnings for runs during which other processes took CPU, and for runs with duplicate results, failure
    events or more calls than requests (the figures then measure something else)."""
    warnings = []
    busy = max((run.cores.get("other", 0.0), run.name) for run in runs)
    if busy[0] > OTHER_LOAD_WARNING:
        warnings.append(f"other processes used {busy[0]:.2f} cores during {busy[1]}: the machine was shared, "
                        "the figures are lower than on an idle machine")
    for run in runs:
        if run.observed.duplicates or run.observed.failures or run.unexplained_calls:
            warnings.append(f"{run.name}: {run.observed.duplicates} duplicate results, {run.observed.failures} "
                            f"failure events, {run.mock_calls} LLM calls for {run.observed.expected} requests"
                            + ("" if run.calls_explained is None else
                               f", {run.unexplained_calls} not explained by the worker's metrics"))
    return warnings


def start_broker(args: argparse.Namespace, stack: Stack) -> tuple[str, int | None]:
    """The suite's cluster: ``--bootstrap``'s (no pid: not ours to account for) or a private broker, announced
    with the work dir and the machine's load."""
    bootstrap, broker_pid = (args.bootstrap, None) if args.bootstrap else stack.start_broker()
    print(f"broker {bootstrap}; work dir {stack.workdir}; load average {os.getloadavg()[0]:.2f}", flush=True)
    return bootstrap, broker_pid


def open_bench(args: argparse.Namespace, stack: Stack) -> Bench:
    """The suite's cluster (:func:`start_broker`) and a bench on it, its runs named by the time it started."""
    bootstrap, broker_pid = start_broker(args, stack)
    return Bench(stack, bootstrap, time.strftime("%Y%m%d%H%M%S"), args.in_flight, args.partitions, broker_pid)


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    bootstrap, broker_pid = start_broker(args, stack)
    bench = Bench(stack, bootstrap, time.strftime("%Y%m%d%H%M%S"), args.in_flight, args.partitions, broker_pid,
                  dict(args.worker_setting or []))
    if args.warmup:
        await bench.warm_up(args.warmup)
    latency = await bench.latency_bound(args.latency_requests, args.latency)
    pipeline, baseline = await bench.cpu_bound(args.cpu_requests)
    report(args, latency, pipeline, baseline)
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")


Suite = Callable[[argparse.Namespace, Stack], Coroutine[Any, Any, None]]


def add_common_arguments(parser: argparse._ActionsContainer) -> None:
    """Options every suite of ``scripts/bench`` shares."""
    parser.add_argument("--in-flight", type=int, default=256, help="in-flight bound of worker and baseline [256]")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of every topic [8]")
    parser.add_argument("--bootstrap", help="use this Kafka cluster instead of a private broker")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (process logs) at the end")
    parser.add_argument("--verbose", action="store_true", help="print per-second timelines of each run")


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """The pipeline suite's own options."""
    parser.add_argument("--latency-requests", type=int, default=5000, help="requests of run 1 [5000]")
    parser.add_argument("--latency", type=float, default=1.0, help="mock latency of run 1, seconds [1]")
    parser.add_argument("--cpu-requests", type=int, default=10_000, help="requests of the CPU-bound runs [10000]")
    parser.add_argument("--warmup", type=int, default=3000, help="requests of the unreported warm-up run [3000]")
    add_worker_setting_argument(parser)


def add_worker_setting_argument(parser: argparse._ActionsContainer) -> None:
    """``--worker-setting``, of the suites whose workers take it (pipeline, scale, fleet)."""
    parser.add_argument("--worker-setting", action="append", type=setting, metavar="NAME=VALUE",
                        help="a STREAMPROC_* setting of every worker, e.g. llm_http=httpcore (repeat)")


def setting(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` as the worker's environment variable (``STREAMPROC_`` added when missing)."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    name = name.upper()
    return (name if name.startswith("STREAMPROC_") else f"STREAMPROC_{name}"), value


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    for name in ("latency_requests", "cpu_requests", "in_flight", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.latency <= 0:
        parser.error("--latency must be positive")


def execute(suite: Suite, args: argparse.Namespace) -> int:
    """Run one suite on its own :class:`Stack`: 0 when every run converged, 1 when one did not, 130 on Ctrl-C
    or SIGTERM. Everything started is stopped and the signal handlers are restored, so suites can follow."""
    global VERBOSE
    VERBOSE = args.verbose

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, terminate)
    # aiokafka warns about retries it handles itself (e.g. NotLeaderForPartition on topics just created)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    stack = Stack(args.keep)
    code = 0
    try:
        asyncio.run(suite(args, stack))
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything", file=sys.stderr)
        code = 130
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    finally:
        for signum in previous:  # cleanup (bounded by timeouts) is not interrupted
            signal.signal(signum, signal.SIG_IGN)
        stack.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return code


def suite_main(prog: str, description: str | None, add_suite_arguments: Callable[[argparse.ArgumentParser], None],
               check_suite_arguments: Callable[[argparse.ArgumentParser, argparse.Namespace], None],
               suite: Suite, argv: list[str] | None) -> None:
    """``python -m benchmarks.<suite>``: parse one suite's options and the common ones, run it, exit."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_suite_arguments(parser)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    check_suite_arguments(parser, args)
    sys.exit(execute(suite, args))


def main(argv: list[str] | None = None) -> None:
    suite_main("python -m benchmarks.pipeline", __doc__, add_arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()


def spawn_mock(stack: Stack, name: str, options: list[str]) -> MockLLMProcess:
    """``mock-llm --port 0 OPTIONS`` as a process of the stack, once it listens."""
    process = stack.spawn(name, [sys.executable, "-m", "streamproc", "mock-llm", "--port", "0", *options])
    deadline = time.monotonic() + 30
    marker = "listening on "
    while time.monotonic() < deadline:
        text = stack.log_path(name).read_text(errors="replace")
        if marker in text:
            return MockLLMProcess(process, text.split(marker, 1)[1].split()[0])
        if process.poll() is not None:
            break
        time.sleep(0.05)
    raise BenchError(f"the mock LLM server did not start ({' '.join(options)}):\n{stack.log_tail(name)}")
