"""``scripts/bench state``: a million requests of state, all figures from one run (issue 16).

Starts a private Kafka broker (temporary data dir, free ports) and the mock LLM server at zero latency, so
the worker's own per-record handling (its RocksDB reads and writes among it) is what costs, then:

1. fills the state changelog of one namespace ("full") with ``--states`` RequestState entries of an old,
   finished batch, written straight to the topic as a worker's table writes would be
   (:mod:`benchmarks.state_fill`), on the compacted topic ``ensure_pipeline_topics`` creates;
2. runs the same batch (``--requests`` requests, every one on the requests topic before the worker starts)
   through a worker on an empty namespace ("empty") and through a worker on the full one, which first
   rebuilds its table from the changelog into a fresh data dir (what a new machine, or a lost disk, does);
3. restarts the full worker on the data dir it left ("restart"): faust reads only the changelog past the
   offsets its RocksDB stored, and a small batch shows how soon it works again.

Printed: the recovery time (worker start to its first LLM call, minus the empty run's start-up; and faust's
own "recovery" log span), the restore rate, the worker's RSS after recovery; per-record worker CPU and
peak RSS of the full run against the empty run (ratios; target within 20 %). Rounds (``--rounds``) repeat
the two batch runs alternately, empty first, and the medians are compared: the machine is shared.

A missed target is a warning, not a failure; the exit code is 0 when every run converged, 1 when one did
not, 130 on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

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
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.core.topology import Topology
from streamproc.settings import DEFAULT_KAFKA_VERSION

TARGET_RATIO = 1.2  # full-table run / empty-table run, per-record CPU and peak RSS
OLD_BATCH = "batch_old_finished"
# faust's recovery service logs when it starts reading the changelogs and when it is done, both at INFO
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
RECOVERY_STARTS = "Restoring state from changelog topics"
RECOVERY_ENDS = "Recovery complete"


def recovery_span_s(log_text: str, starts: str, ends: str) -> float | None:
    """Seconds between the first log line containing ``starts`` and the first after it containing ``ends``."""
    began = None
    for line in log_text.splitlines():
        stamp = _LOG_TIME.match(line)
        if stamp is None:
            continue
        when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if began is None and starts in line:
            began = when
        elif began is not None and ends in line:
            return when - began
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
    """One batch run, with the worker's resident set once it started and faust's recovery span."""

    run: RunReport
    rss_started_mb: float
    recovery_log_s: float | None

    @property
    def startup_s(self) -> float:
        """Worker start to its first LLM call: start-up, including the table's recovery."""
        return self.run.observed.first_call - self.run.observed.spawned

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
        await ensure_pipeline_topics(self.bench.bootstrap, topology)
        return topology

    async def batch(self, name: str, topology: Topology, requests: int) -> Measured:
        """``requests`` new requests on the namespace's requests topic, then a worker over them."""
        self.batches += 1
        batch_id = f"batch_{name}_{self.batches}"
        await produce_requests(self.bench.bootstrap, topology.requests,
                               (chat_request(batch_id, i) for i in range(requests)))
        llm_url, mock_pid = self.bench.zero_latency_mock()
        report = await self.bench.pipeline(name, topology, llm_url, mock_pid, requests,
                                           300 + requests / 20 + self.args.states / 5000, False)
        assert self.bench.last is not None
        log_text = self.bench.stack.log_path(name).read_text(errors="replace")
        measured = Measured(report, self.bench.last.rss_mb_at(report.observed.first_call),
                            recovery_span_s(log_text, RECOVERY_STARTS, RECOVERY_ENDS))
        print(measured.describe(), flush=True)
        return measured


def _median(runs: list[Measured], figure: Callable[[Measured], float]) -> float:
    return statistics.median(figure(m) for m in runs)


def report(args: argparse.Namespace, filled: Filled, empty: list[Measured], full: list[Measured],
           restart: Measured | None) -> list[str]:
    cpu_empty, cpu_full = (_median(runs, lambda m: m.run.cpu_ms_per_request) for runs in (empty, full))
    rss_empty, rss_full = (_median(runs, lambda m: m.run.peak_rss_mb) for runs in (empty, full))
    startup_empty = _median(empty, lambda m: m.startup_s)
    recovery = _median(full, lambda m: m.startup_s) - startup_empty
    ok = {"cpu": cpu_full <= TARGET_RATIO * cpu_empty, "rss": rss_full <= TARGET_RATIO * rss_empty}
    rows = [
        (f"fill: {filled.records:,} states ({filled.bytes / 1e6:.0f} MB) to the changelog",
         f"{filled.seconds:.1f}s = {filled.rate:,.0f} records/s", "", ""),
        (f"recovery of {filled.records:,} states into a fresh data dir (start-up beyond the empty run's "
         f"{startup_empty:.1f}s)", f"{recovery:.1f}s = {filled.records / max(recovery, 1e-9):,.0f} records/s",
         "(printed)", ""),
        ("worker RSS after recovery (at the first call): full / empty",
         f"{_median(full, lambda m: m.rss_started_mb):.0f} / {_median(empty, lambda m: m.rss_started_mb):.0f} MB",
         "", ""),
        (f"worker CPU per record, {args.state_requests:,} requests: full / empty",
         f"{cpu_full:.2f} / {cpu_empty:.2f} ms = {cpu_full / cpu_empty:.2f}", f"<= {TARGET_RATIO}",
         "met" if ok["cpu"] else "MISSED"),
        ("worker peak RSS (VmHWM): full / empty", f"{rss_full:.0f} / {rss_empty:.0f} MB = {rss_full / rss_empty:.2f}",
         f"<= {TARGET_RATIO}", "met" if ok["rss"] else "MISSED"),
        ("throughput: full / empty", f"{_median(full, lambda m: m.run.observed.rate):.0f} / "
         f"{_median(empty, lambda m: m.run.observed.rate):.0f} req/s", "", ""),
    ]
    if restart is not None:
        rows.append((f"restart on the full worker's data dir, then {args.restart_requests} requests",
                     f"start-up {restart.startup_s:.1f}s, RSS then {restart.rss_started_mb:.0f} MB", "", ""))
    print()
    print(f"streamproc state benchmark: {os.cpu_count()} CPUs, Python {platform.python_version()}, Kafka "
          f"{DEFAULT_KAFKA_VERSION} ({'given broker' if args.bootstrap else 'private broker'}), "
          f"{args.partitions} partitions, in-flight {args.in_flight}, mock latency 0, "
          f"{args.state_rounds} round(s)")
    print(table(rows))
    runs = [m.run for m in (*empty, *full, *([restart] if restart else []))]
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
    empty_ns, full_ns = await states.namespace("empty"), await states.namespace("full")
    filled = await fill_changelog(bootstrap, full_ns.state_changelog, args.partitions,
                                  finished_states(OLD_BATCH, args.states, int(time.time() * 1000) - 86_400_000),
                                  args.fill_compression)
    print(f"filled {full_ns.state_changelog}: {filled.records:,} states in {filled.seconds:.1f}s "
          f"({filled.rate:,.0f}/s)", flush=True)
    if args.state_warmup:
        await bench.warm_up(args.state_warmup)
    empty: list[Measured] = []
    full: list[Measured] = []
    for round_ in range(1, args.state_rounds + 1):
        empty.append(await states.batch(f"worker-empty-{round_}", empty_ns, args.state_requests))
        # each full run restores into a fresh data dir (the run's name names it)
        full.append(await states.batch(f"worker-full-{round_}", full_ns, args.state_requests))
    restart = (await states.batch(f"worker-full-{args.state_rounds}", full_ns, args.restart_requests)
               if args.restart_requests else None)
    report(args, filled, empty, full, restart)
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """The state suite's own options."""
    parser.add_argument("--states", type=int, default=1_000_000,
                        help="entries written to the full namespace's state changelog [1000000]")
    parser.add_argument("--state-requests", type=int, default=5000, help="requests of each batch run [5000]")
    parser.add_argument("--state-rounds", type=int, default=1, help="empty/full batch run pairs, alternating [1]")
    parser.add_argument("--state-warmup", type=int, default=2000,
                        help="requests of the unreported warm-up run [2000]")
    parser.add_argument("--restart-requests", type=int, default=500,
                        help="requests of the restart run on the full worker's data dir; 0: no restart run [500]")
    parser.add_argument("--fill-compression", choices=("gzip", "none"), default="none",
                        help="compression of the fill's batches [none: as faust's producer writes the changelog]")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("states", "state_requests", "state_rounds", "in_flight", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.restart_requests < 0 or args.state_warmup < 0:
        parser.error("--restart-requests and --state-warmup must be at least 0")
    if args.fill_compression == "none":
        args.fill_compression = None


def main(argv: list[str] | None = None) -> None:
    suite_main("python -m benchmarks.state", __doc__, add_arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()
