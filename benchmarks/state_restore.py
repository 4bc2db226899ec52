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
  values, while it still keeps their tombstones (``delete.retention.ms``, the broker's default 24 hours).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import sys
import time
from dataclasses import dataclass

from benchmarks.faust_log import RECOVERY_ENDS, recovery_span_s
from benchmarks.pipeline import Bench, table, worker_env
from benchmarks.state_fill import fill_changelog, finished_states, tombstones
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.core.events import RequestState
from streamproc.kafka.connection import KafkaConnection

_BULK = re.compile(r"bulk restore: (\d+) changelog records of \d+ partitions in ([\d.]+) s")
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

    @property
    def rate(self) -> float:
        return self.records / max(self.seconds, 1e-9)


async def restore(bench: Bench, shape: str, records: list[RequestState | bytes], timeout_s: float) -> Restore:
    """A namespace whose changelog holds ``records`` (bytes: a tombstone), restored by a fresh worker."""
    name = f"restore-{shape.split(',')[0].replace(' ', '-')}-{len(records)}"
    topology = bench.topology(name)
    await ensure_pipeline_topics(KafkaConnection(bootstrap=bench.bootstrap), topology)
    await fill_changelog(bench.bootstrap, topology.state_changelog, bench.partitions, records, None)
    env = worker_env(bench.bootstrap, topology.prefix, "http://127.0.0.1:9", bench.stack.workdir / f"{name}-data",
                     bench.in_flight, bench.partitions)
    env["STREAMPROC_WORKER_METRICS_PORT"] = "0"
    process = bench.stack.spawn(name, [sys.executable, "-m", "streamproc", "worker"], env)
    deadline = time.monotonic() + timeout_s
    log_path = bench.stack.log_path(name)
    try:
        while RECOVERY_ENDS not in log_path.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: no restore within {timeout_s:.0f}s:\n{bench.stack.log_tail(name)}")
            await asyncio.sleep(0.2)
    finally:
        bench.stack.stop(process)
    log_text = log_path.read_text(errors="replace")
    span = recovery_span_s(log_text)
    bulk = [(int(count), float(seconds)) for count, seconds in _BULK.findall(log_text)]
    measured = Restore(shape, len(records), span if span is not None else float("nan"),
                       sum(count for count, _ in bulk), sum(seconds for _, seconds in bulk))
    print(f"{shape}: {measured.records:,} changelog records restored in {measured.seconds:.1f}s "
          f"({measured.rate:,.0f}/s; the bulk read {measured.bulk_records:,} in {measured.bulk_seconds:.1f}s)",
          flush=True)
    return measured


async def run_restores(bench: Bench, args: argparse.Namespace) -> list[str]:
    """The restores of the shapes above (only ``live`` without ``--forgotten``); returns the warnings."""
    now_ms = int(time.time() * 1000)
    live = list(finished_states(LIVE_BATCH, args.states, now_ms))
    timeout_s = 300 + (args.states + 2 * args.forgotten) / 2000
    live_run = await restore(bench, "live", list(live), timeout_s)
    runs = [live_run]
    if args.forgotten:
        forgotten = list(finished_states(FORGOTTEN_BATCH, args.forgotten, now_ms - 86_400_000))
        deletes = list(tombstones(forgotten))
        runs.append(await restore(bench, "forgotten, not compacted", list(itertools.chain(forgotten, live, deletes)),
                                  timeout_s))
        runs.append(await restore(bench, "forgotten, compacted", [*deletes, *live], timeout_s))
    rows = [(f"restore of {run.shape} ({run.records:,} records)",
             f"{run.seconds:.1f}s = {run.rate:,.0f} records/s (bulk read {run.bulk_seconds:.1f}s)",
             f">= {TARGET_RATE:,}/s" if run is live_run else f"<= {TARGET_RATIO} x live",
             ("met" if run.rate >= TARGET_RATE else "MISSED") if run is live_run else
             f"{run.seconds / live_run.seconds:.2f} x: "
             + ("met" if run.seconds <= TARGET_RATIO * live_run.seconds else "MISSED"))
            for run in runs]
    print()
    print(f"restore benchmark: {args.states:,} live states, {args.forgotten:,} forgotten, {bench.partitions} "
          "partitions, one worker, fresh data dirs")
    print(table(rows))
    warnings = [f"{row[0]}: {row[3]}" for row in rows if "MISSED" in row[3]]
    for warning in warnings:
        print(f"WARNING: {warning}")
    return warnings
