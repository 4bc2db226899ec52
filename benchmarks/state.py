"""``scripts/bench state``: a million requests of state, all figures from one run (issue 16).

Starts a private Kafka broker (temporary data dir, free ports) and the mock LLM server at zero latency, so
the worker's own per-record handling (its RocksDB reads and writes among it) is what costs, then:

1. fills the state changelog of one namespace ("full") with ``--states`` RequestState entries of an old,
   finished batch, written straight to the topic as a worker's table writes would be
   (:mod:`benchmarks.state_fill`), on the compacted topic ``ensure_pipeline_topics`` creates;
2. runs the same batch (``--state-requests`` requests, every one on the requests topic before the worker
   starts) through a worker on an empty namespace, through a worker on the full one, which first rebuilds
   its table from the changelog into a fresh data dir (what a new machine, or a lost disk, does), and
   through a worker on a second empty namespace: the empty runs bracket the full one, so a change in the
   machine's load during the run shows as a difference between them;
3. restarts the full worker on the data dir it left ("restart"): faust reads only the changelog past the
   offsets its RocksDB stored, and a small batch shows how soon it works again.

Printed: the recovery time (worker start to its first LLM call, minus the empty run's start-up; and faust's
own "recovery" log span), the restore rate, the worker's RSS after recovery; per-record worker CPU and
peak RSS of the full run against the mean of the empty runs (ratios; target within 20 %), all measured in
this run next to the CPU the rest of the machine used: it is shared.

A missed target is a warning, not a failure; the exit code is 0 when every run converged, 1 when one did
not, 130 on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.faust_log import recovery_span_s, timed_lines
from benchmarks.pipeline import (
    Bench,
    RunReport,
    Sampler,
    Stack,
    chat_request,
    produce_requests,
    shared_and_unclean,
    start_broker,
    suite_main,
    table,
)
from benchmarks.state_fill import Filled, fill_changelog, finished_states
from benchmarks.state_restore import run_restores
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.core.topology import Topology
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import DEFAULT_KAFKA_VERSION

TARGET_RATIO = 1.2  # full-table run / empty-table run, per-record CPU and peak RSS
OLD_BATCH = "batch_old_finished"


# the reconciler's first pass after a start reads every state once (design §4), and says so
_FULL_SWEEP = re.compile(r"reconciler: read all (\d+) states in ([\d.]+) s")


@dataclass(frozen=True)
class FullSweep:
    """The reconciler's pass over every state: when it ended, how many it read, how long it took."""

    ended: float
    states: int
    seconds: float

    def describe(self, window: tuple[float, float]) -> str:
        inside = window[0] <= self.ended - self.seconds and self.ended <= window[1]
        where = "inside" if inside else "not wholly inside"
        return f"{self.states:,} states in {self.seconds:.1f}s ({where} the measured window)"


def full_sweep(log_text: str) -> FullSweep | None:
    for when, line in timed_lines(log_text):
        if (found := _FULL_SWEEP.search(line)) is not None:
            return FullSweep(when, int(found.group(1)), float(found.group(2)))
    return None


@dataclass
class RssSampler(Sampler):
    """A :class:`Sampler` that also keeps the resident set (VmRSS) of the process under test over time."""

    rss_kb: list[tuple[float, int]] = field(default_factory=list)

    def sample(self) -> None:
        super().sample()
        pid = next(iter(self.pids.values()))
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                self.rss_kb.append((time.time(), int(line.split()[1])))

    def rss_mb_at(self, when: float) -> float:
        """The resident set at the sample nearest ``when`` (0 without samples)."""
        return min(self.rss_kb, key=lambda s: abs(s[0] - when), default=(0.0, 0))[1] / 1024


@dataclass
class RssBench(Bench):
    """The pipeline benchmark's runs, each watched by an :class:`RssSampler` (the latest in ``last``)."""

    last: RssSampler | None = None

    def sampler(self, under_test: str, mock_pid: int) -> Callable[[int], Sampler]:
        make = super().sampler(under_test, mock_pid)

        def watch(pid: int) -> Sampler:
            self.last = RssSampler(make(pid).pids)
            return self.last

        return watch


@dataclass(frozen=True)
class Measured:
    """One batch run, with the worker's start-up (to the batch's first LLM call), its resident set then, and
    faust's recovery span."""

    run: RunReport
    startup_s: float
    rss_started_mb: float
    recovery_log_s: float | None
    sweep: FullSweep | None

    def describe(self) -> str:
        span = "" if self.recovery_log_s is None else f" (faust's recovery {self.recovery_log_s:.1f}s)"
        return (f"{self.run.describe()}\n  start-up to the first call {self.startup_s:.1f}s{span}, RSS then "
                f"{self.rss_started_mb:.0f} MB, peak {self.run.peak_rss_mb:.0f} MB")


class StateBench:
    """The namespaces of one run and the batch runs over them."""

    def __init__(self, bench: RssBench, args: argparse.Namespace) -> None:
        self.bench = bench
        self.args = args
        self.batches = 0

    async def namespace(self, name: str) -> Topology:
        topology = self.bench.topology(name)
        await ensure_pipeline_topics(KafkaConnection(bootstrap=self.bench.bootstrap), topology)
        return topology

    async def batch(self, name: str, topology: Topology, requests: int, earlier: int = 0) -> Measured:
        """``requests`` new requests on the namespace's requests topic, then a worker over them (``earlier``:
        results of earlier batches already on the namespace's results topic)."""
        self.batches += 1
        batch_id = f"batch_{name}_{self.batches}"
        await produce_requests(self.bench.bootstrap, topology.requests,
                               (chat_request(batch_id, i) for i in range(requests)))
        llm_url, mock_pid = self.bench.zero_latency_mock()
        report = await self.bench.pipeline(name, topology, llm_url, mock_pid, earlier + requests,
                                           300 + requests / 20 + self.args.states / 5000, False)
        assert self.bench.last is not None
        first_call = min(r.completed_ms - r.latency_ms for r in report.observed.results.values()
                         if r.batch_id == batch_id) / 1000
        log_text = self.bench.stack.log_path(name).read_text(errors="replace")
        measured = Measured(report, first_call - report.observed.spawned, self.bench.last.rss_mb_at(first_call),
                            recovery_span_s(log_text), full_sweep(log_text))
        print(measured.describe() if not earlier else
              f"{name} (restarted): start-up to the first call {measured.startup_s:.1f}s, RSS then "
              f"{measured.rss_started_mb:.0f} MB", flush=True)
        return measured


def report(args: argparse.Namespace, filled: Filled, empties: tuple[Measured, Measured], full: Measured,
           restart: Measured | None) -> list[str]:
    def mean(figure: Callable[[Measured], float]) -> float:
        return sum(figure(run) for run in empties) / len(empties)

    def each(figure: Callable[[Measured], float], template: str) -> str:
        return " and ".join(template.format(figure(run)) for run in empties)

    cpu_empty, cpu_full = mean(lambda m: m.run.cpu_ms_per_request), full.run.cpu_ms_per_request
    rss_empty, rss_full = mean(lambda m: m.run.peak_rss_mb), full.run.peak_rss_mb
    startup_empty = mean(lambda m: m.startup_s)
    recovery = full.startup_s - startup_empty
    ok = {"cpu": cpu_full <= TARGET_RATIO * cpu_empty, "rss": rss_full <= TARGET_RATIO * rss_empty}
    rows = [
        (f"fill: {filled.records:,} states ({filled.bytes / 1e6:.0f} MB) to the changelog",
         f"{filled.seconds:.1f}s = {filled.rate:,.0f} records/s", "", ""),
        (f"recovery of {filled.records:,} states into a fresh data dir (start-up beyond the empty run's "
         f"{startup_empty:.1f}s)", f"{recovery:.1f}s = {filled.records / max(recovery, 1e-9):,.0f} records/s",
         "(printed)", ""),
        ("worker RSS after recovery (at the first call): full / empty",
         f"{full.rss_started_mb:.0f} / {mean(lambda m: m.rss_started_mb):.0f} MB",
         "", ""),
        (f"worker CPU per record, {args.state_requests:,} requests: full / empty (empty runs: "
         f"{each(lambda m: m.run.cpu_ms_per_request, '{:.2f} ms')})",
         f"{cpu_full:.2f} / {cpu_empty:.2f} ms = {cpu_full / cpu_empty:.2f}", f"<= {TARGET_RATIO}",
         "met" if ok["cpu"] else "MISSED"),
        (f"worker peak RSS (VmHWM): full / empty (empty runs: {each(lambda m: m.run.peak_rss_mb, '{:.0f} MB')})",
         f"{rss_full:.0f} / {rss_empty:.0f} MB = {rss_full / rss_empty:.2f}",
         f"<= {TARGET_RATIO}", "met" if ok["rss"] else "MISSED"),
        ("throughput: full / empty", f"{full.run.observed.rate:.0f} / {mean(lambda m: m.run.observed.rate):.0f} "
         "req/s", "", ""),
    ]
    window = (full.run.observed.first_call, full.run.observed.last_seen)
    rows.append(("the reconciler's one full sweep after the start (full run)",
                 "not seen" if full.sweep is None else full.sweep.describe(window), "", ""))
    if restart is not None:
        rows.append((f"restart on the full worker's data dir, then {args.restart_requests} requests",
                     f"start-up {restart.startup_s:.1f}s, RSS then {restart.rss_started_mb:.0f} MB", "", ""))
    print()
    print(f"streamproc state benchmark: {os.cpu_count()} CPUs, Python {platform.python_version()}, Kafka "
          f"{DEFAULT_KAFKA_VERSION} ({'given broker' if args.bootstrap else 'private broker'}), "
          f"{args.partitions} partitions, in-flight {args.in_flight}, mock latency 0")
    print(table(rows))
    runs = [empties[0].run, full.run, empties[1].run]
    for run in runs:
        print(f"cores used during {run.name} (of {os.cpu_count()}): "
              + ", ".join(f"{name} {used:.2f}" for name, used in run.cores.items()))
    warnings = []
    if not ok["cpu"]:
        warnings.append(f"worker CPU per record on the full table is {cpu_full / cpu_empty:.2f} x the empty "
                        f"table's (target <= {TARGET_RATIO})")
    if not ok["rss"]:
        warnings.append(f"worker peak RSS on the full table is {rss_full / rss_empty:.2f} x the empty table's "
                        f"(target <= {TARGET_RATIO})")
    warnings += shared_and_unclean(*runs)
    for warning in warnings:
        print(f"WARNING: {warning}")
    return warnings


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    bootstrap, broker_pid = start_broker(args, stack)
    bench = RssBench(stack, bootstrap, time.strftime("%Y%m%d%H%M%S"), args.in_flight, args.partitions, broker_pid)
    states = StateBench(bench, args)
    if args.restore_only:
        await run_restores(bench, args)
        print(f"(benchmark took {time.monotonic() - started:.0f}s)")
        return
    empty_ns, full_ns, after_ns = [await states.namespace(name) for name in ("empty", "full", "empty-after")]
    filled = await fill_changelog(bootstrap, full_ns.state_changelog, args.partitions,
                                  finished_states(OLD_BATCH, args.states, int(time.time() * 1000) - 86_400_000),
                                  args.fill_compression)
    print(f"filled {full_ns.state_changelog}: {filled.records:,} states in {filled.seconds:.1f}s "
          f"({filled.rate:,.0f}/s)", flush=True)
    if args.state_warmup:
        await bench.warm_up(args.state_warmup)
    empty = await states.batch("worker-empty", empty_ns, args.state_requests)
    full = await states.batch("worker-full", full_ns, args.state_requests)
    restart = (await states.batch("worker-full", full_ns, args.restart_requests, earlier=args.state_requests)
               if args.restart_requests else None)
    after = await states.batch("worker-empty-after", after_ns, args.state_requests)
    report(args, filled, (empty, after), full, restart)
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """The state suite's own options."""
    parser.add_argument("--states", type=int, default=1_000_000,
                        help="entries written to the full namespace's state changelog [1000000]")
    parser.add_argument("--state-requests", type=int, default=5000, help="requests of each batch run [5000]")
    parser.add_argument("--state-warmup", type=int, default=2000,
                        help="requests of the unreported warm-up run [2000]")
    parser.add_argument("--restart-requests", type=int, default=500,
                        help="requests of the restart run on the full worker's data dir; 0: no restart run [500]")
    parser.add_argument("--restore-only", action="store_true",
                        help="only restores: --states live states into a fresh worker, and with --forgotten the "
                        "changelog after forget, before and after compaction (benchmarks/state_restore.py)")
    parser.add_argument("--forgotten", type=int, default=0,
                        help="with --restore-only: states of a finished batch that forget tombstoned [0: none]")
    parser.add_argument("--restore-rounds", type=int, default=3,
                        help="with --forgotten: restores of the live states alternated with the broker-compacted "
                        "changelog's, compared by their medians [3]")
    parser.add_argument("--compare-faust", action="store_true",
                        help="with --restore-only: the live states restored by faust's own restore too (a "
                        "worker with STREAMPROC_BULK_RESTORE=false), for the ratio")
    parser.add_argument("--fill-compression", choices=("gzip", "none"), default="none",
                        help="compression of the fill's batches [none: as faust's producer writes the changelog]")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("states", "state_requests", "in_flight", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.restore_rounds < 1:
        parser.error("--restore-rounds must be at least 1")
    if args.restart_requests < 0 or args.state_warmup < 0 or args.forgotten < 0:
        parser.error("--restart-requests, --state-warmup and --forgotten must be at least 0")
    if (args.forgotten or args.compare_faust) and not args.restore_only:
        parser.error("--forgotten and --compare-faust go with --restore-only")
    if args.fill_compression == "none":
        args.fill_compression = None


def main(argv: list[str] | None = None) -> None:
    suite_main("python -m benchmarks.state", __doc__, add_arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()
