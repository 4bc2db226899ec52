"""``scripts/bench scale``: the same CPU-bound batch through 1, 2 and 4 workers on a local 3-node cluster (issue 16).

Starts a local 3-node KRaft cluster (``LocalCluster``, one JVM per node, under the temporary work dir, free
ports; every topic then gets 3 replicas and min.insync.replicas 2) and the mock LLM server at zero latency, so
what a request costs is CPU. After an unreported warm-up run (fresh JVMs compile for their first minute), each
worker count of ``--workers`` gets its own namespace: its workers start on empty topics and join one group; once
the group is stable with every worker holding requests partitions, the batch is written to the requests topic
and read back from the results topic to the last result. Startup and the joins are outside the measured window
(first LLM call to last result), so what is compared is N workers sharing one batch, not N start-ups.

CPU comes from /proc (utime + stime of each process tree, sampled every 0.2 s): each worker, the 3 brokers, the
mock, this process (reader and producer), and the rest of the machine ("other": other people's jobs). Each
worker serves its Prometheus metrics (the one thing that tells which worker wrote how many results), so its
CPU per request is its own CPU over its own results. The projection for N workers on N cores of their own is
N x (1 / worker CPU per request), capped by the mock (one process: one core) and the busiest broker node (one
core each) at the CPU per request they took here.

``--scale-rounds R`` runs every worker count R times, the order rotating from round to round; each run is
compared with the same round's run of the fewest workers (paired, so a change in the machine's load between
rounds cancels out) and the summary gives the medians.

``--worker-setting NAME=VALUE`` sets a ``STREAMPROC_*`` setting of every worker (e.g. ``standby_replicas=0``).

Every run must end with every request answered, and no failure event: else it fails (exit code 1).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import KafkaError

from benchmarks.pipeline import (
    OTHER_LOAD_WARNING,
    Bench,
    BenchError,
    MockWatch,
    Observed,
    RunReport,
    Sampler,
    Stack,
    _machine_busy_s,
    add_worker_setting_argument,
    chat_request,
    counter_total,
    produce_requests,
    scrape_metrics,
    suite_main,
    table,
    watch_results,
    worker_env,
)
from streamproc.app.topics import ensure_topics
from streamproc.core.vocabulary import FailureLayer
from streamproc.devstack.broker import free_port
from streamproc.devstack.cluster import LocalCluster
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import DEFAULT_KAFKA_VERSION, Settings

NODES = 3
IDLE_S = 10.0  # how long the idle cluster and mock are watched before the runs
IDLE_WORKERS_S = 5.0  # how long the workers are watched, ready with nothing to do, before each batch
WORKER_READY = "Worker ready"  # faust's log line once a worker has recovered its tables after an assignment
TARGET_GROWTH = 1.1  # per-request worker CPU at N workers / at 1 worker: must not grow (10 %: this machine's noise)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# ---- CPU of process trees --------------------------------------------------------------------------------


def parse_stat(text: str) -> tuple[int, int]:
    """A ``/proc/PID/stat`` line: the parent pid and the CPU ticks of the process and of its reaped children
    (utime + stime + cutime + cstime). The command name may hold spaces and parentheses: split at the last ``)``."""
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), sum(int(value) for value in fields[11:15])


def descendants(parents: Mapping[int, int], root: int, others: Collection[int] = ()) -> set[int]:
    """``root`` and every process below it, from a pid -> parent pid map, but not the subtrees of ``others``
    (the benchmark is the parent of every process it starts: those are charged to their own names)."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child not in others:
                found.add(child)
                todo.append(child)
    return found


def _all_stats() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks) of every process there is now."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = parse_stat((entry / "stat").read_text())
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    return stats


@dataclass
class TreeSampler(Sampler):
    """A :class:`Sampler` that charges each name the CPU of its process and all the processes below it."""

    def sample(self) -> None:
        stats = _all_stats()
        parents = {pid: parent for pid, (parent, _ticks) in stats.items()}
        roots = set(self.pids.values())
        cpu = {name: sum(stats[p][1] for p in descendants(parents, pid, roots - {pid})) / _CLOCK_TICKS
               for name, pid in self.pids.items() if pid in stats}
        self.samples.append((time.time(), cpu, _machine_busy_s()))


# ---- one run -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScaleRun:
    """One worker count's run: what the reader saw, the cores each process used over the measured window, and
    how many results each worker wrote (its metrics)."""

    workers: int
    report: RunReport  # cores: worker-1..N, mock, bench, broker-1..3, other, machine
    worker_results: tuple[int, ...]
    idle: Mapping[str, float]  # cores of the brokers, the mock and the workers with nothing to do
    round: int = 0

    @property
    def seconds(self) -> float:
        return self.report.observed.seconds

    @property
    def requests(self) -> int:
        return len(self.report.observed.results)

    def describe(self) -> str:
        observed = self.report.observed
        return (f"{self.workers} worker(s): {self.requests} results in {self.seconds:.2f}s = "
                f"{self.requests / self.seconds:.1f} req/s, worker CPU {self.ms_per_request('worker-'):.2f} "
                f"ms/request, results per worker {list(self.worker_results)}, {self.report.mock_calls} LLM calls, "
                f"{observed.duplicates} duplicates\n  cores used: "
                + ", ".join(f"{name} {used:.2f}" for name, used in self.report.cores.items()))

    def cpu_s(self, prefix: str) -> float:
        """CPU seconds over the window of the processes whose name starts with ``prefix``."""
        return sum(used for name, used in self.report.cores.items() if name.startswith(prefix)) * self.seconds

    def ms_per_request(self, prefix: str, beyond_idle: bool = False) -> float:
        """CPU per request of the processes named ``prefix...``; ``beyond_idle``: less what they take idle."""
        idle = sum(used for name, used in self.idle.items() if name.startswith(prefix)) if beyond_idle else 0.0
        return max(0.0, self.cpu_s(prefix) - idle * self.seconds) * 1000 / self.requests

    def per_worker_ms(self) -> list[float]:
        """Each worker's CPU over its own results (ms per request)."""
        return [self.report.cores.get(f"worker-{i}", 0.0) * self.seconds * 1000 / max(results, 1)
                for i, results in enumerate(self.worker_results, start=1)]

    def busiest_broker_ms(self) -> float:
        """The CPU per request, beyond its idle use, of the broker node that took the most."""
        return max((self.ms_per_request(name, beyond_idle=True) for name in self.report.cores
                    if name.startswith("broker-")), default=0.0)

    def projection(self) -> tuple[float, float, float]:
        """req/s of one worker on a core of its own at this run's worker CPU per request, and the caps of the
        mock (one core) and of the busiest broker node (one core, less its idle use) at their CPU per request
        beyond idle here (inf: not measured)."""
        mock_ms, broker_ms = self.ms_per_request("mock", beyond_idle=True), self.busiest_broker_ms()
        broker_idle = max((used for name, used in self.idle.items() if name.startswith("broker-")), default=0.0)
        return (1000 / self.ms_per_request("worker-"), 1000 / mock_ms if mock_ms else float("inf"),
                (1 - broker_idle) * 1000 / broker_ms if broker_ms else float("inf"))


def results_written(metrics_text: str) -> int:
    """``streamproc_results_total`` of a worker's Prometheus exposition."""
    written = counter_total(metrics_text, "streamproc_results")
    if written is None:
        raise BenchError("the worker's metrics have no streamproc_results counter")
    return written


def scrape_results(port: int) -> int:
    return results_written(scrape_metrics(port))


async def requests_partitions(bootstrap: str, group: str, topic: str) -> list[list[int]] | None:
    """The ``topic`` partitions of each member of ``group`` once it is Stable (None before: not there yet, or
    rebalancing)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([group])
    except KafkaError:
        return None
    finally:
        await admin.close()
    (description,) = response.to_object()["groups"]
    if description["state"] != "Stable":
        return None
    return [sorted(p for name, parts in ConsumerProtocolMemberAssignment.decode(member["member_assignment"]).assignment
                   if name == topic for p in parts) for member in description["members"]]


async def await_group(bootstrap: str, group: str, topic: str, workers: Sequence[subprocess.Popen[bytes]],
                      ready: Callable[[], bool], timeout_s: float) -> list[list[int]]:
    """Wait until the group is Stable with every worker in it and holding requests partitions, the same twice
    in a row a second apart (a worker joining late starts another rebalance), and ``ready()`` (every worker
    has recovered its tables and fetches)."""
    deadline = time.monotonic() + timeout_s
    previous: list[list[int]] | None = None
    while time.monotonic() < deadline:
        if any(worker.poll() is not None for worker in workers):
            raise BenchError(f"a worker exited while {len(workers)} joined the group")
        members = await requests_partitions(bootstrap, group, topic)
        if members is not None and len(members) == len(workers) and all(members):
            if members == previous and ready():
                return members
            previous = members
        else:
            previous = None
        await asyncio.sleep(1.0)
    raise BenchError(f"the group {group} did not settle with {len(workers)} members in {timeout_s:.0f}s")


class ScaleBench:
    """The cluster's runs: ``workers`` workers of one namespace over one batch each."""

    def __init__(self, bench: Bench, broker_pids: Sequence[int]) -> None:
        self.bench = bench
        self.broker_pids = list(broker_pids)
        self.idle: dict[str, float] = {}

    def watch(self, workers: Sequence[subprocess.Popen[bytes]], mock_pid: int) -> TreeSampler:
        pids = {f"worker-{i}": worker.pid for i, worker in enumerate(workers, start=1)}
        pids.update({"mock": mock_pid, "bench": os.getpid()})
        pids.update({f"broker-{i}": pid for i, pid in enumerate(self.broker_pids, start=1)})
        return TreeSampler(pids)

    @staticmethod
    async def idle_cores(sampler: TreeSampler, seconds: float, *prefixes: str) -> dict[str, float]:
        """The cores of the named processes (``prefixes``) over ``seconds`` with nothing to do (KRaft heartbeats
        and replica fetches, timers, idle fetches); all of them are printed."""
        sampler.sample()
        began = time.time()
        await asyncio.sleep(seconds)
        sampler.sample()
        cores = sampler.cores(began, time.time())
        print("idle: " + ", ".join(f"{name} {used:.2f}" for name, used in cores.items()) + " cores", flush=True)
        return {name: used for name, used in cores.items() if name.startswith(prefixes)}

    async def measure_idle(self) -> None:
        """The brokers' and the mock's idle cores, before the runs."""
        _llm_url, mock_pid = self.bench.zero_latency_mock()
        self.idle = await self.idle_cores(self.watch([], mock_pid), IDLE_S, "broker-", "mock")

    async def run(self, count: int, requests: int, round_: int) -> ScaleRun:
        bench, stack = self.bench, self.bench.stack
        tag = f"w{count}-r{round_}"
        topology = bench.topology(tag)
        await ensure_topics(KafkaConnection(bootstrap=bench.bootstrap), topology.all_topics())
        llm_url, mock_pid = bench.zero_latency_mock()
        mock = MockWatch(llm_url)
        mock.reset()
        ports = [free_port() for _ in range(count)]
        workers: list[subprocess.Popen[bytes]] = []
        names = [f"worker-{tag}-{i}" for i in range(1, count + 1)]
        try:
            for name, port in zip(names, ports, strict=True):
                env = worker_env(bench.bootstrap, topology.prefix, llm_url, stack.workdir / f"{name}-data",
                                 bench.in_flight, bench.partitions)
                env.update(bench.worker_settings)
                env["STREAMPROC_WORKER_METRICS_PORT"] = str(port)
                workers.append(stack.spawn(name, [sys.executable, "-m", "streamproc", "worker"], env))
            assignment = await await_group(
                bench.bootstrap, topology.app_id, topology.requests, workers,
                lambda: all(WORKER_READY in stack.log_path(name).read_text(errors="replace") for name in names), 300)
            idle_workers = await self.idle_cores(self.watch(workers, mock_pid), IDLE_WORKERS_S, "worker-")
            print(f"{count} worker(s) in the group, requests partitions {assignment}; writing the batch", flush=True)
            produced = asyncio.create_task(produce_requests(
                bench.bootstrap, topology.requests, (chat_request(tag, i) for i in range(requests))))
            observed, sampler = await watch_results(
                bench.bootstrap, topology.results, [topology.failed(layer) for layer in FailureLayer], requests,
                lambda: workers[0], 300 + requests / 20, lambda _pid: self.watch(workers, mock_pid))
            await produced
            check_converged(observed, workers, names, stack.log_tail)
            worker_results = tuple(scrape_results(port) for port in ports)
        except BenchError as exc:
            raise BenchError(f"{count} workers: {exc}\n--- first worker's log ({stack.log_path(names[0])}):\n"
                             f"{stack.log_tail(names[0])}") from exc
        finally:
            for worker in workers:
                stack.stop(worker)
        report = RunReport(f"{count} worker(s)", observed, int(mock.stats()["calls"]),
                           sampler.cores(observed.first_call, observed.last_seen), 0.0)
        return ScaleRun(count, report, worker_results, {**self.idle, **idle_workers}, round_)


def check_converged(observed: Observed, workers: Sequence[subprocess.Popen[bytes]], names: Sequence[str],
                    log_tail: Callable[[str], str]) -> None:
    """Every request answered (the reader returned), no failure event, every worker still up."""
    if observed.failures:
        raise BenchError(f"{observed.failures} failure events on a clean mock: the run did not converge cleanly")
    for name, worker in zip(names, workers, strict=True):
        if worker.poll() is not None:
            raise BenchError(f"{name} exited ({worker.returncode}) during the batch:\n{log_tail(name)}")


# ---- the report ----------------------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> str:
    """`` (min-max)`` of several values, nothing for one."""
    return f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else ""


def cores_cell(run: ScaleRun, prefix: str, cpus: int) -> str:
    used = run.cpu_s(prefix) / run.seconds
    return f"{used:.2f} ({used / cpus:.0%})"


def ratios(runs: Sequence[ScaleRun], beyond_idle: bool = False) -> dict[int, list[float]]:
    """Worker CPU per request of each worker count over that of the fewest workers in the same round (paired:
    a change in the machine's load between rounds cancels out), per worker count, in round order."""
    base_count = min(run.workers for run in runs)
    base = {run.round: run.ms_per_request("worker-", beyond_idle) for run in runs if run.workers == base_count}
    out: dict[int, list[float]] = {}
    for run in sorted(runs, key=lambda r: (r.workers, r.round)):
        if run.round in base:
            out.setdefault(run.workers, []).append(run.ms_per_request("worker-", beyond_idle) / base[run.round])
    return out


def rows(runs: Sequence[ScaleRun], cpus: int) -> list[tuple[str, ...]]:
    """One row per run: throughput, worker CPU per request (all, and each worker's over its own results), its
    ratio to the same round's run with the fewest workers, then the cores (share of the machine) of workers,
    brokers, mock, this process and other jobs over the same window."""
    base_count = min(run.workers for run in runs)
    base = {run.round: run.ms_per_request("worker-") for run in runs if run.workers == base_count}
    rounds = len({run.round for run in runs})
    out: list[tuple[str, ...]] = []
    for run in runs:
        each = run.per_worker_ms()
        total = run.ms_per_request("worker-")
        idle = sum(used for name, used in run.idle.items() if name.startswith("worker-"))
        first = base.get(run.round, float("nan"))
        label = str(run.workers) if rounds == 1 else f"{run.workers} (round {run.round + 1})"
        out.append((label, f"{run.requests / run.seconds:.0f}",
                    f"{total:.2f} ({run.ms_per_request('worker-', beyond_idle=True):.2f})",
                    f"{sum(each) / len(each):.2f} ({min(each):.2f}-{max(each):.2f})", f"{total / first:.2f}",
                    cores_cell(run, "worker-", cpus), f"{idle:.2f}", cores_cell(run, "broker-", cpus),
                    f"{run.ms_per_request('broker-', beyond_idle=True):.2f}", cores_cell(run, "mock", cpus),
                    f"{run.ms_per_request('mock', beyond_idle=True):.2f}", cores_cell(run, "bench", cpus),
                    cores_cell(run, "other", cpus)))
    return out


HEADER = ("workers", "req/s", "worker CPU ms/req (*)", "per worker ms/req (range)", "vs first",
          "workers cores", "workers idle", "3 brokers cores", "brokers ms/req*", "mock cores", "mock ms/req*",
          "bench cores", "other cores")


def report(args: argparse.Namespace, runs: Sequence[ScaleRun], load: tuple[float, float]) -> list[str]:
    cpus = os.cpu_count() or 1
    print()
    print(f"streamproc scale-out benchmark: {cpus} CPUs, Python {platform.python_version()}, Kafka "
          f"{DEFAULT_KAFKA_VERSION} ({'given cluster' if args.bootstrap else f'local {NODES}-node cluster'}), "
          f"{args.partitions} partitions, in-flight {args.in_flight} per worker, {args.scale_requests} requests "
          f"per run, mock latency 0; load average {load[0]:.2f} at the start, {load[1]:.2f} at the end"
          + "".join(f"; {name}={value}" for name, value in (args.worker_setting or [])))
    print("cores: average over the window (first call to last result), share of the machine in brackets; "
          "* beyond what they take idle (workers: ready, before the batch): "
          + ", ".join(f"{name} {used:.2f}" for name, used in runs[0].idle.items() if not name.startswith("worker-"))
          + " cores")
    print(table(rows(runs, cpus), HEADER))
    base_count = min(run.workers for run in runs)
    warnings = []
    beyond_idle = ratios(runs, beyond_idle=True)
    for count, values in ratios(runs).items():
        if count == base_count:
            continue
        growth = statistics.median(values)
        status = "met" if growth <= TARGET_GROWTH else "GROWS"
        print(f"worker CPU per request, {count} / {base_count} worker(s): {growth:.2f}{spread(values)} "
              f"(must not grow: <= {TARGET_GROWTH}) {status}; beyond the workers' idle CPU "
              f"{statistics.median(beyond_idle[count]):.2f}{spread(beyond_idle[count])}")
        if status != "met":
            warnings.append(f"worker CPU per request at {count} workers is {growth:.2f} x {base_count}'s")
    for count in sorted({run.workers for run in runs}):
        projections = [run.projection() for run in runs if run.workers == count]
        per_worker, mock_cap, broker_cap = (statistics.median(p[i] for p in projections) for i in range(3))
        print(f"projection from {count} worker(s): N workers on N cores = N x {per_worker:.0f} req/s, capped at "
              f"{mock_cap:.0f} req/s by the mock (one core) and {broker_cap:.0f} req/s by the busiest broker node "
              "(one core each)" + (" (medians over the rounds)" if len(projections) > 1 else ""))
    for run in runs:
        if run.report.observed.duplicates or run.report.mock_calls != run.report.observed.expected:
            warnings.append(f"{run.report.name}: {run.report.observed.duplicates} duplicate results, "
                            f"{run.report.mock_calls} LLM calls for {run.report.observed.expected} requests")
    busy = max((run.report.cores.get("other", 0.0), run.report.name) for run in runs)
    if busy[0] > OTHER_LOAD_WARNING:
        warnings.append(f"other processes used {busy[0]:.2f} cores during {busy[1]}: the machine was shared")
    for warning in warnings:
        print(f"WARNING: {warning}")
    return warnings


# ---- the suite ---------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    cluster = None if args.bootstrap else LocalCluster(Settings(
        data_dir=stack.workdir / "cluster", local_kafka_port=0, local_kafka_controller_port=0))
    try:
        if cluster is None:
            bootstrap, broker_pids = args.bootstrap, []
            print(f"cluster {bootstrap} (given: its CPU is not measured); load average {load_start:.2f}", flush=True)
        else:
            status = cluster.start(NODES)
            if status.bootstrap is None:
                raise BenchError(f"the local cluster did not start: {status.describe()}")
            bootstrap, broker_pids = status.bootstrap, [node.pid for node in status.nodes if node.pid is not None]
            print(f"{status.describe()}\nwork dir {stack.workdir}; load average {load_start:.2f}", flush=True)
        bench = Bench(stack, bootstrap, time.strftime("%Y%m%d%H%M%S"), args.in_flight, args.partitions, None,
                      dict(args.worker_setting or []))
        if args.scale_warmup:
            await bench.warm_up(args.scale_warmup)
        scale = ScaleBench(bench, broker_pids)
        await scale.measure_idle()
        runs = []
        for round_ in range(args.scale_rounds):
            shift = round_ % len(args.workers)
            for count in args.workers[shift:] + args.workers[:shift]:
                runs.append(await scale.run(count, args.scale_requests, round_))
                print(f"round {round_ + 1}: {runs[-1].describe()}", flush=True)
        report(args, runs, (load_start, os.getloadavg()[0]))
    finally:
        if cluster is not None:
            cluster.stop()
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")


def worker_counts(text: str) -> list[int]:
    """``1,2,4`` -> [1, 2, 4]."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of worker counts like 1,2,4") from exc
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"{text!r}: worker counts are at least 1, each named once")
    return counts


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """The scale suite's own options."""
    parser.add_argument("--workers", type=worker_counts, default=[1, 2, 4], metavar="N,N,...",
                        help="worker counts, one run each, in this order [1,2,4]")
    parser.add_argument("--scale-requests", type=int, default=6000, help="requests of each run [6000]")
    parser.add_argument("--scale-rounds", type=int, default=1,
                        help="rounds of every worker count, the order rotating from round to round [1]")
    parser.add_argument("--scale-warmup", type=int, default=3000,
                        help="requests of the unreported warm-up run (one worker) [3000]")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if min(args.scale_requests, args.scale_rounds, args.in_flight) < 1 or args.scale_warmup < 0:
        parser.error("--scale-requests, --scale-rounds and --in-flight must be at least 1, --scale-warmup at least 0")
    if max(args.workers) > args.partitions:
        parser.error(f"--partitions {args.partitions} leaves some of {max(args.workers)} workers idle: give at "
                     "least as many partitions as workers")


def main(argv: list[str] | None = None) -> None:
    def arguments(parser: argparse.ArgumentParser) -> None:
        add_worker_setting_argument(parser)  # scripts/bench has it in the pipeline suite's group
        add_arguments(parser)

    suite_main("python -m benchmarks.scale", __doc__, arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()
