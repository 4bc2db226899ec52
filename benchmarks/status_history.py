"""``status`` and ``batches`` over a long history (issue 29): the workers' batch summaries against the fold of every
state on the changelog (``--verify``).

The state changelog of a fresh namespace is filled with ``--history`` finished requests in ``--history-batches``
batches (benchmarks/state_fill, the way a worker's table writes put them there); the summary topic gets what the
workers would publish for those states: per (batch, partition) the counts of core.batch_summary, written here while
the states are made, so the run needs no worker restoring a million states first (a worker's build of its
partitions' summaries is its scan of its RocksDB at assignment, not measured here). Then the CLI is timed as an
operator runs it, a fresh process each time (Python's start included): ``status --batch-id`` of the newest batch and
``batches --limit 0``, each from the summaries (best of ``--status-repeats``) and with ``--verify``; targets:
status <= 2 s, batches <= 3 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from benchmarks.pipeline import Stack, start_broker, suite_main
from benchmarks.state_fill import fill_changelog, finished_states
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.codec.summary_record import encode_summary, encode_summary_key
from streamproc.core.batch_summary import BatchCounts, LatestState, SummaryKey
from streamproc.core.events import RequestState
from streamproc.core.topology import Topology
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings

TARGET_STATUS_S = 2.0
TARGET_BATCHES_S = 3.0


def history(batches: int, requests: int, partitions: int, counts: dict[SummaryKey, BatchCounts]
            ) -> Iterator[RequestState]:
    """``requests`` finished states spread over ``batches`` batches, a day old, oldest batch first; each one counted
    into ``counts`` on the partition its key hashes to, as the worker owning that partition counts it."""
    partitioner, every = DefaultPartitioner(), list(range(partitions))
    now_ms = int(time.time() * 1000)
    for index in range(batches):
        size = requests // batches + (1 if index < requests % batches else 0)
        batch_id = f"history-{index:04d}"
        for state in finished_states(batch_id, size, now_ms - 86_400_000 + index * 60_000):
            partition = partitioner(state.request_id.encode(), every, every)
            counts.setdefault(SummaryKey(batch_id, partition), BatchCounts()).add(LatestState.of(state))
            yield state


async def publish(bootstrap: str, topic: str, counts: dict[SummaryKey, BatchCounts]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        now_ms = int(time.time() * 1000)
        for key, batch_counts in counts.items():
            await producer.send(topic, encode_summary(batch_counts, now_ms), key=encode_summary_key(key), partition=0)
        await producer.flush()
    finally:
        await producer.stop()


def timed_cli(bootstrap: str, topology: Topology, *args: str) -> float:
    """Seconds of one ``streamproc *args`` run, as a fresh process; its modules compiled (``.pyc``) as an installed
    package has them, not compiled again each run as with PYTHONDONTWRITEBYTECODE (set on the dev machines)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("STREAMPROC_") and key != "PYTHONDONTWRITEBYTECODE"}  # installed: compiled once
    env.update({"STREAMPROC_KAFKA_BOOTSTRAP": bootstrap, "STREAMPROC_TOPIC_PREFIX": topology.prefix,
                "STREAMPROC_APP_ID": topology.app_id, "STREAMPROC_PARTITIONS": str(topology.partitions)})
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "streamproc", *args], env=env, capture_output=True, text=True,
                          check=False, timeout=1800)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"streamproc {' '.join(args)} exited with {done.returncode}: {done.stderr[-2000:]}")
    return seconds


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    bootstrap, _ = start_broker(args, stack)
    settings = Settings(topic_prefix=f"statusbench{time.strftime('%H%M%S')}", partitions=args.partitions)
    topology = settings.topology()
    await ensure_pipeline_topics(KafkaConnection(bootstrap=bootstrap), topology)
    counts: dict[SummaryKey, BatchCounts] = {}
    filled = await fill_changelog(bootstrap, topology.state_changelog, args.partitions,
                                  history(args.history_batches, args.history, args.partitions, counts), None)
    await publish(bootstrap, topology.summaries, counts)
    print(f"history: {filled.records:,} finished states in {args.history_batches} batches on "
          f"{topology.state_changelog} ({filled.seconds:.1f}s), {len(counts):,} summaries on {topology.summaries}",
          flush=True)
    newest = f"history-{args.history_batches - 1:04d}"
    runs = {"status --batch-id": ("status", "--batch-id", newest, "--json"),
            "batches": ("batches", "--limit", "0", "--json")}
    targets = {"status --batch-id": TARGET_STATUS_S, "batches": TARGET_BATCHES_S}
    for command in runs.values():  # a fresh broker compiles its request paths on the first calls: not counted
        timed_cli(bootstrap, topology, *command)
    summary = {name: float("inf") for name in runs}
    for _ in range(args.status_repeats):  # alternating, so that both see the same machine
        for name, command in runs.items():
            summary[name] = min(summary[name], timed_cli(bootstrap, topology, *command))
    rows = []
    for name, command in runs.items():
        verify = timed_cli(bootstrap, topology, *command, "--verify")
        verdict = "met" if summary[name] <= targets[name] else "MISSED"
        rows.append(f"{name:<18} summaries {summary[name]:6.2f} s (target <= {targets[name]:g} s: {verdict}), "
                    f"--verify (fold) {verify:7.2f} s, {verify / summary[name]:5.1f} x")
        print(rows[-1], flush=True)
    print(f"\n{filled.records:,} requests of history in {args.history_batches} finished batches, "
          f"{args.partitions} partitions (best of {args.status_repeats} for the summaries):")
    print("\n".join(rows))
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """The status suite's own options."""
    parser.add_argument("--history", type=int, default=1_000_000, help="finished requests of history [1000000]")
    parser.add_argument("--history-batches", type=int, default=200, help="batches they are in [200]")
    parser.add_argument("--status-repeats", type=int, default=5, help="runs of each summary command [5]")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("history", "history_batches", "status_repeats", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")


def main(argv: list[str] | None = None) -> None:
    suite_main("python -m benchmarks.status_history", __doc__, add_arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()
