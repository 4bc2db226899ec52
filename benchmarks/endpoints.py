"""``scripts/bench endpoints``: one model on two deployments (issue 33), all figures from one run.

Starts a private Kafka broker, then for each run two fresh mock LLM servers (``--profile clean``, fixed latency),
the worker given both as the deployments of ``mock-small`` in a model list (``STREAMPROC_MODELS_FILE``), and the
run's requests on its own topics before the worker starts:

1. healthy: both deployments at ``--latency`` seconds; the wall time of the batch.
2. outage: the same, and once a third of the batch was called, the second deployment answers 503 to everything for
   ``--outage-s`` seconds (``POST /control/outage``). Targets: every request succeeds, none through a retry tier
   (no failure event: its calls went on to the other deployment within their attempt, so none waited for the
   outage's end), and the wall time at most 1.3 x the healthy run's.
3. slow: the second deployment twice as slow. Target: it answers at most 40 % of the calls.

Wall time runs from the first LLM call to the last result (the worker's start-up is not counted). A missed target
is a warning; the exit code is 0 when every run converged, 1 when one did not, 130 on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass

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
    watch_results,
    worker_env,
)
from streamproc.app.topics import ensure_topics
from streamproc.core.vocabulary import FailureLayer
from streamproc.devstack.broker import free_port
from streamproc.kafka.connection import KafkaConnection
from streamproc.mockllm import MockLLMProcess

TARGET_OUTAGE_TIME_RATIO = 1.3
TARGET_SLOW_SHARE = 0.4
MODEL = "mock-small"
SECOND = f"{MODEL}@2"  # the deployment that has the outage, or is slow


def model_list(urls: list[str]) -> str:
    """The model list naming each mock as a deployment of ``mock-small``, in LiteLLM's format."""
    entries = "".join(f"  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
                      f"      api_base: {url}\n" for url in urls)
    return f"model_list:\n{entries}"


@dataclass(frozen=True)
class EndpointsRun:
    """What one run saw: its wall time, the results by deployment, failure events and results not first tries."""

    name: str
    requests: int
    results: int
    seconds: float
    by_deployment: dict[str, int]
    failure_events: int
    retried: int  # results after more than one attempt
    outage_window: tuple[float, float] | None = None  # seconds after the first call
    last_result_s: float = 0.0  # seconds after the first call

    @property
    def second_share(self) -> float:
        return self.by_deployment.get(SECOND, 0) / max(1, sum(self.by_deployment.values()))

    def describe(self) -> str:
        deployments = ", ".join(f"{key} {count}" for key, count in sorted(self.by_deployment.items()))
        text = (f"{self.name}: {self.results}/{self.requests} results in {self.seconds:.1f}s; answered by "
                f"{deployments}; failure events {self.failure_events}, results after a retry {self.retried}")
        if self.outage_window is not None:
            start, end = self.outage_window
            text += f"; outage {start:.1f}-{end:.1f}s, last result at {self.last_result_s:.1f}s"
        return text


def verdicts(healthy: EndpointsRun, outage: EndpointsRun, slow: EndpointsRun) -> list[tuple[str, str, str, str]]:
    """The report's rows: measurement, result, target, ok or MISSED."""

    def row(name: str, result: str, target: str, ok: bool) -> tuple[str, str, str, str]:
        return name, result, target, "ok" if ok else "MISSED"

    ratio = outage.seconds / healthy.seconds
    return [
        row("outage: requests that succeeded", f"{outage.results}/{outage.requests}", "all",
            outage.results == outage.requests),
        row("outage: requests through a retry tier", f"{outage.failure_events + outage.retried}", "0",
            outage.failure_events + outage.retried == 0),
        row("outage: wall time / healthy", f"{ratio:.2f} ({outage.seconds:.1f}s / {healthy.seconds:.1f}s)",
            f"<= {TARGET_OUTAGE_TIME_RATIO}", ratio <= TARGET_OUTAGE_TIME_RATIO),
        row("slow: calls the slow deployment answered", f"{slow.second_share:.0%}", f"<= {TARGET_SLOW_SHARE:.0%}",
            slow.second_share <= TARGET_SLOW_SHARE),
    ]


async def one_run(bench: Bench, name: str, requests: int, latencies: tuple[float, float],
                  outage_s: float | None) -> EndpointsRun:
    """Two deployments at ``latencies``; with ``outage_s``, the second has an outage from a third of the batch."""
    stack = bench.stack
    mocks = [spawn_mock(stack, f"{name}-mock-{n}", ["--profile", "clean", "--latency", f"{latency:g}"])
             for n, latency in enumerate(latencies, start=1)]
    models_file = stack.workdir / f"{name}-models.yaml"
    models_file.write_text(model_list([mock.url for mock in mocks]), encoding="utf-8")
    topology = bench.topology(name)
    await ensure_topics(KafkaConnection(bootstrap=bench.bootstrap), topology.all_topics())
    await produce_requests(bench.bootstrap, topology.requests, (chat_request(name, i) for i in range(requests)))
    env = worker_env(bench.bootstrap, topology.prefix, mocks[0].url, stack.workdir / f"{name}-data",
                     bench.in_flight, bench.partitions)
    env.update({"STREAMPROC_MODELS_FILE": str(models_file), "STREAMPROC_WORKER_METRICS_PORT": str(free_port())})
    worker: list[subprocess.Popen[bytes]] = []
    window: list[float] = []
    outage = (asyncio.create_task(_outage_at_a_third(mocks, requests, outage_s, window)) if outage_s is not None
              else None)

    def spawn() -> subprocess.Popen[bytes]:
        process = stack.spawn(f"{name}-worker", [sys.executable, "-m", "streamproc", "worker"], env)
        worker.append(process)
        return process

    try:
        observed, _ = await watch_results(bench.bootstrap, topology.results,
                                          [topology.failed(layer) for layer in FailureLayer], requests, spawn,
                                          120 + requests / 10, bench.sampler("worker", mocks[0].process.pid))
    except BenchError as exc:
        raise BenchError(f"{name}: {exc}\n--- worker log:\n{stack.log_tail(f'{name}-worker')}") from exc
    finally:
        if outage is not None:
            outage.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await outage
        for process in worker:
            stack.stop(process)
        for mock in mocks:
            stack.stop(mock.process)
    first = observed.first_call
    results = observed.results.values()
    return EndpointsRun(
        name, requests, len(observed.results), observed.seconds,
        dict(Counter(result.deployment or "" for result in results)), observed.failures,
        sum(1 for result in results if result.attempts > 1),
        (window[0] - first, window[1] - first) if window else None,
        max(result.completed_ms for result in results) / 1000 - first)


async def _outage_at_a_third(mocks: list[MockLLMProcess], requests: int, seconds: float,
                             window: list[float]) -> None:
    """Once the mocks were called for a third of the requests, an outage of ``seconds`` at the second one."""
    while await _calls(mocks) < requests / 3:  # the mocks' counters: polled, nothing to wait on  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    await asyncio.to_thread(mocks[1].post, "/control/outage", {"seconds": seconds})
    started = time.time()
    window.extend((started, started + seconds))
    print(f"  outage of {seconds:g}s at {SECOND}", flush=True)


async def _calls(mocks: list[MockLLMProcess]) -> int:
    """The calls the mocks have been sent so far."""
    total = 0
    for mock in mocks:
        total += int((await asyncio.to_thread(mock.stats))["calls"])
    return total


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    bench = open_bench(args, stack)
    latency = args.endpoints_latency
    runs = []
    for name, latencies, outage_s in (("healthy", (latency, latency), None),
                                      ("outage", (latency, latency), args.outage_seconds),
                                      ("slow", (latency, 2 * latency), None)):
        done = await one_run(bench, name, args.endpoints_requests, latencies, outage_s)
        print(done.describe(), flush=True)
        runs.append(done)
    healthy, outage, slow = runs
    print(table(verdicts(healthy, outage, slow)))
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")


def add_arguments(parser: argparse._ActionsContainer) -> None:
    parser.add_argument("--endpoints-requests", type=int, default=3000, help="requests of each run [3000]")
    parser.add_argument("--endpoints-latency", type=float, default=1.0,
                        help="latency of the healthy deployments, seconds [1]")
    parser.add_argument("--outage-seconds", type=float, default=60.0,
                        help="the second deployment's outage, seconds [60]")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.endpoints_requests < 3:
        parser.error("--endpoints-requests must be at least 3")
    if args.endpoints_latency <= 0 or args.outage_seconds <= 0:
        parser.error("--endpoints-latency and --outage-seconds must be positive")


def main(argv: list[str] | None = None) -> None:
    suite_main("python -m benchmarks.endpoints", __doc__, add_arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()
