"""``scripts/bench servers``: the worker against servers that do not say their limits, all figures from one run.

Starts a private Kafka broker (temporary data dir, free ports), then for each run a fresh mock LLM server:

1. strict, worker: 1,500 requests of the guards suite's mix (labels, summaries, questions, 5 % JSON Schema
   extractions) through the real pipeline (broker + one worker with its DEFAULT settings: no
   ``STREAMPROC_LLM_RPM``, the default 60 s ``STREAMPROC_LLM_TIMEOUT_S``) against ``mock-llm --profile strict
   --seed S`` (3,000 RPM over a one-second bucket, ``x-ratelimit-*`` only on 429s, hangs that never end,
   ~13 % faults on a first pass): the worker has to learn the limit and give up on hangs by itself.
2. strict, asyncio+tenacity: a plain client over the same requests (``httpx.AsyncClient``, a semaphore of 64,
   tenacity ``AsyncRetrying`` with ``wait_random_exponential(min=1, max=60)``, retrying timeouts, connection
   errors, 429 and 5xx up to 6 attempts, a 60 s timeout), against a fresh mock with the same seed.
3. strict, LiteLLM Router: ``litellm.Router`` with one deployment (``openai/mock-small`` at the mock),
   ``num_retries=5``, a ``RetryPolicy`` per exception type (5 for timeouts, 429s, 5xx and connection errors,
   0 for 400s), ``timeout=60``, a semaphore of 64; fresh mock, same seed. Skipped (with a warning) when
   litellm is not installed (``pip install -e .[bench]``; ``scripts/bench`` installs it on first use).
4. one slot, worker: 200 requests against ``mock-llm --profile clean --slots 1 --latency 0.2`` (one request
   served at a time, the rest queued, like a one-slot llama.cpp server).

Measures of runs 1-3: wall time from the first call to the last outcome; calls the mock received, and its
429 answers; the calls needed (those the mock's rate limiter admitted: every call but its own 429s); the
ideal time (calls needed / RPM); wall / ideal (target <= 1.10); the recoverable requests (every failed call
of theirs was a transport or service fault, per the mock's ``/stats?detail=1``) that did not end in a result
(target 0). Run 4: calls that timed out (failure events with a timeout code, target 0), throughput / slot
capacity (1 / the fixed service time, target >= 0.90), the worker's ``streamproc_adaptive_in_flight_limit``
at the end (from its ``/metrics``).

The plain clients (runs 2 and 3) run in a child process (``python -m benchmarks.servers client ...``) that
writes one record per request (start, end, result or error) to a JSON file. A missed target is a warning,
not a failure; a run that does not finish within ``--servers-deadline-s`` is reported with what it did by
then, and makes the exit code 1 (after the table); otherwise it is 0, and 130 on Ctrl-C or SIGTERM. The
common ``--in-flight`` does not apply: every worker runs with its default settings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.fleet_workers import ONE, Scenario, WorkerGroup, formed, play
from benchmarks.guards import NOT_ADMITTED, Batch, Outcomes, follow
from benchmarks.pipeline import (
    OTHER_LOAD_WARNING,
    ROOT,
    SAMPLE_EVERY_S,
    Bench,
    BenchError,
    Sampler,
    Stack,
    open_bench,
    produce_requests,
    spawn_mock,
    suite_main,
    table,
    worker_env,
)
from streamproc.app.topics import ensure_topics
from streamproc.core.events import InferenceRequest
from streamproc.core.vocabulary import FailureLayer
from streamproc.kafka.connection import KafkaConnection
from streamproc.mockllm import BUILTIN_PROFILES, FaultKind
from streamproc.mockllm.engine import OUTAGE, RATE_LIMITED
from streamproc.settings import DEFAULT_KAFKA_VERSION

TARGET_WALL_RATIO = 1.10
TARGET_UNRECOVERED = 0
TARGET_PACE_429_SHARE = 0.02  # 429s from the server's rate limiter: what the client's pace caused
TARGET_SLOT_TIMEOUTS = 0
TARGET_SLOT_FRACTION = 0.90
FALLBACK_RPM = 3000  # the strict profile's, for the stand-in used while this mock has no strict profile
MODEL = "mock-small"
CLIENT_TIMEOUT_S = 60.0
RETRIES = 5  # LiteLLM's num_retries; tenacity's stop_after_attempt(RETRIES + 1)
IN_FLIGHT_METRIC = "streamproc_adaptive_in_flight_limit"
HEDGED_METRIC = "streamproc_hedged_calls_total"
TIMELINE_STEP_S = 5.0
RECOVERABLE_LAYERS = frozenset({FailureLayer.TRANSPORT.value, FailureLayer.SERVICE.value})


# ---- pure helpers (tests/unit/test_bench_servers.py) --------------------------------------------------------


def outcome_layer(outcome: str) -> str | None:
    """The failure layer of one of the mock's call outcomes (its ``by_outcome`` names); None for ``ok``.

    Injected faults have their own layer (``config`` for account problems); of the mock's real checks, its
    rate limiter's 429 and an outage's 503 are service failures, the others (401, malformed body, unknown
    model, context window, body too large) are not worth a retry: ``business``.
    """
    if outcome == "ok":
        return None
    if outcome in (RATE_LIMITED, OUTAGE):
        return FailureLayer.SERVICE.value
    try:
        layer = FaultKind(outcome).layer
    except ValueError:
        return FailureLayer.BUSINESS.value
    return "config" if layer is None else layer.value


def is_recoverable(outcomes: Iterable[str]) -> bool:
    """True when every failed call of a request was a transport or service fault (or none failed)."""
    return all(layer is None or layer in RECOVERABLE_LAYERS for layer in map(outcome_layer, outcomes))


def admitted_calls(calls: int, by_outcome: Mapping[str, int]) -> int:
    """Calls the mock's rate limiter admitted: all but those answered before it (its own 429s, outages, ...)."""
    return calls - sum(n for outcome, n in by_outcome.items() if outcome in NOT_ADMITTED)


def per_request_outcomes(stats: Mapping[str, Any]) -> dict[str, list[str]]:
    """Request id -> the mock's outcome of each of its calls, from ``/stats?detail=1``."""
    return {str(rid): [str(o) for o in record.get("outcomes", [])]
            for rid, record in stats.get("per_request_id", {}).items()}


def metric_value(text: str, name: str) -> float | None:
    """The value of an unlabelled series in Prometheus text format, or None when it is absent."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == name:
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None


def timeout_count(failures: Mapping[tuple[str, str], int]) -> int:
    """Failed calls that timed out, from failure counts by (layer, error code)."""
    return sum(n for (layer, code), n in failures.items()
               if layer == FailureLayer.TRANSPORT.value and "timeout" in code)


@dataclass(frozen=True)
class StrictRun:
    """What one run against the strict server did, and the figures derived from it."""

    name: str
    ids: frozenset[str]
    results: frozenset[str]  # request ids that ended in a result
    first_call: float | None  # wall seconds; None when nothing was called
    finish_times: tuple[float, ...]  # wall time of each request's outcome (result or final failure), sorted
    calls: int  # the mock's counters at the end
    answered_429: int
    by_outcome: Mapping[str, int]
    outcomes_by_id: Mapping[str, Sequence[str]]
    rpm: int
    repeated_business: int = 0  # calls for a request that had already failed on the business layer
    cores: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    hedged: int | None = None  # the workers' hedged calls (their metric); None for the plain clients
    repeated_outcomes: int = 0  # requests that ended more than once (two results, a result and a failure, ...)

    @property
    def hedged_business(self) -> int:
        """Business failures the server answered more than once for one request: never retried, so hedges."""
        return sum(max(0, sum(outcome_layer(o) == FailureLayer.BUSINESS.value for o in outcomes) - 1)
                   for outcomes in self.outcomes_by_id.values())

    @property
    def finished(self) -> int:
        return len(self.finish_times)

    @property
    def converged(self) -> bool:
        return self.finished >= len(self.ids)

    @property
    def wall_s(self) -> float | None:
        return self.until_s(self.finished / len(self.ids)) if self.ids else None

    def until_s(self, fraction: float) -> float | None:
        """Seconds from the first call until ``fraction`` of the requests had an outcome; None if never."""
        needed = math.ceil(fraction * len(self.ids) - 1e-9)
        if self.first_call is None or needed < 1 or needed > self.finished:
            return None
        return self.finish_times[needed - 1] - self.first_call

    @property
    def share_429(self) -> float:
        return self.answered_429 / self.calls if self.calls else 0.0

    @property
    def paced_429(self) -> int:
        """429s from the server's rate limiter (not the profile's injected ones): the client's pace caused them."""
        return self.by_outcome.get(RATE_LIMITED, 0)

    @property
    def share_paced_429(self) -> float:
        return self.paced_429 / self.calls if self.calls else 0.0

    @property
    def needed(self) -> int:
        return admitted_calls(self.calls, self.by_outcome)

    @property
    def ideal_s(self) -> float:
        return self.needed / self.rpm * 60

    @property
    def ratio(self) -> float | None:
        """wall / ideal; None when there is no wall time or no ideal."""
        wall = self.wall_s
        return wall / self.ideal_s if wall is not None and self.ideal_s > 0 else None

    @property
    def recoverable(self) -> frozenset[str]:
        return frozenset(rid for rid in self.ids if is_recoverable(self.outcomes_by_id.get(rid, ())))

    @property
    def unrecovered(self) -> list[str]:
        """Recoverable requests without a result (unfinished ones included), sorted."""
        return sorted(self.recoverable - self.results)

    def ok(self) -> dict[str, bool]:
        ratio = self.ratio
        return {"ratio": self.converged and ratio is not None and ratio <= TARGET_WALL_RATIO,
                "unrecovered": len(self.unrecovered) <= TARGET_UNRECOVERED,
                "paced_429": self.share_paced_429 <= TARGET_PACE_429_SHARE}


@dataclass(frozen=True)
class SlotRun:
    """The worker against a one-slot server: throughput against what the slot can serve."""

    requests: int
    results: int
    seconds: float | None  # first call -> last outcome; None when nothing finished
    service_s: float  # the mock's fixed latency: the slot's service time
    timeouts: int
    converged: bool
    in_flight_limit: float | None
    abandoned: int | None = None  # the mock's count of queued requests whose client left
    cores: Mapping[str, float] = field(default_factory=dict)

    @property
    def capacity(self) -> float:
        """Requests per second one slot can serve."""
        return 1 / self.service_s

    @property
    def throughput(self) -> float:
        return self.results / self.seconds if self.seconds else 0.0

    @property
    def fraction(self) -> float:
        return self.throughput / self.capacity

    def ok(self) -> dict[str, bool]:
        return {"timeouts": self.timeouts <= TARGET_SLOT_TIMEOUTS,
                "fraction": self.converged and self.fraction >= TARGET_SLOT_FRACTION}


def last_outcomes(finished_by_id: Mapping[str, float], outcomes_by_id: Mapping[str, Sequence[str]],
                  first_call: float, n: int = 3) -> list[str]:
    """The ``n`` requests that finished last: when (seconds after the first call) and the mock's outcome of each
    of their calls, e.g. ``000123 at +61.2s [hang, ok]``."""
    last = sorted(finished_by_id, key=finished_by_id.__getitem__)[-n:]
    return [f"{rid.rsplit('-', 1)[-1]} at +{finished_by_id[rid] - first_call:.1f}s "
            f"[{', '.join(outcomes_by_id.get(rid, ()))}]" for rid in last]


def per_interval(times: Iterable[float], since: float, step_s: float) -> list[int]:
    """How many of ``times`` fell in each ``step_s`` after ``since``, up to the last: a run's stalls show as
    runs of small counts (a rebalance, a dead worker's records waiting for its session to expire)."""
    counts = Counter(int((at - since) // step_s) for at in times if at >= since)
    return [counts.get(i, 0) for i in range(max(counts, default=-1) + 1)]


def _mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def strict_rows(run: StrictRun) -> list[tuple[str, str, str, str]]:
    """The table rows of one strict run."""
    ok = run.ok()
    wall, ratio = run.wall_s, run.ratio
    wall_text = "n/a" if wall is None else f"{wall:.1f} s"
    if not run.converged:
        wall_text += f" (did NOT finish: {run.finished} of {len(run.ids)} requests had an outcome)"
    unrecovered = run.unrecovered
    example = f" e.g. {', '.join(rid.rsplit('-', 1)[-1] for rid in unrecovered[:3])}" if unrecovered else ""
    return [
        (f"{run.name}: {len(run.ids)} req, first call -> last outcome", wall_text, "", ""),
        ("  first call -> 95 % of the requests' outcomes", _seconds(run.until_s(0.95)), "(info)", ""),
        ("  calls made (mock) / of which 429",
         f"{run.calls:,} / {run.answered_429:,} = {run.share_429:.1%}", "(info)", ""),
        ("  429 from the server's rate limiter (the pace; the rest are the profile's injected faults)",
         f"{run.paced_429:,} = {run.share_paced_429:.2%}", f"<= {TARGET_PACE_429_SHARE:.0%}",
         _mark(ok["paced_429"])),
        (f"  calls needed (admitted) / ideal at {run.rpm:,} RPM", f"{run.needed:,} -> {run.ideal_s:.1f} s",
         "(info)", ""),
        ("  wall / ideal", "n/a" if ratio is None else f"{ratio:.2f}", f"<= {TARGET_WALL_RATIO:.2f}",
         _mark(ok["ratio"])),
        ("  recoverable requests without a result",
         f"{len(unrecovered)} of {len(run.recoverable):,}{example}", str(TARGET_UNRECOVERED),
         _mark(ok["unrecovered"])),
        ("  results / requests", f"{len(run.results):,} / {len(run.ids):,}", "(info)", ""),
        ("  calls repeated after a business failure", str(run.repeated_business), "(info)", ""),
    ]


def slot_rows(run: SlotRun) -> list[tuple[str, str, str, str]]:
    ok = run.ok()
    seconds = "n/a" if run.seconds is None else f"{run.seconds:.1f} s"
    if not run.converged:
        seconds += f" (did NOT finish: {run.results} results)"
    abandoned = "" if run.abandoned is None else f" (mock: {run.abandoned} left the queue)"
    limit = "n/a" if run.in_flight_limit is None else f"{run.in_flight_limit:g}"
    return [
        (f"one slot, worker: {run.requests} req, service {run.service_s:g} s, first call -> last outcome",
         seconds, "", ""),
        ("  calls that timed out", f"{run.timeouts}{abandoned}", str(TARGET_SLOT_TIMEOUTS),
         _mark(ok["timeouts"])),
        ("  throughput / slot capacity",
         f"{run.throughput:.2f} / {run.capacity:.2f} req/s = {run.fraction:.3f}", f">= {TARGET_SLOT_FRACTION:.2f}",
         _mark(ok["fraction"])),
        ("  worker's adaptive in-flight limit at the end", limit, "(info)", ""),
    ]


# ---- the plain clients (a child process) --------------------------------------------------------------------


@dataclass
class ClientRecord:
    """One request as a plain client saw it."""

    request_id: str
    start: float | None = None  # wall time its first call started
    end: float | None = None  # wall time it ended (result or error)
    ok: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClientRecord:
        return cls(str(data["request_id"]), data.get("start"), data.get("end"), bool(data.get("ok")),
                   data.get("error"))


def client_summary(records: Iterable[ClientRecord]) -> tuple[float | None, tuple[float, ...], frozenset[str]]:
    """(first call, sorted outcome times, ids with a result) of a plain client's records."""
    records = list(records)
    starts = [r.start for r in records if r.start is not None]
    ends = tuple(sorted(r.end for r in records if r.end is not None))
    return min(starts, default=None), ends, frozenset(r.request_id for r in records if r.ok)


def _retryable_http(exc: BaseException) -> bool:
    """tenacity's predicate: timeouts, connection errors, 429 and 5xx."""
    import httpx

    if isinstance(exc, httpx.TransportError):  # timeouts, refused/reset connections, broken answers
        return True
    return isinstance(exc, httpx.HTTPStatusError) and (exc.response.status_code == 429
                                                       or exc.response.status_code >= 500)


def _describe_error(exc: BaseException) -> str:
    status = getattr(getattr(exc, "response", None), "status_code", None) or getattr(exc, "status_code", None)
    return f"{type(exc).__name__}{f' {status}' if status else ''}"


async def _run_all(requests: Sequence[InferenceRequest], concurrency: int, records: dict[str, ClientRecord],
                   answer: Callable[[InferenceRequest], Awaitable[object]]) -> None:
    """Each request through ``answer`` (its content, or an exception), at most ``concurrency`` at once, timed
    into its record: the bookkeeping both plain clients share."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(request: InferenceRequest) -> None:
        record = records[request.request_id]
        async with semaphore:
            record.start = time.time()
            try:
                content = await answer(request)
                record.ok = isinstance(content, str)
                record.error = None if record.ok else "no content"
            except Exception as exc:
                record.error = _describe_error(exc)
            record.end = time.time()

    await asyncio.gather(*(one(request) for request in requests))


async def _tenacity_client(url: str, requests: Sequence[InferenceRequest], concurrency: int,
                           records: dict[str, ClientRecord]) -> None:
    import httpx
    from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=CLIENT_TIMEOUT_S, limits=limits) as client:

        async def answer(request: InferenceRequest) -> object:
            headers = {"x-client-request-id": request.request_id, "authorization": "Bearer sk-mock"}
            async for attempt in AsyncRetrying(retry=retry_if_exception(_retryable_http),
                                               wait=wait_random_exponential(min=1, max=60),
                                               stop=stop_after_attempt(RETRIES + 1), reraise=True):
                with attempt:
                    response = await client.post("/chat/completions", json=json.loads(request.body_json),
                                                 headers=headers)
                    response.raise_for_status()
            return response.json()["choices"][0]["message"]["content"]

        await _run_all(requests, concurrency, records, answer)


async def _litellm_client(url: str, requests: Sequence[InferenceRequest], concurrency: int,
                          records: dict[str, ClientRecord]) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the price list
    litellm: Any = importlib.import_module("litellm")
    router_types: Any = importlib.import_module("litellm.types.router")
    litellm.suppress_debug_info = True
    policy = router_types.RetryPolicy(
        TimeoutErrorRetries=RETRIES, RateLimitErrorRetries=RETRIES, InternalServerErrorRetries=RETRIES,
        ServiceUnavailableErrorRetries=RETRIES, DefaultRetries=RETRIES,  # APIConnectionError has no field
        BadRequestErrorRetries=0, ContentPolicyViolationErrorRetries=0, AuthenticationErrorRetries=0,
        NotFoundErrorRetries=0,
    )
    router = litellm.Router(
        model_list=[{"model_name": MODEL, "litellm_params": {"model": f"openai/{MODEL}", "api_base": url,
                                                             "api_key": "sk-mock"}}],
        num_retries=RETRIES, retry_policy=policy, timeout=CLIENT_TIMEOUT_S)

    async def answer(request: InferenceRequest) -> object:
        body = json.loads(request.body_json)
        params = {key: value for key, value in body.items() if key not in ("model", "messages")}
        response = await router.acompletion(model=MODEL, messages=body["messages"],
                                            extra_headers={"x-client-request-id": request.request_id}, **params)
        return response.choices[0].message.content

    await _run_all(requests, concurrency, records, answer)


CLIENTS = {"tenacity": _tenacity_client, "litellm": _litellm_client}


async def _client_main(kind: str, url: str, batch_id: str, count: int, concurrency: int, deadline_s: float,
                       out: Path) -> None:
    requests = Batch.make(batch_id, count).requests
    records = {r.request_id: ClientRecord(r.request_id) for r in requests}
    try:
        await asyncio.wait_for(CLIENTS[kind](url, requests, concurrency, records), deadline_s)
    except TimeoutError:
        print(f"deadline of {deadline_s:g}s: {sum(r.end is not None for r in records.values())} of {count} "
              "requests finished", file=sys.stderr)
    finally:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps([r.to_json() for r in records.values()]))
        tmp.replace(out)


def client_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.servers client")
    parser.add_argument("kind", choices=tuple(CLIENTS))
    parser.add_argument("--url", required=True)
    parser.add_argument("--batch-id", required=True)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--deadline-s", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    asyncio.run(_client_main(args.kind, args.url, args.batch_id, args.requests, args.concurrency, args.deadline_s,
                             args.out))


# ---- the mock and the runs ------------------------------------------------------------------------------------


def mock_has_slots() -> bool:
    """Whether this streamproc's ``mock-llm`` has ``--slots`` (being added alongside this suite)."""
    help_text = subprocess.run([sys.executable, "-m", "streamproc", "mock-llm", "--help"], capture_output=True,
                               text=True, cwd=ROOT, check=False).stdout
    return "--slots" in help_text


def strict_options(seed: int, profile: str = "strict") -> tuple[list[str], int, str]:
    """The mock's options of the strict runs against ``profile``, the RPM they are measured against (the
    profile's, else the strict profile's), and what they stand for."""
    strict = BUILTIN_PROFILES.get(profile)
    if strict is not None:
        rpm = strict.rate_limits.rpm or FALLBACK_RPM
        return ["--profile", profile, "--seed", str(seed)], rpm, profile
    return (["--profile", "realistic", "--rpm", str(FALLBACK_RPM), "--burst-seconds", "1.0", "--seed", str(seed)],
            FALLBACK_RPM, f"realistic --rpm {FALLBACK_RPM} --burst-seconds 1 (NO strict profile in this mock)")



def default_worker_env(bench: Bench, prefix: str, llm_url: str, data_dir: Path) -> dict[str, str]:
    """The benchmarks' worker environment, but the worker's own defaults for every setting of the LLM calls:
    only the broker, the topics, the data dir and the LLM's URL are set."""
    env = worker_env(bench.bootstrap, prefix, llm_url, data_dir, 1, bench.partitions)
    for key in ("STREAMPROC_IN_FLIGHT", "STREAMPROC_RETRY_TIERS"):  # worker_env's are the defaults; leave them
        env.pop(key)
    return env


@dataclass
class ServersBench:
    bench: Bench
    args: argparse.Namespace
    rpm: int = FALLBACK_RPM
    notes: list[str] = field(default_factory=list)

    @property
    def stack(self) -> Stack:
        return self.bench.stack

    async def worker(self, name: str, requests: int, mock_options: list[str], timeout_s: float,
                     settings: Mapping[str, str] | None = None, scenario: Scenario = ONE,
                     ) -> tuple[Outcomes, dict[str, Any], dict[str, float], list[str]]:
        """Default-settings workers (but ``settings``, STREAMPROC_* variables) over ``requests`` records of the
        guards mix against a fresh mock: ``scenario``'s workers, and its change mid-batch.

        Returns the outcomes (partial when the run did not finish in ``timeout_s``), the mock's
        ``/stats?detail=1``, the cores used (of the mock and the first worker), and each worker's ``/metrics``
        at the end (a killed one's just before it was killed).
        """
        topology = self.bench.topology(name)
        await ensure_topics(KafkaConnection(bootstrap=self.bench.bootstrap), topology.all_topics())
        batch = Batch.make(f"{name}-{self.bench.run_id}", requests)
        mock = spawn_mock(self.stack, f"mock-{name}", mock_options)
        env = default_worker_env(self.bench, topology.prefix, mock.url, self.stack.workdir / f"worker-{name}-data")
        env.update(settings or {})
        group = WorkerGroup(self.stack, f"worker-{name}", env)
        if scenario.start > 1:  # a fleet at work: formed before its batch (one worker forms at once)
            for _ in range(scenario.start):
                group.start()
            took = await formed(self.bench.bootstrap, env["STREAMPROC_APP_ID"], scenario.start, timeout_s)
            print(f"  {scenario.start} workers formed their group in {took:.1f} s", flush=True)
        await produce_requests(self.bench.bootstrap, topology.requests, batch.requests)

        def spawn() -> subprocess.Popen[bytes]:
            if not group.processes:
                group.start()
            return group.processes[0]

        print(f"{name}: {requests} requests, {scenario.label} with default settings, mock {' '.join(mock_options)}",
              flush=True)
        outcomes = Outcomes(batch.ids, time.time())
        sampled: list[Sampler] = []

        def sampler(pid: int) -> Sampler:
            sampled.append(self.bench.sampler("worker", mock.process.pid)(pid))
            return sampled[-1]

        changed: list[str] = []
        change = asyncio.create_task(play(scenario, outcomes, group, changed))
        try:
            try:
                await follow(self.bench.bootstrap, topology, outcomes, spawn, timeout_s, sampler)
            except BenchError as exc:  # not finished in time, or the worker died: report what it did
                self.notes.append(f"{name}: {exc}")
                print(f"  {exc}", flush=True)
            finally:
                change.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await change
            for line in changed:
                print(f"  {line}", flush=True)
            metrics, unread = await group.metrics()
            self.notes.extend(f"{name}: {note}" for note in unread)
            try:
                stats = mock.stats(detail=True)
            except (OSError, ValueError) as exc:
                raise BenchError(f"{name}: could not read the mock's /stats: {exc}") from exc
        finally:
            group.stop()
            self.stack.stop(mock.process)
        cores = sampled[0].cores(outcomes.first_call, outcomes.last_outcome) if sampled and outcomes.done else {}
        return outcomes, stats, cores, metrics

    async def strict_worker(self, seed: int, profile: str = "strict", name: str = "strict-worker",
                            label: str = "strict, worker", settings: Mapping[str, str] | None = None,
                            scenario: Scenario = ONE) -> StrictRun:
        """``scenario``'s workers against a fresh mock of ``profile``; ``name`` names their topics and batch
        (unique on one broker), ``label`` its rows; the workers' hedges are read from their /metrics."""
        options, self.rpm, _ = strict_options(seed, profile)
        outcomes, stats, cores, metrics = await self.worker(name, self.args.strict_requests, options,
                                                            self.args.servers_deadline_s, settings, scenario)
        first = outcomes.first_call if outcomes.done else None
        finished = outcomes.finished_s()

        def counts(counter: Counter[tuple[str, str]]) -> str:
            return ", ".join(f"{layer}/{code} {n}" for (layer, code), n in counter.most_common(8)) or "none"

        notes: tuple[str, ...] = (f"terminal failures: {counts(outcomes.terminal_by_code())}",
                                  f"retried failures: {counts(outcomes.retried)}")
        if outcomes.multiple:
            notes += (f"ended more than once: {', '.join(outcomes.multiple[:10])}",)
        if first is not None:
            notes += (f"outcomes per {TIMELINE_STEP_S:g} s: "
                      + " ".join(map(str, per_interval(finished.values(), first, TIMELINE_STEP_S))),)
            notes += ("the last to finish: " + " | ".join(
                outcomes.timeline(rid, first) for rid in sorted(finished, key=finished.__getitem__)[-3:]),)
        hedges = [value for text in metrics if (value := metric_value(text, HEDGED_METRIC)) is not None]
        return self.strict_run(label, outcomes.expected, frozenset(outcomes.results), first, finished, stats, cores,
                               notes, int(sum(hedges)) if hedges else None, len(outcomes.multiple))

    def strict_run(self, name: str, ids: Collection[str], results: frozenset[str], first: float | None,
                   finished: Mapping[str, float], stats: Mapping[str, Any], cores: Mapping[str, float],
                   notes: tuple[str, ...], hedged: int | None = None, repeated_outcomes: int = 0) -> StrictRun:
        by_outcome = {str(k): int(v) for k, v in stats.get("by_outcome", {}).items()}
        per_id = per_request_outcomes(stats)
        if first is not None:
            notes += ("last outcomes (request, mock's answer to each call): "
                      + "; ".join(last_outcomes(finished, per_id, first)),)
        run = StrictRun(name, frozenset(ids), results, first, tuple(sorted(finished.values())), int(stats["calls"]),
                        int(stats.get("by_status", {}).get("429", 0)), by_outcome, per_id,
                        self.rpm, int(stats.get("request_ids", {}).get("repeated_after_business_failure", 0)),
                        cores, notes, hedged, repeated_outcomes)
        outcome_counts = ", ".join(f"{k} {v}" for k, v in sorted(by_outcome.items(), key=lambda kv: -kv[1]))
        wall = run.wall_s
        print(f"  {name}: {len(results)} results of {len(ids)} in "
              f"{'n/a' if wall is None else f'{wall:.1f}s'}; {run.calls} calls; mock outcomes: {outcome_counts}",
              flush=True)
        for note in notes:
            print(f"  {note}", flush=True)
        return run

    async def strict_client(self, kind: str, label: str, seed: int, profile: str = "strict",
                            worker_name: str = "strict-worker") -> StrictRun | None:
        """A plain client (a child process) over the requests of the worker run ``worker_name``, against a fresh
        mock of ``profile``."""
        if kind == "litellm" and importlib.util.find_spec("litellm") is None:
            self.notes.append("the LiteLLM run was skipped: litellm is not installed (pip install -e '.[bench]')")
            print(f"strict-{kind}: skipped, litellm is not installed", flush=True)
            return None
        name = worker_name.replace("worker", kind)
        options, self.rpm, _ = strict_options(seed, profile)
        mock = spawn_mock(self.stack, f"mock-{name}", options)
        out = self.stack.workdir / f"{name}.json"
        deadline = float(self.args.servers_deadline_s)
        env = {key: value for key, value in os.environ.items() if not key.startswith("STREAMPROC_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
        batch_id = f"{worker_name}-{self.bench.run_id}"  # the worker run's ids: the same requests
        command = [sys.executable, "-m", "benchmarks.servers", "client", kind, "--url", mock.url, "--batch-id",
                   batch_id, "--requests", str(self.args.strict_requests), "--concurrency",
                   str(self.args.client_concurrency), "--deadline-s", f"{deadline:g}", "--out", str(out)]
        print(f"{name}: {self.args.strict_requests} requests, {label}, concurrency {self.args.client_concurrency}",
              flush=True)
        try:
            process = self.stack.spawn(name, command, env)
            sampler = self.bench.sampler(kind, mock.process.pid)(process.pid)
            give_up = time.monotonic() + deadline + 60  # the client's own deadline, then start-up and writing
            while process.poll() is None:
                if time.monotonic() > give_up:
                    raise BenchError(f"{name}: the client did not stop after its deadline:\n"
                                     f"{self.stack.log_tail(name)}")
                sampler.sample()
                await asyncio.sleep(SAMPLE_EVERY_S)
            sampler.sample()
            if process.returncode != 0 or not out.exists():
                raise BenchError(f"{name}: the client failed ({process.returncode}):\n{self.stack.log_tail(name)}")
            try:
                stats = mock.stats(detail=True)
            except (OSError, ValueError) as exc:
                raise BenchError(f"{name}: could not read the mock's /stats: {exc}") from exc
        finally:
            self.stack.stop(mock.process)
        records = [ClientRecord.from_json(r) for r in json.loads(out.read_text())]
        first, finish_times, results = client_summary(records)
        errors = Counter(r.error for r in records if not r.ok and r.error)
        cores = sampler.cores(first, finish_times[-1]) if first is not None and finish_times else {}
        finished = {r.request_id: r.end for r in records if r.end is not None}
        notes = (f"errors: {', '.join(f'{e} {n}' for e, n in errors.most_common(6)) or 'none'}",)
        return self.strict_run(f"{profile}, {label}", [r.request_id for r in records], results, first, finished,
                               stats, cores, notes)

    async def one_slot(self) -> SlotRun | None:
        if not mock_has_slots():
            self.notes.append("the one-slot run was skipped: this mock-llm has no --slots option yet")
            print("one-slot: skipped, mock-llm has no --slots", flush=True)
            return None
        latency = float(self.args.slot_latency)
        options = ["--profile", "clean", "--slots", "1", "--latency", f"{latency:g}"]
        requests = self.args.slot_requests
        timeout_s = min(float(self.args.servers_deadline_s), 120 + 5 * requests * latency)
        outcomes, stats, cores, metrics = await self.worker("one-slot", requests, options, timeout_s)
        failures = Counter(outcomes.retried)
        failures.update(outcomes.terminal_by_code())
        queue = stats.get("queue") or {}
        abandoned = queue.get("abandoned") if isinstance(queue, dict) else None
        in_flight_limit = metric_value(metrics[0], IN_FLIGHT_METRIC) if metrics else None
        run = SlotRun(requests, len(outcomes.results), outcomes.seconds if outcomes.done else None, latency,
                      timeout_count(failures), outcomes.done >= requests, in_flight_limit,
                      None if abandoned is None else int(abandoned), cores)
        print(f"  one-slot: {run.results} results in {run.seconds or 0:.1f}s = {run.throughput:.2f} req/s; "
              f"{int(stats['calls'])} calls; failures {dict(failures) or 'none'}; queue {queue or 'n/a'}", flush=True)
        return run


# ---- the report ----------------------------------------------------------------------------------------------


def report(args: argparse.Namespace, strict: list[StrictRun], slot: SlotRun | None, strict_label: str,
           notes: list[str]) -> list[str]:
    rows: list[tuple[str, str, str, str]] = []
    warnings: list[str] = []
    for run in strict:
        rows += strict_rows(run)
        ok = run.ok()
        if not ok["ratio"]:
            ratio = run.ratio
            warnings.append(f"{run.name}: wall / ideal = {'n/a' if ratio is None else f'{ratio:.2f}'}"
                            f"{'' if run.converged else ' (did not finish)'}, target <= {TARGET_WALL_RATIO:.2f}")
        if not ok["unrecovered"]:
            warnings.append(f"{run.name}: {len(run.unrecovered)} recoverable requests did not end in a result")
    if slot is not None:
        rows += slot_rows(slot)
        ok = slot.ok()
        if not ok["timeouts"]:
            warnings.append(f"one slot, worker: {slot.timeouts} calls timed out, target {TARGET_SLOT_TIMEOUTS}")
        if not ok["fraction"]:
            warnings.append(f"one slot, worker: throughput / capacity = {slot.fraction:.3f}"
                            f"{'' if slot.converged else ' (did not finish)'}, target >= {TARGET_SLOT_FRACTION:.2f}")
    print()
    print(f"streamproc servers benchmark: {os.cpu_count()} CPUs, Python {platform.python_version()}, Kafka "
          f"{DEFAULT_KAFKA_VERSION} ({'given broker' if args.bootstrap else 'private broker'}), "
          f"{args.partitions} partitions; strict runs: mock {strict_label}, seed {args.strict_seed}; "
          f"load average now {os.getloadavg()[0]:.2f}")
    print(table(rows))
    cpus = os.cpu_count() or 1
    named: list[tuple[str, Mapping[str, float]]] = [(run.name, run.cores) for run in strict]
    if slot is not None:
        named.append(("one slot, worker", slot.cores))
    for name, cores in named:
        if cores:
            print(f"cores used during {name} (of {cpus}): "
                  + ", ".join(f"{k} {used:.2f}" for k, used in cores.items()))
    busy = max(((cores.get("other", 0.0), name) for name, cores in named), default=(0.0, ""))
    if busy[0] > OTHER_LOAD_WARNING:
        warnings.append(f"other processes used {busy[0]:.2f} cores during {busy[1]}: the machine was shared")
    warnings += notes
    for warning in warnings:
        print(f"WARNING: {warning}")
    return warnings


# ---- the command line --------------------------------------------------------------------------------------


RUNS = ("worker", "tenacity", "litellm", "slot")


def add_strict_arguments(parser: argparse._ActionsContainer) -> None:
    """The options of the strict runs (the fleet suite's too)."""
    parser.add_argument("--strict-requests", type=int, default=1500, help="requests of each strict run [1500]")
    parser.add_argument("--strict-seed", type=int, default=1, help="the strict mock's seed, every strict run [1]")
    parser.add_argument("--client-concurrency", type=int, default=64,
                        help="semaphore of the tenacity and LiteLLM clients [64]")
    parser.add_argument("--servers-deadline-s", type=float, default=240.0,
                        help="give up on a run after this long and report what it did [240]")


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """The servers suite's own options (the task's numbers are the defaults)."""
    add_strict_arguments(parser)
    parser.add_argument("--slot-requests", type=int, default=200, help="requests of the one-slot run [200]")
    parser.add_argument("--slot-latency", type=float, default=0.2,
                        help="the one-slot mock's fixed latency = service time, seconds [0.2]")
    parser.add_argument("--servers-runs", default=",".join(RUNS),
                        help=f"comma-separated runs of the servers suite [{','.join(RUNS)}]")


def check_strict_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("strict_requests", "client_concurrency", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.servers_deadline_s <= 0:
        parser.error("--servers-deadline-s must be positive")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    check_strict_arguments(parser, args)
    if args.slot_requests < 1:
        parser.error("--slot-requests must be at least 1")
    if args.slot_latency <= 0:
        parser.error("--slot-latency must be positive")
    unknown = set(args.servers_runs.split(",")) - set(RUNS)
    if unknown:
        parser.error(f"--servers-runs: unknown run(s) {', '.join(sorted(unknown))}; choose from {', '.join(RUNS)}")


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    selected = set(args.servers_runs.split(","))
    bench = open_bench(args, stack)
    servers = ServersBench(bench, args)
    _, _, strict_label = strict_options(args.strict_seed)
    if "strict" not in BUILTIN_PROFILES:
        servers.notes.append(f"this mock-llm has no strict profile: the strict runs used {strict_label}")
    strict: list[StrictRun] = []
    if "worker" in selected:
        strict.append(await servers.strict_worker(args.strict_seed))
    for kind, label in (("tenacity", "asyncio+tenacity"), ("litellm", "LiteLLM Router")):
        if kind in selected and (client_run := await servers.strict_client(kind, label, args.strict_seed)):
            strict.append(client_run)
    slot = await servers.one_slot() if "slot" in selected else None
    report(args, strict, slot, strict_label, servers.notes)
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")
    unfinished = [run.name for run in strict if not run.converged] + (
        ["one slot, worker"] if slot is not None and not slot.converged else [])
    if unfinished:
        raise BenchError(f"did not finish within --servers-deadline-s: {', '.join(unfinished)} (figures above)")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        client_command(argv[1:])
        return
    suite_main("python -m benchmarks.servers", __doc__, add_arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()
