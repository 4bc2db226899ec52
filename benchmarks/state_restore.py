"""``scripts/bench state --restore-only [--forgotten N]``: a worker's table restore alone, and after ``forget``
(issue 29).

Each namespace's state changelog is filled, then a worker restores it into a fresh data dir and is stopped as
soon as faust says "Recovery complete". The restore is timed from faust's log: from its highwaters (it knows
the changelog's end, the read begins) to "Recovery complete", which holds the bulk read (app/bulk_restore.py,
its own rate in its log line) and whatever faust read itself after it. Shapes of the changelog:

* ``live``: the ``--states`` states of live batches only: what a restore reads once every forgotten batch
  has left the log (compaction, and ``delete.retention.ms`` past for its tombstones);
* ``forgotten, not compacted``: ``--forgotten`` states of a finished batch, the live states, then the
  batch's tombstones (``forget``): the changelog right after ``forget``, before compaction reached it;
* ``forgotten, compacted``: the tombstones and the live states: after compaction removed the forgotten
  values, while it still keeps their tombstones (``delete.retention.ms``, an hour: app/topics.py);
* ``forgotten, compacted by the broker``: the first shape written to a changelog with the deployment's topic
  settings, hours shortened to seconds (benchmarks/state_compaction.py), restored once the broker's cleaner
  has dropped the forgotten values and then their tombstones: what a restore reads a few hours after forget.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import statistics
import sys
import time
from dataclasses import dataclass

from benchmarks.faust_log import RECOVERY_ENDS, recovery_span_s
from benchmarks.pipeline import Bench, process_cpu_s, table, worker_env
from benchmarks.state_compaction import SHORTENED, await_compaction, count_log, create_shortened
from benchmarks.state_fill import fill_changelog, finished_states, tombstones
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.core.events import RequestState
from streamproc.core.topology import Topology
from streamproc.kafka.connection import KafkaConnection

_BULK = re.compile(r"bulk restore: (\d+) changelog records of \d+ partitions in ([\d.]+) s \(\d+/s, ([\d.]+) µs")
TARGET_RATIO = 1.2  # restore after forget / restore of the live states alone (issue 29)
TARGET_RATE = 50_000  # states restored per second (issue 29)
LIVE_BATCH = "batch_live"
FORGOTTEN_BATCH = "batch_forgotten"


@dataclass(frozen=True)
class Restore:
    """One restore into a fresh data dir: the changelog's records, faust's span, and the bulk read's share."""

    shape: str
    records: int
    seconds: float
    bulk_records: int
    bulk_seconds: float
    bulk_cpu_us: float  # the worker's CPU per record during the bulk read (its log line)
    worker_cpu_s: float | None  # the worker's whole life to the end of the restore, its start included

    @property
    def rate(self) -> float:
        return self.records / max(self.seconds, 1e-9)

    def describe(self) -> str:
        cpu = "" if self.worker_cpu_s is None else f"; worker CPU from its start {self.worker_cpu_s:.1f}s"
        bulk = (f"; the bulk read {self.bulk_records:,} in {self.bulk_seconds:.1f}s, {self.bulk_cpu_us:.1f} µs CPU "
                "per record" if self.bulk_records else "")
        return (f"{self.shape}: {self.records:,} changelog records restored in {self.seconds:.1f}s "
                f"({self.rate:,.0f}/s{bulk}{cpu})")


async def filled(bench: Bench, shape: str, records: list[RequestState | bytes], shortened: bool = False) -> Topology:
    """A namespace whose state changelog holds ``records`` (bytes: a tombstone), its times shortened (compaction
    in seconds) if ``shortened``."""
    topology = bench.topology(f"restore-{'-'.join(shape.replace(',', '').split()[:3])}-{len(records)}")
    if shortened:
        await create_shortened(bench.bootstrap, topology.state_changelog, bench.partitions)
    await ensure_pipeline_topics(KafkaConnection(bootstrap=bench.bootstrap), topology)
    await fill_changelog(bench.bootstrap, topology.state_changelog, bench.partitions, records, None)
    return topology


async def restore(bench: Bench, shape: str, topology: Topology, records: int, timeout_s: float,
                  bulk: bool = True, again: int = 0) -> Restore:
    """The namespace's changelog restored by a fresh worker (faust's own restore alone unless ``bulk``; ``again``:
    the how-manieth restore of the same namespace, each into a data dir of its own)."""
    name = f"{topology.prefix.rsplit('-', 1)[0]}-{'bulk' if bulk else 'faust'}{f'-{again}' if again else ''}"
    env = worker_env(bench.bootstrap, topology.prefix, "http://127.0.0.1:9", bench.stack.workdir / f"{name}-data",
                     bench.in_flight, bench.partitions)
    env.update({"STREAMPROC_WORKER_METRICS_PORT": "0", "STREAMPROC_BULK_RESTORE": str(bulk).lower()})
    process = bench.stack.spawn(name, [sys.executable, "-m", "streamproc", "worker"], env)
    deadline = time.monotonic() + timeout_s
    log_path = bench.stack.log_path(name)
    try:
        while RECOVERY_ENDS not in log_path.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: no restore within {timeout_s:.0f}s:\n{bench.stack.log_tail(name)}")
            await asyncio.sleep(0.2)
        cpu_s = process_cpu_s(process.pid)
    finally:
        bench.stack.stop(process)
    log_text = log_path.read_text(errors="replace")
    span = recovery_span_s(log_text)
    read = [(int(count), float(seconds), float(cpu)) for count, seconds, cpu in _BULK.findall(log_text)]
    bulk_records = sum(count for count, _, _ in read)
    measured = Restore(shape if bulk else f"{shape}, faust's restore", records,
                       span if span is not None else float("nan"), bulk_records,
                       sum(seconds for _, seconds, _ in read),
                       sum(count * cpu for count, _, cpu in read) / max(bulk_records, 1), cpu_s)
    print(measured.describe(), flush=True)
    return measured


async def run_restores(bench: Bench, args: argparse.Namespace) -> list[str]:
    """The restores of the shapes above (only ``live`` without ``--forgotten``); returns the warnings."""
    now_ms = int(time.time() * 1000)
    live = list(finished_states(LIVE_BATCH, args.states, now_ms))
    timeout_s = 300 + (args.states + 2 * args.forgotten) / 2000
    live_ns = await filled(bench, "live", list(live))
    live_run = await restore(bench, "live", live_ns, len(live), timeout_s)
    runs = [live_run]
    if args.compare_faust:
        runs.append(await restore(bench, "live", live_ns, len(live), timeout_s + args.states / 1000, bulk=False))
    if args.forgotten:
        forgotten = list(finished_states(FORGOTTEN_BATCH, args.forgotten, now_ms - 86_400_000))
        deletes = list(tombstones(forgotten))
        for shape, records in (("forgotten, not compacted", list(itertools.chain(forgotten, live, deletes))),
                               ("forgotten, compacted", [*deletes, *live])):
            runs.append(await restore(bench, shape, await filled(bench, shape, records), len(records), timeout_s))
        shape = "forgotten, compacted by the broker"
        compacted = await filled(bench, shape, list(itertools.chain(forgotten, live, deletes)), shortened=True)
        waited = await await_compaction(bench.bootstrap, compacted.state_changelog, bench.partitions, len(live),
                                        timeout_s)
        print(f"the broker compacted the forgotten states and dropped their tombstones in {waited:.0f}s "
              f"(settings {SHORTENED})", flush=True)
        left = await count_log(bench.bootstrap, compacted.state_changelog, bench.partitions)
        paired = []  # the load moves a 200,000-state restore by seconds: alternate it with the live one's
        for again in range(1, args.restore_rounds + 1):
            paired.append((await restore(bench, "live", live_ns, len(live), timeout_s, again=again),
                           await restore(bench, shape, compacted, left.values + left.tombstones + left.nudges,
                                         timeout_s, again=again)))
        runs.append(paired[0][1])
    rows = [row(run, live_run, runs[1] if args.compare_faust else None) for run in runs]
    if args.forgotten:
        rows.append(paired_row(paired))
    print()
    print(f"restore benchmark: {args.states:,} live states, {args.forgotten:,} forgotten, {bench.partitions} "
          "partitions, one worker, fresh data dirs")
    print(table(rows))
    warnings = [f"{row[0]}: {row[3]}" for row in rows if "MISSED" in row[3]]
    for warning in warnings:
        print(f"WARNING: {warning}")
    return warnings


def paired_row(paired: list[tuple[Restore, Restore]]) -> tuple[str, str, str, str]:
    """The broker-compacted restores against the live ones they alternated with: the ratio of the medians."""
    live = statistics.median(run.seconds for run, _ in paired)
    compacted = statistics.median(run.seconds for _, run in paired)
    each = ", ".join(f"{a.seconds:.1f}/{b.seconds:.1f}" for a, b in paired)
    ratio = compacted / live
    return (f"forgotten, compacted by the broker, against live: {len(paired)} alternated rounds",
            f"medians {compacted:.1f}s compacted / {live:.1f}s live (live/compacted each round: {each})",
            f"<= {TARGET_RATIO} x live",
            f"{ratio:.2f} x: {'met' if ratio <= TARGET_RATIO else 'MISSED'}")


def row(run: Restore, live: Restore, faust: Restore | None) -> tuple[str, str, str, str]:
    """A restore's row: the live one against the rate target, faust's against the live one, a shape after
    forget against the live one's time."""
    figure = f"{run.seconds:.1f}s = {run.rate:,.0f} records/s" + (
        f" (bulk read {run.bulk_seconds:.1f}s, {run.bulk_cpu_us:.1f} µs CPU per record)" if run.bulk_records else "")
    label = f"restore of {run.shape} ({run.records:,} records)"
    if run is live:
        return label, figure, f">= {TARGET_RATE:,}/s", "met" if run.rate >= TARGET_RATE else "MISSED"
    if run is faust:
        return label, figure, "", f"bulk is {run.seconds / live.seconds:.1f} x faster"
    ratio = run.seconds / live.seconds
    return label, figure, f"<= {TARGET_RATIO} x live", f"{ratio:.2f} x: {'met' if ratio <= TARGET_RATIO else 'MISSED'}"
