"""``scripts/bench guards``: the guards against real rate limits and an outage, all figures from one run (issue 6).

Starts a private Kafka broker (temporary data dir, free ports), then for each run a fresh mock LLM server
(``--profile realistic --rpm 3000 --tpm 300000``: lognormal latency p50 0.4 s / p99 3 s, about 5 % faults
on every layer) and one worker told the same limits (``STREAMPROC_LLM_RPM`` / ``STREAMPROC_LLM_TPM``), over
its own topics, consumer group and data dir. Every request is on the requests topic before the worker starts.

1. paced: 5,000 requests of a realistic mix (sentiment labels, one-sentence summaries, short questions and
   5 % JSON Schema extractions; 120 tokens of rate-limit cost per call on average, so the TPM limit binds
   before the RPM one). Targets: completion time <= 1.10 x the theoretical minimum, 429 answers <= 2 % of
   calls, no call repeated after a business failure, every request ending in exactly one outcome.
2. outage, breaker on: 3,000 requests; 15 s after the first outcome the mock answers 503 to everything for
   30 s (``POST /control/outage``).
3. outage, breaker off: the same requests and mock seed, the worker with ``STREAMPROC_BREAKER_ENABLED=false``.
   Targets: calls during the outage with the breaker <= 5 % of the calls without it; processing resumes
   within 10 s of the outage's end (first result of a call started after it, and the results rate over a
   sliding 2 s window back at half the binding limit).

Completion time runs from the first LLM call (``completed_ms - latency_ms`` of the earliest result, or the
earliest failure event) to the last outcome (a result's ``completed_ms``, a terminal failure's
``last_failure_ms``): the worker's start-up is not counted. The theoretical minimum is
``max(calls / RPM, tokens / TPM)`` over the calls the mock's rate limiter admitted (every call but its own
429s and the outage's 503s; the profile's injected 429s used up the limits like any call), each costing
prompt tokens + ``max_tokens`` as the mock counts them.

A missed target is a warning, not a failure; the exit code is 0 when every run converged (every request
has a result or a terminal failure), 1 when one did not, 130 on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer

from benchmarks.pipeline import (
    OTHER_LOAD_WARNING,
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
from streamproc import codec
from streamproc.app.topics import ensure_topics
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.topology import Topology
from streamproc.core.vocabulary import FailureLayer
from streamproc.kafka.connection import KafkaConnection
from streamproc.mockllm import FaultKind, MockLLMProcess
from streamproc.mockllm.engine import (
    BODY_TOO_LARGE,
    CONTEXT_LENGTH,
    MALFORMED,
    MODEL_NOT_FOUND,
    OUTAGE,
    RATE_LIMITED,
    UNAUTHORIZED,
)
from streamproc.mockllm.token_count import chat_prompt_tokens
from streamproc.mockllm.validation import parse_chat
from streamproc.settings import DEFAULT_KAFKA_VERSION, Settings

TARGET_TIME_RATIO = 1.10
TARGET_429_FRACTION = 0.02
TARGET_OUTAGE_CALL_RATIO = 0.05
TARGET_RESUME_S = 10.0
RESUME_RATE_FRACTION = 0.5  # "resumed" = results over a sliding window at this fraction of the binding limit
RESUME_WINDOW_S = 2.0
SETTLE_S = 2.0  # after convergence, keep reading this long: a duplicate outcome would show up here

# Outcomes the mock answers before its rate limiter takes anything (mockllm.engine.decide's order).
NOT_ADMITTED = frozenset({UNAUTHORIZED, OUTAGE, MALFORMED, MODEL_NOT_FOUND, CONTEXT_LENGTH, RATE_LIMITED,
                          BODY_TOO_LARGE})
# Admitted calls answered with an error status (or a hang): the mock does not add their prompt tokens to its
# ``tokens`` counter, which covers the answered ones (repair turns included) exactly.
NO_TOKEN_COUNT = frozenset(kind.value for kind in FaultKind if kind is FaultKind.HANG
                           or kind.layer in (FailureLayer.SERVICE, FailureLayer.BUSINESS, None))


# ---- the requests ----------------------------------------------------------------------------------------

PRODUCTS = ("wireless headphones", "coffee grinder", "standing desk", "running shoes", "phone case",
            "air purifier", "electric kettle", "backpack", "smart watch", "office chair")
PROBLEMS = ("arrived two days late", "stopped charging after a week", "came with a cracked lid",
            "is louder than advertised", "was missing the power cable", "works fine but the box was damaged",
            "does not match the colour in the photos", "was delivered to the wrong address")
TICKET_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["order", "product", "issue", "refund"],
    "properties": {"order": {"type": "integer"}, "product": {"type": "string", "maxLength": 40},
                   "issue": {"type": "string", "maxLength": 60}, "refund": {"type": "boolean"}},
}


def guard_body(i: int) -> dict[str, Any]:
    """Request ``i`` of the mix: 45 % labels, 35 % summaries, 15 % questions, 5 % JSON Schema extractions.

    Every ``max_tokens`` leaves room for the mock's longest answer to that kind (checked over the first
    10,000 bodies: none is cut), so ``finish_reason: length`` comes only from the profile's own faults.
    """
    rng = random.Random(i)
    product, problem = rng.choice(PRODUCTS), rng.choice(PROBLEMS)
    kind = i % 20
    if kind == 0:
        return {"model": "mock-small", "max_tokens": 48, "messages": [{"role": "user", "content": (
            f"Extract the order number, product and issue as JSON from ticket #{i}: order {100000 + i}, the "
            f"{product} {problem}; the customer asks for a refund.")}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "ticket", "strict": True, "schema": TICKET_SCHEMA}}}
    if kind <= 9:
        return {"model": "mock-small", "max_tokens": 80, "messages": [{"role": "user", "content": (
            f"Label the sentiment of review #{i} as positive, negative or mixed: the {product} {problem}.")}]}
    if kind <= 16:
        return {"model": "mock-small", "max_tokens": 88, "messages": [{"role": "user", "content": (
            f"Summarise support ticket #{i} in one sentence: the {product} {problem}, and the customer asks "
            "whether a refund or a replacement is possible.")}]}
    return {"model": "mock-small", "max_tokens": 80, "messages": [{"role": "user", "content": (
        f"In one sentence (#{i}): how should a {product} be cleaned?")}]}


def call_cost(body: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, max_tokens) of one call of ``body``, as the mock's rate limiter counts them."""
    parsed = parse_chat(body)
    return chat_prompt_tokens(parsed.texts, parsed.message_count, parsed.image_parts), parsed.max_tokens or 0


@dataclass(frozen=True)
class Batch:
    """The requests of one run, and what each costs the mock's rate limiter per call."""

    batch_id: str
    requests: tuple[InferenceRequest, ...]
    costs: dict[str, tuple[int, int]]  # request id -> (prompt tokens, max_tokens)

    @classmethod
    def make(cls, batch_id: str, count: int) -> Batch:
        requests, costs = [], {}
        now_ms = time.time_ns() // 1_000_000
        for i in range(count):
            body = guard_body(i)
            request_id = f"{batch_id}-{i:06d}"
            requests.append(InferenceRequest(request_id=request_id, body_json=json.dumps(body), batch_id=batch_id,
                                             submitted_ms=now_ms))
            costs[request_id] = call_cost(body)
        return cls(batch_id, tuple(requests), costs)

    @property
    def ids(self) -> set[str]:
        return set(self.costs)

    @property
    def mean_cost(self) -> float:
        return sum(p + m for p, m in self.costs.values()) / max(1, len(self.costs))


@dataclass(frozen=True)
class Limits:
    rpm: int
    tpm: int

    def binding_rate(self, mean_cost: float) -> tuple[float, str]:
        """Calls per second the tighter limit allows for calls of ``mean_cost`` tokens, and its name."""
        by_requests = self.rpm / 60
        by_tokens = self.tpm / 60 / mean_cost if self.tpm else float("inf")
        return (by_requests, "RPM") if by_requests <= by_tokens else (by_tokens, "TPM")


# ---- the mock --------------------------------------------------------------------------------------------


def start_mock(stack: Stack, name: str, limits: Limits, seed: int) -> MockLLMProcess:
    """A realistic-profile mock with the run's limits, as a process of the stack (log file, stopped at the end)."""
    return spawn_mock(stack, name, ["--profile", "realistic", "--rpm", str(limits.rpm), "--tpm", str(limits.tpm),
                                    "--seed", str(seed)])


@dataclass
class OutageWindow:
    """One outage injected during a run, in wall-clock seconds, with the mock's call counter at both ends."""

    start: float
    end: float
    calls_at_start: int
    calls_at_end: int | None = None

    @property
    def calls_inside(self) -> int | None:
        return None if self.calls_at_end is None else self.calls_at_end - self.calls_at_start


async def inject_outage(mock: MockLLMProcess, first_outcome: asyncio.Event, after_s: float, seconds: float,
                        window: list[OutageWindow]) -> None:
    """``after_s`` after the first outcome, an outage of ``seconds``; appends its window when it started."""
    await first_outcome.wait()
    await asyncio.sleep(after_s)
    try:
        calls_before = int((await asyncio.to_thread(mock.stats))["calls"])
        answer = await asyncio.to_thread(mock.post, "/control/outage", {"seconds": seconds})
    except (OSError, ValueError, KeyError) as exc:
        raise BenchError(f"could not start the outage at {mock.root}: {exc}") from exc
    answered = time.time()
    remaining = answer.get("outage", {}).get("remaining_s")  # the mock's own clock decides when it ends
    end = answered + (float(remaining) if remaining is not None else seconds)
    outage = OutageWindow(end - seconds, end, calls_before)
    window.append(outage)
    print(f"  outage of {seconds:g}s from {_clock(outage.start)} to {_clock(end)}", flush=True)
    await asyncio.sleep(max(0.0, end - time.time()))
    with contextlib.suppress(OSError, ValueError, KeyError):  # only the cross-check "arrived in the window"
        outage.calls_at_end = int((await asyncio.to_thread(mock.stats))["calls"])


def _clock(wall: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall % 1 * 10)}"


# ---- watching the outcomes -------------------------------------------------------------------------------


@dataclass
class Outcomes:
    """What a reader saw on the results and failure topics of one run, per request id."""

    expected: set[str]
    spawned: float  # wall time the worker was started
    results: dict[str, list[InferenceResult]] = field(default_factory=dict)
    terminal: dict[str, list[FailureEvent]] = field(default_factory=dict)
    retried: Counter[tuple[str, str]] = field(default_factory=Counter)  # non-terminal failures, (layer, code)
    failed_at: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # id -> (wall time, code) each
    earliest_failure_ms: int | None = None  # any failure event: its call started at or before this
    strangers: int = 0  # outcomes for ids not in this run (none expected)
    converged_at: float | None = None  # wall time the reader had an outcome for every request
    milestones: list[tuple[int, asyncio.Event]] = field(default_factory=list)  # (outcomes, set once reached)

    def add(self, topic_is_results: bool, value: bytes) -> None:
        if topic_is_results:
            result = codec.decode(value, InferenceResult)
            if result.request_id not in self.expected:
                self.strangers += 1
                return
            self.results.setdefault(result.request_id, []).append(result)
            return
        event = codec.decode(value, FailureEvent)
        request_id = event.request.request_id
        if request_id not in self.expected:
            self.strangers += 1
            return
        if self.earliest_failure_ms is None or event.last_failure_ms < self.earliest_failure_ms:
            self.earliest_failure_ms = event.last_failure_ms
        if event.terminal:
            self.terminal.setdefault(request_id, []).append(event)
        else:
            self.retried[(event.layer.value, event.error_code)] += 1
            self.failed_at.setdefault(request_id, []).append((event.last_failure_ms / 1000, event.error_code))

    def reached(self, count: int) -> asyncio.Event:
        """An event set once ``count`` requests have an outcome (by :func:`follow`, as it reads them)."""
        event = asyncio.Event()
        self.milestones.append((count, event))
        self.signal_milestones()
        return event

    def signal_milestones(self) -> None:
        done = self.done
        for count, event in self.milestones:
            if done >= count:
                event.set()
        self.milestones = [(count, event) for count, event in self.milestones if not event.is_set()]

    def timeline(self, request_id: str, since: float) -> str:
        """When each attempt of a request failed and when its result came, seconds after ``since``: where a
        slow tail spent its time."""
        steps = [f"{code} +{at - since:.1f}s" for at, code in sorted(self.failed_at.get(request_id, ()))]
        steps += [f"result called +{(r.completed_ms - r.latency_ms) / 1000 - since:.1f}s, "
                  f"answered +{r.completed_ms / 1000 - since:.1f}s" for r in self.results.get(request_id, ())[:1]]
        return f"{request_id.rsplit('-', 1)[-1]}: {'; '.join(steps)}"

    @property
    def done(self) -> int:
        """Request ids with at least one outcome."""
        return len(self.results.keys() | self.terminal.keys())

    @property
    def multiple(self) -> list[str]:
        """Request ids with more than one outcome (two results, or a result and a terminal failure, ...)."""
        return sorted(rid for rid in self.results.keys() | self.terminal.keys()
                      if len(self.results.get(rid, ())) + len(self.terminal.get(rid, ())) > 1)

    @property
    def exactly_one(self) -> int:
        return self.done - len(self.multiple)

    def finished_s(self) -> dict[str, float]:
        """Request id -> wall time of its (first) outcome."""
        out = {rid: min(r.completed_ms for r in results) / 1000 for rid, results in self.results.items()}
        for rid, events in self.terminal.items():
            at = min(e.last_failure_ms for e in events) / 1000
            out[rid] = min(at, out.get(rid, at))
        return out

    @property
    def first_call(self) -> float:
        starts = [r.completed_ms - r.latency_ms for results in self.results.values() for r in results]
        if self.earliest_failure_ms is not None:
            starts.append(self.earliest_failure_ms)
        return min(starts) / 1000

    @property
    def last_outcome(self) -> float:
        return max(self.finished_s().values())

    @property
    def seconds(self) -> float:
        return self.last_outcome - self.first_call

    def result_times(self) -> list[tuple[float, float]]:
        """(call start, completion) of every first result, in wall seconds, by completion."""
        return sorted(((r[0].completed_ms - r[0].latency_ms) / 1000, r[0].completed_ms / 1000)
                      for r in self.results.values())

    def terminal_by_code(self) -> Counter[tuple[str, str]]:
        return Counter((events[0].layer.value, events[0].error_code) for events in self.terminal.values())


async def follow(bootstrap: str, topology: Topology, outcomes: Outcomes, spawn: Callable[[], subprocess.Popen[bytes]],
                 timeout_s: float, sampler: Callable[[int], Sampler]) -> Sampler:
    """Start the reader, then the worker; read until every request has an outcome, and ``SETTLE_S`` more."""
    failure_topics = [topology.failed(layer) for layer in FailureLayer]
    consumer = AIOKafkaConsumer(topology.results, *failure_topics, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        process = spawn()
        outcomes.spawned = time.time()
        watch = sampler(process.pid)
        next_sample = 0.0
        deadline = time.monotonic() + timeout_s
        expected = len(outcomes.expected)
        while outcomes.converged_at is None or time.time() < outcomes.converged_at + SETTLE_S:
            batches = await consumer.getmany(timeout_ms=100, max_records=10_000)
            now = time.time()
            for tp, messages in batches.items():
                for message in messages:
                    if message.value is not None:
                        outcomes.add(tp.topic == topology.results, message.value)
            if outcomes.milestones:
                outcomes.signal_milestones()
            if outcomes.converged_at is None and outcomes.done >= expected:
                outcomes.converged_at = now
            if now >= next_sample:
                watch.sample()
                next_sample = now + SAMPLE_EVERY_S
            if process.poll() is not None:
                raise BenchError(f"the worker exited ({process.returncode}) after {outcomes.done} of {expected} "
                                 "requests had an outcome")
            if outcomes.converged_at is None and time.monotonic() > deadline:
                raise BenchError(f"only {outcomes.done} of {expected} requests had an outcome after "
                                 f"{timeout_s:.0f}s (did not converge)")
        watch.sample()
    finally:
        await consumer.stop()
    return watch


# ---- the runs ----------------------------------------------------------------------------------------------


@dataclass
class GuardRun:
    name: str  # also the worker's log file name
    requests: int
    batch: Batch
    outcomes: Outcomes
    stats: dict[str, Any]  # the mock's /stats?detail=1 at the end
    cores: dict[str, float]
    limits: Limits
    outage: OutageWindow | None = None

    # -- from the mock's counters
    @property
    def calls(self) -> int:
        return int(self.stats["calls"])

    @property
    def by_outcome(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.stats.get("by_outcome", {}).items()}

    @property
    def answered_429(self) -> int:
        return int(self.stats.get("by_status", {}).get("429", 0))

    @property
    def repeated_after_business_failure(self) -> tuple[int, int]:
        """Calls for a request that had already failed on the business layer: (by request id, by content)."""
        return (int(self.stats["request_ids"]["repeated_after_business_failure"]),
                int(self.stats["requests"]["repeated_after_business_failure"]))

    @property
    def outage_calls(self) -> int:
        return self.by_outcome.get(OUTAGE, 0)

    def needed(self) -> tuple[int, int]:
        """(calls, tokens) the mock's rate limiter admitted: what any client would have had to spend.

        Tokens: the mock's own ``tokens.prompt`` (answered calls, repair turns included) plus, for admitted
        calls it does not count (error answers, hangs), the request's own prompt tokens; plus ``max_tokens``
        of every admitted call.
        """
        calls = 0
        tokens = int(self.stats["tokens"]["prompt"])
        for request_id, record in self.stats.get("per_request_id", {}).items():
            prompt, max_tokens = self.batch.costs.get(request_id, (0, 0))
            for outcome in record["outcomes"]:
                if outcome in NOT_ADMITTED:
                    continue
                calls += 1
                tokens += max_tokens + (prompt if outcome in NO_TOKEN_COUNT else 0)
        return calls, tokens

    def minimum_s(self) -> tuple[float, float, float]:
        """(theoretical minimum, by RPM, by TPM) in seconds."""
        calls, tokens = self.needed()
        by_rpm = calls / self.limits.rpm * 60
        by_tpm = tokens / self.limits.tpm * 60 if self.limits.tpm else 0.0
        return max(by_rpm, by_tpm), by_rpm, by_tpm

    # -- resumption after the outage
    def resume_first_s(self) -> float | None:
        """Seconds from the outage's end to the first result of a call started after it."""
        if self.outage is None:
            return None
        end = self.outage.end
        after = [done for started, done in self.outcomes.result_times() if started >= end]
        return min(after) - end if after else None

    def resume_rate_s(self, rate: float) -> float | None:
        """Seconds from the outage's end until results over a sliding window reach ``rate`` per second."""
        if self.outage is None:
            return None
        end = self.outage.end
        done = [d for started, d in self.outcomes.result_times() if started >= end]
        needed = rate * RESUME_WINDOW_S
        low = 0
        for high, t in enumerate(done):
            while done[low] <= t - RESUME_WINDOW_S:
                low += 1
            if high - low + 1 >= needed:
                return t - end
        return None

    def describe(self, verbose: bool) -> str:
        o = self.outcomes
        results = len(o.results)
        failures = ", ".join(f"{layer}/{code} {n}" for (layer, code), n in sorted(o.terminal_by_code().items()))
        retried = ", ".join(f"{layer}/{code} {n}" for (layer, code), n in o.retried.most_common(6))
        outcome_counts = ", ".join(f"{k} {v}" for k, v in sorted(self.by_outcome.items(), key=lambda kv: -kv[1]))
        parts = [
            f"{self.name}: {self.requests} requests -> {results} results, {len(o.terminal)} terminal failures"
            f"{' (' + failures + ')' if failures else ''} in {o.seconds:.1f}s",
            f"start-up {o.first_call - o.spawned:.1f}s (excluded)",
            f"LLM calls {self.calls} = {self.calls / self.requests:.3f} per request; histogram "
            f"{self.stats['request_ids']['calls_histogram']}",
            f"mock outcomes: {outcome_counts}",
            f"retried failures: {retried or 'none'}",
            "cores used: " + ", ".join(f"{name} {used:.2f}" for name, used in self.cores.items()),
        ]
        if o.multiple or o.strangers:
            parts.append(f"requests with more than one outcome: {len(o.multiple)} (e.g. {o.multiple[:3]}); "
                         f"outcomes of other batches: {o.strangers}")
        if self.outage is not None:
            begin, end = self.outage.start - o.first_call, self.outage.end - o.first_call
            parts.append(f"outage from +{begin:.1f}s to +{end:.1f}s (since the first call): {self.outage_calls} "
                         "calls answered 503")
        parts.append("last outcomes (request, outcome, mock's answer to each call): " + "; ".join(self.tail(3)))
        if verbose:
            parts.append("outcomes per second since the first call"
                         + (" ([ ] = the outage)" if self.outage else "") + f": {self.timeline()}")
        return "\n  ".join(parts)

    def tail(self, n: int) -> list[str]:
        """The last ``n`` requests to finish, with the mock's outcome of each of their calls."""
        finished = self.outcomes.finished_s()
        per_id = self.stats.get("per_request_id", {})
        start = self.outcomes.first_call
        out = []
        for rid in sorted(finished, key=finished.__getitem__)[-n:]:
            calls = per_id.get(rid, {}).get("outcomes", [])
            kind = "result" if rid in self.outcomes.results else "failed"
            out.append(f"{rid.rsplit('-', 1)[-1]} {kind} at +{finished[rid] - start:.1f}s [{', '.join(calls)}]")
        return out

    def timeline(self) -> str:
        start = self.outcomes.first_call
        counts: Counter[int] = Counter(int(t - start) for t in self.outcomes.finished_s().values())
        cells = [str(counts.get(s, 0)) for s in range(max(counts, default=-1) + 1)]
        if self.outage is not None:  # brackets around the seconds of the outage
            first, last = int(self.outage.start - start), int(self.outage.end - start)
            if 0 <= first < len(cells):
                cells[first] = "[" + cells[first]
            if 0 <= last < len(cells):
                cells[last] += "]"
        return " ".join(cells)


@dataclass
class GuardBench:
    bench: Bench
    args: argparse.Namespace
    limits: Limits

    def worker_env(self, topology: Topology, llm_url: str, name: str, breaker: bool) -> dict[str, str]:
        env = worker_env(self.bench.bootstrap, topology.prefix, llm_url, self.bench.stack.workdir / f"{name}-data",
                         self.bench.in_flight, self.bench.partitions)
        env.update({
            "STREAMPROC_LLM_RPM": str(self.limits.rpm),
            "STREAMPROC_LLM_TPM": str(self.limits.tpm),
            "STREAMPROC_BREAKER_ENABLED": "true" if breaker else "false",
        })
        if self.args.llm_timeout_s is not None:
            env["STREAMPROC_LLM_TIMEOUT_S"] = f"{self.args.llm_timeout_s:g}"
        return env

    def timeout_s(self, batch: Batch) -> float:
        if self.args.timeout_s is not None:
            return float(self.args.timeout_s)
        rate, _ = self.limits.binding_rate(batch.mean_cost)
        return 600 + 3 * len(batch.requests) / rate + float(self.args.outage_s)  # retries may wait in the 2m tier

    async def one(self, name: str, requests: int, seed: int, breaker: bool, outage_s: float | None) -> GuardRun:
        """One worker over ``requests`` records already on its own requests topic, against a fresh mock."""
        stack = self.bench.stack
        topology = self.bench.topology(name)
        await ensure_topics(KafkaConnection(bootstrap=self.bench.bootstrap), topology.all_topics())
        batch = Batch.make(f"{name}-{self.bench.run_id}", requests)
        await produce_requests(self.bench.bootstrap, topology.requests, batch.requests)
        mock = start_mock(stack, f"mock-{name}", self.limits, seed)
        worker_name = f"worker-{name}"
        env = self.worker_env(topology, mock.url, worker_name, breaker)
        command = [sys.executable, "-m", "streamproc", "worker"]
        workers: list[subprocess.Popen[bytes]] = []

        def spawn() -> subprocess.Popen[bytes]:
            workers.append(stack.spawn(worker_name, command, env))
            return workers[0]

        print(f"{name}: {requests} requests, breaker {'on' if breaker else 'off'}"
              + (f", outage {outage_s:g}s after {self.args.outage_after_s:g}s" if outage_s else ""), flush=True)
        outcomes = Outcomes(batch.ids, time.time())
        first_outcome = outcomes.reached(1)
        window: list[OutageWindow] = []
        injector = (asyncio.create_task(inject_outage(mock, first_outcome, self.args.outage_after_s, outage_s,
                                                      window)) if outage_s else None)
        try:
            watch = await follow(self.bench.bootstrap, topology, outcomes, spawn, self.timeout_s(batch),
                                 self.bench.sampler("worker", mock.process.pid))
            if injector is not None:
                if not injector.done():
                    raise BenchError("the run converged before the outage ended: give it more --outage-requests")
                await injector
            try:
                stats = mock.stats(detail=True)
            except (OSError, ValueError) as exc:
                raise BenchError(f"could not read the mock's /stats: {exc}") from exc
        except BenchError as exc:
            raise BenchError(f"{name}: {exc}\n--- worker log ({stack.log_path(worker_name)}):\n"
                             f"{stack.log_tail(worker_name)}") from exc
        finally:
            if injector is not None:
                injector.cancel()  # no-op when it is done; its exception (if any) was reported or is moot
                with contextlib.suppress(asyncio.CancelledError, BenchError):
                    await injector
            for process in workers:
                stack.stop(process)
            stack.stop(mock.process)
        run = GuardRun(name, requests, batch, outcomes, stats, watch.cores(outcomes.first_call, outcomes.last_outcome),
                       self.limits, window[0] if window else None)
        print(run.describe(self.args.verbose), flush=True)
        return run


# ---- the report ----------------------------------------------------------------------------------------------


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else "met" if ok else "MISSED"


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def report(args: argparse.Namespace, limits: Limits, runs: list[GuardRun]) -> list[str]:
    by_name = {run.name: run for run in runs}
    paced, on, off = by_name.get("paced"), by_name.get("outage-on"), by_name.get("outage-off")
    rows: list[tuple[str, str, str, str]] = []
    warnings: list[str] = []
    section = ""

    def row(measurement: str, result: str, target: str = "", ok: bool | None = None) -> None:
        """A table row; an indented measurement belongs to the last unindented one (its section)."""
        nonlocal section
        if not measurement.startswith(" "):
            section = measurement.split(":", 1)[0]
        rows.append((measurement, result, target, _mark(ok) if ok is not None else ""))
        if ok is False:
            label = measurement if not measurement.startswith(" ") else f"{section}: {measurement.strip()}"
            warnings.append(f"{label} = {result}, target {target}")

    if paced is not None:
        o = paced.outcomes
        minimum, by_rpm, by_tpm = paced.minimum_s()
        calls, tokens = paced.needed()
        ratio = o.seconds / minimum if minimum else float("inf")
        finished = sorted(o.finished_s().values())
        p99 = finished[min(len(finished) - 1, int(0.99 * len(finished)))] - o.first_call
        failures = ", ".join(f"{layer}/{code} {n}" for (layer, code), n in sorted(o.terminal_by_code().items()))
        row(f"paced: {paced.requests} req, completion (first call -> last outcome)", f"{o.seconds:.1f} s")
        row("  99 % of the outcomes", f"{p99:.1f} s", "(info)")
        row("  theoretical minimum max(calls/RPM, tokens/TPM)",
            f"{minimum:.1f} s ({'TPM' if by_tpm >= by_rpm else 'RPM'} binds: {calls} admitted calls -> "
            f"{by_rpm:.1f} s, {tokens:,} tokens -> {by_tpm:.1f} s)", "(info)")
        row("  completion / minimum", f"{ratio:.3f}", f"<= {TARGET_TIME_RATIO:.2f}", ratio <= TARGET_TIME_RATIO)
        fraction = paced.answered_429 / max(1, paced.calls)
        limiter = paced.by_outcome.get(RATE_LIMITED, 0)
        row("  429 answers / calls",
            f"{paced.answered_429} / {paced.calls} = {fraction:.4f} (mock's limiter {limiter}, profile's "
            f"injected {paced.answered_429 - limiter})", f"<= {TARGET_429_FRACTION}", fraction <= TARGET_429_FRACTION)
        row("  outcomes", f"{len(o.results)} results, {len(o.terminal)} terminal failures"
            + (f" ({failures})" if failures else ""), "(info)")
        row("  LLM calls per request", f"{paced.calls / paced.requests:.3f}", "(info)")
    for run in (paced, on, off):
        if run is None:
            continue
        by_id, by_content = run.repeated_after_business_failure
        row(f"{run.name}: calls after a business failure", f"{by_id} by request id, {by_content} by content", "0",
            by_id == by_content == 0)
        one = run.outcomes.exactly_one
        row("  requests with exactly one outcome", f"{one} of {run.requests}", "all",
            one == run.requests and not run.outcomes.multiple)
    if on is not None:
        binding, binding_name = limits.binding_rate(on.batch.mean_cost)
        resume_rate = RESUME_RATE_FRACTION * binding
        if off is not None and on.outage is not None and off.outage is not None:
            ratio = on.outage_calls / off.outage_calls if off.outage_calls else float("inf")
            row(f"outage {args.outage_s:g} s: calls during it, on / off",
                f"{on.outage_calls} / {off.outage_calls} = {ratio:.4f}", f"<= {TARGET_OUTAGE_CALL_RATIO}",
                ratio <= TARGET_OUTAGE_CALL_RATIO)
        for run in (on, off):
            if run is None or run.outage is None:
                continue
            inside = run.outage.calls_inside
            info = run is off  # the target is the guarded pipeline's; without the breaker it is context
            target = "(info)" if info else f"<= {TARGET_RESUME_S:g} s"
            first, rated = run.resume_first_s(), run.resume_rate_s(resume_rate)
            row(f"{run.name}: calls during the outage",
                f"{run.outage_calls} answered 503 ({inside if inside is not None else '?'} arrived in the window)",
                "(info)")
            row("  resume: first result of a call after the outage", _seconds(first), target,
                None if info else first is not None and first <= TARGET_RESUME_S)
            row(f"  resume: results >= {resume_rate:.1f}/s over {RESUME_WINDOW_S:g} s ({RESUME_RATE_FRACTION:.0%} "
                f"of the {binding_name} limit)", _seconds(rated), target,
                None if info else rated is not None and rated <= TARGET_RESUME_S)
            terminal = run.outcomes.terminal_by_code()
            budget = sum(n for (_layer, code), n in terminal.items() if code == "retry_budget_exhausted")
            row("  terminal failures (retry_budget_exhausted)", f"{sum(terminal.values())} ({budget})", "(info)")
    guard_settings = "llm_rpm" in Settings.model_fields
    print()
    mean_cost = runs[0].batch.mean_cost if runs else 0.0
    binding, binding_name = limits.binding_rate(mean_cost) if runs else (0.0, "")
    print(f"streamproc guards benchmark: {os.cpu_count()} CPUs, Python {platform.python_version()}, Kafka "
          f"{DEFAULT_KAFKA_VERSION} ({'given broker' if args.bootstrap else 'private broker'}), "
          f"{args.partitions} partitions, in-flight {args.in_flight}, mock profile realistic, RPM {limits.rpm:,}, "
          f"TPM {limits.tpm:,}, mean cost {mean_cost:.0f} tokens/call -> {binding_name} binds at "
          f"{binding:.1f} calls/s; worker guard settings {'present' if guard_settings else 'ABSENT'}")
    print(table(rows))
    cpus = os.cpu_count() or 1
    for run in runs:
        print(f"cores used during {run.name} (of {cpus}): "
              + ", ".join(f"{name} {used:.2f}" for name, used in run.cores.items()))
    if not guard_settings:
        warnings.append("this streamproc has no guard settings (STREAMPROC_LLM_RPM, ...): the worker ignored "
                        "them, the targets are not expected to be met")
    busy = max(((run.cores.get("other", 0.0), run.name) for run in runs), default=(0.0, ""))
    if busy[0] > OTHER_LOAD_WARNING:
        warnings.append(f"other processes used {busy[0]:.2f} cores during {busy[1]}: the machine was shared")
    for warning in warnings:
        print(f"WARNING: {warning}")
    return warnings


# ---- the command line --------------------------------------------------------------------------------------


RUNS = ("paced", "outage")


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """The guards suite's own options (the issue's numbers are the defaults)."""
    parser.add_argument("--requests", type=int, default=5000, help="requests of the paced run [5000]")
    parser.add_argument("--outage-requests", type=int, default=3000, help="requests of each outage run [3000]")
    parser.add_argument("--outage-s", type=float, default=30.0, help="length of the outage, seconds [30]")
    parser.add_argument("--outage-after-s", type=float, default=15.0,
                        help="seconds of processing (from the first outcome) before the outage [15]")
    parser.add_argument("--rpm", type=int, default=3000, help="the mock's and the worker's requests/min [3000]")
    parser.add_argument("--tpm", type=int, default=300_000, help="the mock's and the worker's tokens/min [300000]")
    parser.add_argument("--seed", type=int, default=1, help="mock seed of the paced run; outage runs use +1 [1]")
    parser.add_argument("--llm-timeout-s", type=float, default=10.0,
                        help="STREAMPROC_LLM_TIMEOUT_S of the worker [10, as scripts/demo; the profile's p99 is "
                             "3 s]: each of the profile's hangs (0.2 %% of calls) costs this long")
    parser.add_argument("--timeout-s", type=float, help="give up on a run after this long [from the limits]")
    parser.add_argument("--runs", choices=("all", *RUNS), default="all",
                        help="all, or only the paced run, or only the two outage runs [all]")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("requests", "outage_requests", "rpm", "tpm", "in_flight", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.outage_s <= 0 or args.outage_after_s < 0:
        parser.error("--outage-s must be positive and --outage-after-s at least 0")


async def run(args: argparse.Namespace, stack: Stack) -> None:
    started = time.monotonic()
    bench = open_bench(args, stack)
    limits = Limits(args.rpm, args.tpm)
    guards = GuardBench(bench, args, limits)
    runs = []
    if args.runs in ("all", "paced"):
        runs.append(await guards.one("paced", args.requests, args.seed, True, None))
    if args.runs in ("all", "outage"):
        runs.append(await guards.one("outage-on", args.outage_requests, args.seed + 1, True, args.outage_s))
        runs.append(await guards.one("outage-off", args.outage_requests, args.seed + 1, False, args.outage_s))
    report(args, limits, runs)
    print(f"(benchmark took {time.monotonic() - started:.0f}s)")


def main(argv: list[str] | None = None) -> None:
    suite_main("python -m benchmarks.guards", __doc__, add_arguments, check_arguments, run, argv)


if __name__ == "__main__":
    main()
