"""``scripts/bench provider-batch``: one batch both ways, the provider-batch route and synchronous calls.

Starts a private Kafka broker, then for each way a fresh mock LLM server (``--profile realistic``, the same seed,
``--batch-seconds`` for a provider batch's run time) and one worker over its own topics, with every request on the
requests topic before the worker starts. The route's worker has ``STREAMPROC_MODEL_ROUTES={"mock-small":
"provider-batch"}`` (OpenAI's Files and Batches, or Anthropic's Message Batches with ``--api anthropic``); the other
calls the model one request at a time. Both are priced at ``--prices`` (the route is charged the providers' batch
discount, half).

Printed for each way: wall time (the worker's start to the last outcome: both include a worker's start-up), LLM
requests made (calls, or lines of provider batches), those answered 200 (billed), the tokens the mock answered and
their cost at the prices, failed attempts resubmitted (a failure event that was not terminal: a retried call, or a
line put into a new provider batch), requests answered and the terminal failures by code. The exit code is 0 when
both runs converged (every request has a result or a terminal failure), 1 when one did not, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.guards import Outcomes, follow
from benchmarks.pipeline import (
    Bench,
    BenchError,
    Stack,
    chat_request,
    open_bench,
    produce_requests,
    spawn_mock,
    suite_main,
    table,
    worker_env,
)
from streamproc.app.topics import ensure_topics
from streamproc.core.provider_batch_deadline import Way
from streamproc.core.spend_cap import way_price
from streamproc.kafka.connection import KafkaConnection

MODEL = "mock-small"
WAYS = ("route", "calls")


@dataclass(frozen=True)
class WayRun:
    """What one way of running the batch cost and gave."""

    way: str
    requests: int
    outcomes: Outcomes
    stats: dict[str, Any]  # the mock's /stats at the end
    prices: tuple[float, float]  # USD per million prompt / completion tokens, as charged to this way

    @property
    def wall_s(self) -> float:
        return self.outcomes.last_outcome - self.outcomes.spawned

    @property
    def made(self) -> int:
        return int(self.stats["calls"])  # the mock counts a provider batch's lines as calls

    @property
    def billed(self) -> int:
        return int(self.stats["by_status"].get("200", 0))

    @property
    def tokens(self) -> tuple[int, int]:
        return int(self.stats["tokens"]["prompt"]), int(self.stats["tokens"]["completion"])

    @property
    def cost_usd(self) -> float:
        prompt, completion = self.tokens
        return (prompt * self.prices[0] + completion * self.prices[1]) / 1_000_000

    @property
    def resubmitted(self) -> int:
        return sum(self.outcomes.retried.values())

    @property
    def provider_batches(self) -> int:
        by_api = self.stats["batches"]
        return sum(int(by_api[api]["created"]) for api in ("openai", "anthropic"))

    def terminal(self) -> str:
        codes = self.outcomes.terminal_by_code()
        return ", ".join(f"{layer} {code} {n}" for (layer, code), n in codes.most_common()) or "none"


def rows(route: WayRun, calls: WayRun) -> list[tuple[str, str, str, str]]:
    """The report: measurement, the route's figure, the calls' figure, the route's ÷ the calls'."""

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "-"

    def row(name: str, a: float, b: float, fmt: str = "{:,.0f}") -> tuple[str, str, str, str]:
        return name, fmt.format(a), fmt.format(b), ratio(a, b)

    return [
        row("wall time, s", route.wall_s, calls.wall_s, "{:.1f}"),
        row("LLM requests made (calls or lines)", route.made, calls.made),
        row("  of them answered 200 (billed)", route.billed, calls.billed),
        row("prompt tokens", route.tokens[0], calls.tokens[0]),
        row("completion tokens", route.tokens[1], calls.tokens[1]),
        row("cost, USD", route.cost_usd, calls.cost_usd, "{:.4f}"),
        row("failed attempts resubmitted", route.resubmitted, calls.resubmitted),
        row("requests answered", len(route.outcomes.results), len(calls.outcomes.results)),
        row("requests ended more than once", len(route.outcomes.multiple), len(calls.outcomes.multiple)),
    ]


async def one_way(bench: Bench, args: argparse.Namespace, way: str) -> WayRun:
    stack = bench.stack
    topology = bench.topology(way)
    await ensure_topics(KafkaConnection(bootstrap=bench.bootstrap), topology.all_topics())
    requests = [chat_request(f"{way}-{bench.run_id}", i) for i in range(args.pb_requests)]
    await produce_requests(bench.bootstrap, topology.requests, requests)
    mock = spawn_mock(stack, f"mock-{way}", ["--profile", "realistic", "--seed", str(args.pb_seed),
                                             "--batch-seconds", f"{args.batch_seconds:g}"])
    env = worker_env(bench.bootstrap, topology.prefix, mock.url, stack.workdir / f"{way}-data", bench.in_flight,
                     bench.partitions)
    prompt_price, completion_price = args.prices
    env["STREAMPROC_MODEL_PRICES"] = json.dumps({MODEL: [prompt_price, completion_price]})
    charged = (prompt_price, completion_price)
    if way == "route":
        env.update({"STREAMPROC_MODEL_ROUTES": json.dumps({MODEL: "provider-batch"}),
                    "STREAMPROC_PROVIDER_BATCH_API": args.api,
                    "STREAMPROC_PROVIDER_BATCH_MAX_REQUESTS": str(args.gather),
                    "STREAMPROC_PROVIDER_BATCH_MAX_AGE_S": "2",
                    "STREAMPROC_PROVIDER_BATCH_POLL_S": "0.5"})
        charged = way_price(charged, Way.PROVIDER_BATCH)
    name = f"worker-{way}"
    workers: list[subprocess.Popen[bytes]] = []

    def spawn() -> subprocess.Popen[bytes]:
        workers.append(stack.spawn(name, [sys.executable, "-m", "streamproc", "worker"], env))
        return workers[0]

    print(f"{way}: {args.pb_requests} requests", flush=True)
    outcomes = Outcomes({r.request_id for r in requests}, time.time())
    try:
        await follow(bench.bootstrap, topology, outcomes, spawn, args.pb_timeout_s,
                     bench.sampler("worker", mock.process.pid))
        stats = mock.stats()
    except (BenchError, OSError, ValueError) as exc:
        raise BenchError(f"{way}: {exc}\n--- worker log:\n{stack.log_tail(name)}") from exc
    finally:
        for process in workers:
            stack.stop(process)
        stack.stop(mock.process)
    done = WayRun(way, args.pb_requests, outcomes, stats, charged)
    extra = f" in {done.provider_batches} provider batches" if way == "route" else ""
    print(f"  {len(outcomes.results)} answered, {done.made} LLM requests{extra}, {done.wall_s:.1f} s; "
          f"terminal: {done.terminal()}", flush=True)
    return done


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    bench = open_bench(args, stack)
    route, calls = [await one_way(bench, args, way) for way in WAYS]
    print(table(rows(route, calls), ("measurement", f"route ({args.api})", "synchronous calls", "route / calls")))
    print(f"terminal failures, route: {route.terminal()}\nterminal failures, calls: {calls.terminal()}")
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")


def _prices(text: str) -> tuple[float, float]:
    prompt, _, completion = text.partition(",")
    return float(prompt), float(completion)


def add_arguments(parser: argparse._ActionsContainer) -> None:
    parser.add_argument("--pb-requests", type=int, default=2000, help="requests of the batch [2000]")
    parser.add_argument("--pb-seed", type=int, default=31, help="the mock's seed, both ways [31]")
    parser.add_argument("--api", choices=("openai", "anthropic"), default="openai",
                        help="the provider batch API the route speaks [openai]")
    parser.add_argument("--gather", type=int, default=250, help="requests per provider batch at most [250]")
    parser.add_argument("--batch-seconds", type=float, default=3.0,
                        help="how long the mock takes to run a provider batch, seconds [3]")
    parser.add_argument("--prices", type=_prices, default=(0.15, 0.6), metavar="PROMPT,COMPLETION",
                        help="USD per million prompt and completion tokens at the full price [0.15,0.6]")
    parser.add_argument("--pb-timeout-s", type=float, default=900.0,
                        help="give up on a way that has not converged after this long, seconds [900]")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.pb_requests < 1 or args.gather < 1:
        parser.error("--pb-requests and --gather must be positive")
    if args.batch_seconds <= 0:
        parser.error("--batch-seconds must be positive")


def main(argv: list[str] | None = None) -> None:
    suite_main("python -m benchmarks.provider_batch", __doc__, add_arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()
