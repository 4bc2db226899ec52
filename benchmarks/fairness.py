"""``scripts/bench fairness``: tenants, priorities and the pool for long requests (issue 28), as ratios against
baselines measured in the same run.

Starts a private Kafka broker; each run has its own topics, a fresh mock LLM (``--profile clean`` with
``--fairness-slots`` slots: ``mock-small`` answers in ``--fairness-latency`` seconds, ``mock-large`` (the long
generations) in ``--long-latency``) and ``--fairness-workers`` workers (2) that share the slots' worth of in-flight
calls, fixed. The workers form their group and warm up on a few requests; then the run's records are produced,
on their priority's topic and with their ``x-tenant``/``x-priority`` headers as ``submit`` writes them, and times
run from their submission.

1. tenants: tenant A submits ``--flood`` requests (20,000 x ``--scale``); 10 s later tenant B (equal weight)
   ``--small`` (200 x ``--scale``). B's completion time (submission to last result) against
   1.5 x (B's count / half the server's capacity) + 5 s; A's throughput (its count / its submission to its last
   result) against A alone (>= 0.95), and A's and B's together against A alone (work-conserving).
2. priorities: ``--small`` ``high`` requests right behind ``--flood`` ``low`` ones of the same tenant: the first
   high result within 5 s of their submission, the last within 1.2 x the high batch's time alone. The high ids
   spread evenly over the partitions, the same in both runs.
3. long requests: ``--mix`` requests, 5 % of them long (``max_tokens`` 2,000 on ``mock-large``): the short ones'
   p99 call latency against the same short ones alone (<= 1.5 x), and the tokens per second (the mock's usage)
   against the same mix without the pool (``STREAMPROC_LONG_REQUEST_TOKENS=0``, >= 0.9 x).

A missed bound is printed as MISSED; the exit code is 0 when every run converged, 1 when one did not, 130 on
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from benchmarks.fleet_workers import formed
from benchmarks.pipeline import Bench, BenchError, Stack, open_bench, spawn_mock, suite_main, table, worker_env
from streamproc import codec
from streamproc.app.topics import ensure_topics
from streamproc.core.events import InferenceRequest, InferenceResult
from streamproc.core.scheduling_headers import scheduling_headers
from streamproc.core.tenancy import Tenancy
from streamproc.core.topology import Topology
from streamproc.core.vocabulary import FailureLayer
from streamproc.devstack.broker import free_port
from streamproc.devstack.chaos.facts import partition_of
from streamproc.kafka.connection import KafkaConnection

B_DELAY_S = 10.0
B_SLACK = 1.5
B_EXTRA_S = 5.0
TARGET_A_THROUGHPUT = 0.95
TARGET_HIGH_FIRST_S = 5.0
TARGET_HIGH_LAST = 1.2
TARGET_SHORT_P99 = 1.5
TARGET_TOKENS = 0.9
LONG_SHARE = 20  # one request in 20 is long: 5 %
LONG_TOKENS = 2000


def request(batch_id: str, i: int, tenancy: Tenancy, long: bool = False) -> InferenceRequest:
    """A short labelling call, or a long generation (2,000-token budget: over the pool's threshold)."""
    body = ({"model": "mock-large", "max_tokens": LONG_TOKENS,
             "messages": [{"role": "user", "content": f"Write a long report about case #{i}, with every detail."}]}
            if long else
            {"model": "mock-small", "max_tokens": 256,
             "messages": [{"role": "user", "content": f"Label support ticket #{i}: late parcel, damaged box."}]})
    return InferenceRequest(request_id=f"{batch_id}-{i:06d}", body_json=json.dumps(body), batch_id=batch_id,
                            submitted_ms=time.time_ns() // 1_000_000, tenant=tenancy.tenant,
                            priority=tenancy.priority)


async def produce(bootstrap: str, topology: Topology, requests: Sequence[InferenceRequest]) -> float:
    """The records on the topics and with the headers ``submit`` gives them (each priority's own topic); the wall
    time they were all on the broker."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        for r in requests:
            await producer.send(topology.request_topic(r.priority, r.tenant), key=r.request_id.encode(),
                                value=codec.encode(r), headers=list(scheduling_headers(r)))
        await producer.flush()
    finally:
        await producer.stop()
    return time.time()


@dataclass
class Batch:
    """A batch produced during a run: its requests and when they were all submitted (wall time)."""

    requests: list[InferenceRequest]
    submitted: float = 0.0

    @property
    def ids(self) -> set[str]:
        return {r.request_id for r in self.requests}


class Results:
    """The run's results topic (and failure topics) read from the start."""

    def __init__(self, bootstrap: str, topology: Topology) -> None:
        self.consumer = AIOKafkaConsumer(topology.results, *(topology.failed(layer) for layer in FailureLayer),
                                         bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                         enable_auto_commit=False)
        self.results_topic = topology.results
        self.results: dict[str, InferenceResult] = {}
        self.failures = 0

    async def poll(self) -> None:
        for tp, messages in (await self.consumer.getmany(timeout_ms=100, max_records=10_000)).items():
            for message in messages:
                if tp.topic != self.results_topic:
                    self.failures += 1
                    continue
                result = codec.decode(message.value, InferenceResult)
                self.results.setdefault(result.request_id, result)

    async def wait_for(self, ids: set[str], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ids <= self.results.keys():
            if time.monotonic() > deadline:
                missing = len(ids - self.results.keys())
                raise BenchError(f"{what}: {missing} of {len(ids)} results missing after {timeout_s:.0f}s "
                                 f"({self.failures} failure events)")
            await self.poll()

    def done_s(self, batch: Batch) -> list[float]:
        """Seconds from the batch's submission to each of its results, in order."""
        return sorted(self.results[i].completed_ms / 1000 - batch.submitted for i in batch.ids)


class FairnessRun:
    """One run: a mock, the workers, their warm-up; then the caller produces its batches and waits."""

    def __init__(self, bench: Bench, args: argparse.Namespace, name: str, pool: bool = True) -> None:
        self.bench, self.args, self.name, self.pool = bench, args, name, pool
        self.topology = replace(bench.topology(name), tenant_groups=args.tenant_groups,
                                pinned_groups=_pinned_groups(args.tenant_groups))
        self.results = Results(bench.bootstrap, self.topology)
        self.processes: list[subprocess.Popen[bytes]] = []

    async def __aenter__(self) -> FairnessRun:
        stack, args = self.bench.stack, self.args
        profile = stack.workdir / f"{self.name}-profile.json"
        profile.write_text(json.dumps({"base": "clean", "slots": args.fairness_slots, "models": {
            "mock-small": {"latency": args.fairness_latency}, "mock-large": {"latency": args.long_latency}}}))
        self.mock = spawn_mock(stack, f"{self.name}-mock", ["--profile", str(profile)])
        await ensure_topics(KafkaConnection(bootstrap=self.bench.bootstrap), self.topology.all_topics())
        await self.results.consumer.start()
        in_flight = str(max(1, args.fairness_slots // args.fairness_workers))
        for n in range(1, args.fairness_workers + 1):
            env = worker_env(self.bench.bootstrap, self.topology.prefix, self.mock.url,
                             stack.workdir / f"{self.name}-data-{n}", int(in_flight), self.bench.partitions)
            env.update({"STREAMPROC_ADAPTIVE_MIN_IN_FLIGHT": in_flight,
                        "STREAMPROC_ADAPTIVE_INITIAL_IN_FLIGHT": in_flight, "STREAMPROC_LLM_HEDGE_RATIO": "0",
                        "STREAMPROC_RETRY_BUDGET_MIN": "100000",
                        "STREAMPROC_LLM_TIMEOUT_S": str(max(60.0, 3 * args.long_latency)),
                        "STREAMPROC_WORKER_METRICS_PORT": str(free_port()),
                        "STREAMPROC_TENANT_GROUPS": str(args.tenant_groups),
                        "STREAMPROC_TENANT_GROUP_OF": json.dumps(dict(self.topology.pinned_groups))})
            if not self.pool:
                env["STREAMPROC_LONG_REQUEST_TOKENS"] = "0"
            self.processes.append(stack.spawn(f"{self.name}-worker-{n}", [sys.executable, "-m", "streamproc",
                                                                          "worker"], env))
        # every worker in the group before the warm-up, or a rebalance for a late one lands in the measured run
        await formed(self.bench.bootstrap, env["STREAMPROC_APP_ID"], args.fairness_workers, 180)
        warm = Batch([request(f"{self.name}-warm", i, Tenancy("warm-up"))
                      for i in range(2 * self.bench.partitions)])
        await self.submit(warm)
        await self.results.wait_for(warm.ids, 180, f"{self.name}: warm-up")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.results.consumer.stop()
        for process in self.processes:
            self.bench.stack.stop(process)
        self.bench.stack.stop(self.mock.process)

    async def submit(self, batch: Batch) -> Batch:
        batch.submitted = await produce(self.bench.bootstrap, self.topology, batch.requests)
        return batch

    async def wait(self, batch: Batch) -> list[float]:
        await self.results.wait_for(batch.ids, 120 + 2 * len(batch.requests), f"{self.name}: {len(batch.requests)}")
        return self.results.done_s(batch)


def _pinned_groups(groups: int) -> dict[str, int]:
    """A and B in groups of their own when there are two or more (hashed, both names fall in one of two)."""
    return {"team-a": 0, "team-b": 1} if groups > 1 else {}


def completion_bound_s(count: int, capacity_per_s: float) -> float:
    """The issue's bound on a small batch beside a flood: 1.5 x (its count / half the server's capacity) + 5 s."""
    return B_SLACK * count / (capacity_per_s / 2) + B_EXTRA_S


def _batch(name: str, count: int, tenancy: Tenancy) -> Batch:
    return Batch([request(name, i, tenancy) for i in range(count)])


def _even_batch(name: str, count: int, tenancy: Tenancy, partitions: int) -> Batch:
    """A batch whose request ids spread evenly over the partitions (the first ids that fill each partition's part),
    so a figure does not hang on which partitions each worker was assigned: 200 ids taken in order put 85 to 115
    on one of two workers, which moved the last result by a second."""
    per_partition = Counter[int]()
    requests: list[InferenceRequest] = []
    i = 0
    while len(requests) < count:
        candidate = request(name, i, tenancy)
        partition = partition_of(candidate.request_id, partitions)
        if per_partition[partition] < -(-count // partitions):
            per_partition[partition] += 1
            requests.append(candidate)
        i += 1
    return Batch(requests)


def row(name: str, result: str, target: str, ok: bool) -> tuple[str, str, str, str]:
    return name, result, target, "ok" if ok else "MISSED"


async def tenants(bench: Bench, args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    """Figure 1: A's flood alone; A's flood with B's batch 10 s in."""
    async with FairnessRun(bench, args, "a-alone") as run:
        alone = await run.wait(await run.submit(_batch("a", args.flood, Tenancy("team-a"))))
    async with FairnessRun(bench, args, "a-and-b") as run:
        flood = await run.submit(_batch("a", args.flood, Tenancy("team-a")))
        await asyncio.sleep(max(0.0, flood.submitted + B_DELAY_S - time.time()))
        small = await run.submit(_batch("b", args.small, Tenancy("team-b")))
        b_done = await run.wait(small)
        a_done = await run.wait(flood)
    bound = completion_bound_s(args.small, args.fairness_slots / args.fairness_latency)
    a_alone_rate, a_rate = args.flood / alone[-1], args.flood / a_done[-1]
    both_rate = (args.flood + args.small) / max(a_done[-1], b_done[-1] + small.submitted - flood.submitted)
    print(f"tenants: A alone {alone[-1]:.1f}s ({a_alone_rate:.1f}/s); with B: A's last {a_done[-1]:.1f}s "
          f"({a_rate:.1f}/s), B's first {b_done[0]:.1f}s, last {b_done[-1]:.1f}s after its submission", flush=True)
    return [row("B's completion (s)", f"{b_done[-1]:.1f}", f"<= {bound:.1f}", b_done[-1] <= bound),
            row("A's throughput / A alone", f"{a_rate / a_alone_rate:.2f}", f">= {TARGET_A_THROUGHPUT}",
                a_rate / a_alone_rate >= TARGET_A_THROUGHPUT),
            row("A's and B's throughput / A alone", f"{both_rate / a_alone_rate:.2f}",
                f">= {TARGET_A_THROUGHPUT}", both_rate / a_alone_rate >= TARGET_A_THROUGHPUT)]


async def priorities(bench: Bench, args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    """Figure 2: the high batch alone; right behind the low flood (the flood is not waited for)."""
    tenancy = Tenancy(args.priority_tenant, "high")
    async with FairnessRun(bench, args, "high-alone") as run:
        alone = await run.wait(await run.submit(_even_batch("high", args.small, tenancy, bench.partitions)))
    async with FairnessRun(bench, args, "high-behind-low") as run:
        await run.submit(_batch("low", args.flood, Tenancy(args.priority_tenant, "low")))
        behind = await run.wait(await run.submit(_even_batch("high", args.small, tenancy, bench.partitions)))
    ratio = behind[-1] / alone[-1]
    print(f"priorities: high alone last {alone[-1]:.1f}s; behind the low flood first {behind[0]:.1f}s, last "
          f"{behind[-1]:.1f}s", flush=True)
    return [row("high's first result (s)", f"{behind[0]:.1f}", f"<= {TARGET_HIGH_FIRST_S:g}",
                behind[0] <= TARGET_HIGH_FIRST_S),
            row("high's last / alone", f"{ratio:.2f} ({behind[-1]:.1f}s / {alone[-1]:.1f}s)",
                f"<= {TARGET_HIGH_LAST}", ratio <= TARGET_HIGH_LAST)]


def _p99(values: list[int]) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])


def _tokens(result: InferenceResult) -> int:
    return int(json.loads(result.response_json).get("usage", {}).get("total_tokens", 0))


async def long_requests(bench: Bench, args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    """Figure 3: the short ones alone; the mix with the pool; the mix without it."""
    tenancy = Tenancy()
    shorts = {i for i in range(args.mix) if i % LONG_SHARE != LONG_SHARE // 2}
    measured: dict[str, tuple[float, float]] = {}  # run -> (short p99 ms, tokens/s)
    for name, with_longs, pool in (("short-alone", False, True), ("mix-pool", True, True),
                                   ("mix-no-pool", True, False)):
        async with FairnessRun(bench, args, name, pool) as run:
            batch = Batch([request("mix", i, tenancy, long=with_longs and i not in shorts) for i in range(args.mix)
                           if with_longs or i in shorts])
            done = await run.wait(await run.submit(batch))
            results = [run.results.results[i] for i in batch.ids]
            short_latency = [r.latency_ms for r in results if r.model == "mock-small"]
            measured[name] = (_p99(short_latency), sum(_tokens(r) for r in results) / done[-1])
            print(f"{name}: {len(results)} results in {done[-1]:.1f}s; short p99 {measured[name][0]:.0f} ms, "
                  f"{measured[name][1]:.0f} tokens/s", flush=True)
    p99_ratio = measured["mix-pool"][0] / measured["short-alone"][0]
    tokens_ratio = measured["mix-pool"][1] / measured["mix-no-pool"][1]
    return [row("short p99 / without long", f"{p99_ratio:.2f} (no pool: "
                f"{measured['mix-no-pool'][0] / measured['short-alone'][0]:.2f})", f"<= {TARGET_SHORT_P99}",
                p99_ratio <= TARGET_SHORT_P99),
            row("tokens/s / without the pool", f"{tokens_ratio:.2f}", f">= {TARGET_TOKENS}",
                tokens_ratio >= TARGET_TOKENS)]


FIGURES = {"tenants": tenants, "priorities": priorities, "long": long_requests}


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    bench = open_bench(args, stack)
    rows: list[tuple[str, str, str, str]] = []
    for name in args.figures.split(","):
        rows += await FIGURES[name](bench, args)
    print(table(rows))
    print(f"({args.fairness_workers} workers, {args.fairness_slots} slots of {args.fairness_latency:g}s; "
          f"benchmark took {time.monotonic() - started:.0f}s)")


def add_arguments(parser: argparse._ActionsContainer) -> None:
    parser.add_argument("--figures", default="tenants,priorities,long",
                        help="which figures, comma-separated [tenants,priorities,long]")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies the issue's counts (flood 20,000, small batch 200, mix 4,000) [1]")
    parser.add_argument("--flood", type=int, help="tenant A's (and the low) flood [20000 x scale]")
    parser.add_argument("--small", type=int, help="tenant B's (and the high) batch [200 x scale]")
    parser.add_argument("--mix", type=int, help="requests of the long-requests mix [4000 x scale]")
    parser.add_argument("--fairness-workers", type=int, default=2, help="workers [2]")
    parser.add_argument("--fairness-slots", type=int, default=32, help="the mock's slots [32]")
    parser.add_argument("--fairness-latency", type=float, default=1.0, help="a short call's latency, s [1]")
    parser.add_argument("--long-latency", type=float, default=10.0, help="a long generation's latency, s [10]")
    parser.add_argument("--tenant-groups", type=int, default=2,
                        help="the workers' STREAMPROC_TENANT_GROUPS, team-a and team-b pinned apart; 1: every tenant "
                             "on one topic per priority [2]")
    parser.add_argument("--priority-tenant", default="team-a",
                        help="the tenant of the low flood and the high batch [team-a]")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.flood = args.flood if args.flood is not None else round(20_000 * args.scale)
    args.small = args.small if args.small is not None else round(200 * args.scale)
    args.mix = args.mix if args.mix is not None else round(4_000 * args.scale)
    if (min(args.flood, args.small, args.fairness_workers, args.fairness_slots, args.tenant_groups) < 1
            or args.mix < LONG_SHARE):
        parser.error(f"the counts, workers, slots and groups must be at least 1, --mix at least {LONG_SHARE}")
    if args.fairness_latency <= 0 or args.long_latency <= 0:
        parser.error("--fairness-latency and --long-latency must be positive")
    if unknown := set(args.figures.split(",")) - set(FIGURES):
        parser.error(f"unknown figures {', '.join(sorted(unknown))} (of {', '.join(FIGURES)})")


def main(argv: list[str] | None = None) -> None:
    suite_main("python -m benchmarks.fairness", __doc__, add_arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()
