"""``scripts/bench variants``: the worker's CPU per request under settings variants, alternating in one run (issue 16).

These 2-core machines are shared and noisy, so one run of each variant is no comparison. Each round runs every
variant's worker over its own CPU-bound batch (mock latency 0, every request on the topic before the worker
starts, as in ``scripts/bench pipeline``), in an order that rotates from round to round, then the bare
aiokafka -> httpx -> aiokafka loop (``benchmarks.baseline``) over the same requests. The summary gives each
variant's median worker CPU per request and throughput over the rounds, and both as a multiple of the bare
loop's median, next to how many cores other jobs took.

``--variant LABEL:NAME=VALUE,...`` names a variant by its ``STREAMPROC_*`` settings (``LABEL:`` alone: the
defaults). ``--profile DIR`` runs each variant once more, unreported, under py-spy (installed on first use),
writes DIR/LABEL.txt (collapsed stacks, for flamegraph.pl or speedscope) and prints the worker's CPU by
component.
"""

from __future__ import annotations

import argparse
import collections
import collections.abc
import importlib.util
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import pipeline
from benchmarks.pipeline import (
    Bench,
    RunReport,
    Stack,
    chat_request,
    produce_requests,
    setting,
    suite_main,
    table,
)
from streamproc.app.topics import ensure_topics
from streamproc.core.topology import Topology
from streamproc.kafka.connection import KafkaConnection


@dataclass(frozen=True)
class Variant:
    label: str
    settings: dict[str, str] = field(default_factory=dict)


def parse_variant(text: str) -> Variant:
    """``LABEL:NAME=VALUE,NAME=VALUE`` (names with or without the ``STREAMPROC_`` prefix)."""
    label, _, assignments = text.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", label):
        raise argparse.ArgumentTypeError(f"{text!r}: a variant is LABEL:NAME=VALUE,... with a plain label")
    return Variant(label, dict(setting(assignment) for assignment in filter(None, assignments.split(","))))


# ---- profiles ------------------------------------------------------------------------------------------------

_COMPONENTS = {"httpx": "HTTP: httpx", "httpcore": "HTTP: httpcore+h11+anyio", "h11": "HTTP: httpcore+h11+anyio",
               "anyio": "HTTP: httpcore+h11+anyio", "sniffio": "HTTP: httpcore+h11+anyio",
               "httpx_aiohttp": "HTTP: aiohttp", "aiohttp": "HTTP: aiohttp", "yarl": "HTTP: aiohttp",
               "multidict": "HTTP: aiohttp", "faust": "faust+mode", "mode": "faust+mode", "aiokafka": "aiokafka",
               "rocksdict": "faust+mode"}
_FRAME_FILE = re.compile(r"\(([^:()]+):\d+\)$")


def _component(frames: list[str]) -> str:
    """Whom a sample's CPU is for: the innermost frame outside the standard library and asyncio."""
    for frame in reversed(frames):
        if frame.startswith(("Handle._run ", "BaseEventLoop._run_once ", "Loop.run_forever ")):
            break  # the loop's own work, not called by a library
        match = _FRAME_FILE.search(frame)
        path = match.group(1) if match else ""
        if path.startswith("streamproc/"):
            return "/".join(path.split("/")[:2])
        top = path.split("/")[0] if "/" in path else ""
        if top and top not in ("asyncio", "json", "concurrent", "logging", "email", "http", "urllib"):
            return _COMPONENTS.get(top, top)
    return "event loop and standard library"


def cpu_by_component(collapsed: Path) -> list[tuple[str, float]]:
    """Shares of the busy samples of a py-spy ``--format raw`` file; waits in the selector and imports left out
    (py-spy cannot always tell a thread sleeping in epoll from one running)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        frames = stack.split(";")
        if "select (selectors.py" in frames[-1] or any("importlib._bootstrap" in f for f in frames):
            continue
        counts[_component(frames)] += int(samples)
    total = sum(counts.values()) or 1
    return [(name, count / total) for name, count in counts.most_common()]


def py_spy() -> str:
    """The py-spy executable next to this python, installed with pip on first use."""
    found = Path(sys.executable).with_name("py-spy")
    if not found.exists() and importlib.util.find_spec("py_spy") is None:
        print("installing py-spy for --profile ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "py-spy"],
                       check=True)
    return str(found) if found.exists() else (shutil.which("py-spy") or "py-spy")


def profiler(output: Path) -> list[str]:
    """A command prefix that records the command under py-spy; on SIGTERM (the benchmark stopping the
    worker) it interrupts py-spy, which then writes the file and stops the worker."""
    script = 'spy="$1"; out="$2"; shift 2; "$spy" record -f raw -r 100 -o "$out" -- "$@" & pid=$!; ' \
             'trap "kill -INT $pid" TERM INT; wait $pid; wait $pid'
    return ["sh", "-c", script, "profile", py_spy(), str(output)]


# ---- the runs ------------------------------------------------------------------------------------------------


async def one_batch(bench: Bench, variant: Variant, tag: str, requests: int,
                    wrap: list[str] | None = None) -> tuple[RunReport, Topology]:
    """The variant's worker over a fresh CPU-bound batch; returns its report and the batch's topology."""
    topology = bench.topology(f"{variant.label}-{tag}")
    await ensure_topics(KafkaConnection(bootstrap=bench.bootstrap), topology.all_topics())
    llm_url, mock_pid = bench.zero_latency_mock()
    await produce_requests(bench.bootstrap, topology.requests, (chat_request(tag, i) for i in range(requests)))
    report = await bench.pipeline(f"worker-{variant.label}-{tag}", topology, llm_url, mock_pid, requests,
                                  120 + requests / 20, False, variant.settings, wrap)
    return report, topology


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    variants: list[Variant] = args.variant or [Variant("defaults")]
    bootstrap, broker_pid = (args.bootstrap, None) if args.bootstrap else stack.start_broker()
    print(f"broker {bootstrap}; work dir {stack.workdir}; variants "
          + "; ".join(f"{v.label} {v.settings or '(defaults)'}" for v in variants), flush=True)
    bench = Bench(stack, bootstrap, time.strftime("%Y%m%d%H%M%S"), args.in_flight, args.partitions, broker_pid)
    if args.warmup:
        await bench.warm_up(args.warmup)
    runs: dict[str, list[RunReport]] = {v.label: [] for v in variants}
    bare: list[RunReport] = []
    for round_ in range(args.rounds):
        shift = round_ % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            report, topology = await one_batch(bench, variant, f"r{round_}", args.cpu_requests)
            runs[variant.label].append(report)
            print(f"round {round_ + 1}: {report.describe()}", flush=True)
        llm_url, mock_pid = bench.zero_latency_mock()
        baseline = await bench.baseline(f"baseline-r{round_}", topology, llm_url, mock_pid, args.cpu_requests,
                                        120 + args.cpu_requests / 20)
        bare.append(baseline)
        print(f"round {round_ + 1}: {baseline.describe()}", flush=True)
    summarise(args, runs, bare)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        for variant in variants:
            output = args.profile / f"{variant.label}.txt"
            await one_batch(bench, variant, "profile", args.cpu_requests, profiler(output))
            print(f"\nworker CPU by component, {variant.label} ({output}; py-spy's own cost included):")
            for name, share in cpu_by_component(output):
                if share >= 0.005:
                    print(f"  {share * 100:5.1f} %  {name}")
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")


def summarise(args: argparse.Namespace, runs: dict[str, list[RunReport]], bare: list[RunReport]) -> None:
    bare_cpu = statistics.median(r.cpu_ms_per_request for r in bare)
    bare_rate = statistics.median(r.observed.rate for r in bare)
    rows = [("bare aiokafka -> httpx -> aiokafka loop", f"{bare_cpu:.2f} ({_spread(bare, _cpu)})",
             f"{bare_rate:.0f}", "1", f"{statistics.median(r.cores.get('other', 0.0) for r in bare):.2f}")]
    for label, reports in runs.items():
        cpu = statistics.median(r.cpu_ms_per_request for r in reports)
        rate = statistics.median(r.observed.rate for r in reports)
        rows.append((f"worker: {label}", f"{cpu:.2f} ({_spread(reports, _cpu)})", f"{rate:.0f}",
                     f"{cpu / bare_cpu:.2f} x CPU, {rate / bare_rate:.2f} x rate",
                     f"{statistics.median(r.cores.get('other', 0.0) for r in reports):.2f}"))
    print(f"\n{args.rounds} rounds of {args.cpu_requests} CPU-bound requests (mock latency 0), in flight "
          f"{args.in_flight}; medians, range in brackets")
    print(table(rows, ("run", "CPU ms/request", "req/s", "vs the bare loop", "other cores")))
    for label, reports in runs.items():
        for report in reports:
            if report.observed.duplicates or report.observed.failures or report.mock_calls < report.observed.expected:
                print(f"WARNING: {label}: {report.observed.duplicates} duplicates, {report.observed.failures} "
                      f"failure events, {report.mock_calls} LLM calls for {report.observed.expected} requests")


def _cpu(report: RunReport) -> float:
    return report.cpu_ms_per_request


def _spread(reports: list[RunReport], value: collections.abc.Callable[[RunReport], float]) -> str:
    values = [value(r) for r in reports]
    return f"{min(values):.2f}-{max(values):.2f}"


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """The variants suite's own options."""
    parser.add_argument("--variant", action="append", type=parse_variant, metavar="LABEL:NAME=VALUE,...",
                        help="a worker variant by its STREAMPROC_* settings (repeat; LABEL: alone = defaults)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every variant and the bare loop [3]")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="after the rounds, profile each variant once with py-spy into DIR")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    labels = [v.label for v in args.variant or []]
    if len(set(labels)) != len(labels):
        parser.error("--variant labels must differ")


def main(argv: list[str] | None = None) -> None:
    def arguments(parser: argparse.ArgumentParser) -> None:
        pipeline.add_arguments(parser)  # --cpu-requests (per batch) and --warmup
        add_arguments(parser)

    suite_main("python -m benchmarks.variants", __doc__, arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()

