"""One chaos run, start to end: stack up, batch in, faults and poison while it runs, facts out, stack down.

The run acts as the operator and the supervisor would: it submits with ``streamproc submit``, exports with
``streamproc results``, reads ``streamproc status``, and restarts a worker that exited on its own (as
systemd or Kubernetes would). What it measures comes from the broker, the mock's call counts and the
workers' ``/metrics``, never from the processes it is testing saying that all went well.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from streamproc.core.identity import request_id_for
from streamproc.core.topology import Topology, parse_tiers
from streamproc.core.vocabulary import RequestStatus
from streamproc.devstack.chaos.batch import write_batch
from streamproc.devstack.chaos.chaos_stack import ChaosError, ChaosStack, WorkerSlot
from streamproc.devstack.chaos.config import ChaosConfig, RunNames, tenant_name
from streamproc.devstack.chaos.facts import OutcomeReader, StateFollower, body_digest, partition_of, trace_ids
from streamproc.devstack.chaos.fault_schedule import Fault, FaultKind, FiredFault, due, plan_faults
from streamproc.devstack.chaos.group_watch import GroupStallWatch
from streamproc.devstack.chaos.poison import (
    DirectRecord,
    Expect,
    Poison,
    PoisonKind,
    big_body_candidates,
    build_direct,
    build_submitted,
    inject,
)
from streamproc.devstack.chaos.tally import (
    ChaosFacts,
    MeasuredBatch,
    Tally,
    WorkerExit,
    counts_of,
    explained,
    lost_ids,
    tally,
)
from streamproc.devstack.chaos.worker_metrics import HEDGED, REDRIVEN, MetricsLedger, scrape
from streamproc.settings import Settings

Say = Callable[[str], None]
POLL_S = 1.0
SCRAPE_S = 2.0
GROUP_WATCH_S = 5.0
PROGRESS_EVERY_S = 15.0
KILL_READY_WAIT_S = 30.0  # how long a kill waits for its worker to have work in flight


@dataclass
class ChaosReport:
    facts: ChaosFacts
    result: Tally
    work_dir: Path


@dataclass
class _Progress:
    fraction: float = 0.0
    converged_at_s: float | None = None  # when every measured batch had converged
    batch_converged_at_s: dict[str, float] = field(default_factory=dict)  # each batch's (tenant's) own
    batch_submitted_at_s: dict[str, float] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)


class ChaosRun:
    """The moving parts of a run after the stack is up."""

    def __init__(self, config: ChaosConfig, names: RunNames, stack: ChaosStack, work_dir: Path, say: Say) -> None:
        self.config = config
        self.names = names
        self.stack = stack
        self.work_dir = work_dir
        self.say = say
        self.topology = Topology(names.topic_prefix, config.partitions, parse_tiers(config.retry_tiers),
                                 names.app_id)
        self.t0 = time.monotonic()
        self.plan: list[Fault] = plan_faults(workers=config.workers, kills=config.kills,
                                             kill_pause_s=config.kill_pause_s, broker_restarts=config.broker_restarts,
                                             broker_down_s=config.broker_down_s, outage_s=config.outage_s)
        self.fired: list[FiredFault] = []
        self.poison: list[Poison] = []
        self.exits: list[WorkerExit] = []
        self.metrics = MetricsLedger()
        self.progress = _Progress()
        self.batches = [MeasuredBatch(names.tenant_batch_id(i), tenant_name(i) if config.tenants > 1 else None, [],
                                      priority=config.tenant_priority(i)) for i in range(config.tenants)]
        self.states = StateFollower(stack.kafka, self.topology, [b.batch_id for b in self.batches])
        self.outcomes = OutcomeReader(stack.kafka, self.topology)
        self.group_watch = GroupStallWatch(stack.kafka, names.app_id, self.topology.inputs, config.partitions,
                                           self._stall_threshold_s())
        self.submitted_at_s = 0.0
        self._http = httpx.AsyncClient()
        self._stop_faults = asyncio.Event()
        self._restarts: set[asyncio.Task[None]] = set()  # killed workers waiting out their pause
        self._waves: set[asyncio.Task[None]] = set()  # poison waves under way: the run is not settled before they end

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- the run -----------------------------------------------------------------------------------------
    async def execute(self) -> ChaosFacts:
        paths, first = [], 0
        for index, (batch, size) in enumerate(zip(self.batches, self.config.tenant_sizes(), strict=True)):
            paths.append(self.work_dir / (f"batch-{batch.tenant}.jsonl" if batch.tenant else "batch.jsonl"))
            bodies = {request_id_for(batch.batch_id, custom_id): body
                      for custom_id, body in write_batch(paths[-1], size, first).items()}
            self.batches[index] = replace(batch, submitted=list(bodies),
                                          own_bodies={i: body_digest(body) for i, body in bodies.items()})
            first += size
        await self.stack.wait_for_topics([*self.topology.all_topics(), self.topology.state_changelog])
        await self.states.start()
        await self.outcomes.start()
        await self.group_watch.start()
        tasks = [asyncio.create_task(coro) for coro in (self._follow(), self._scrape_loop(), self._supervise(),
                                                        self._watch_group())]
        try:
            # the first wave goes in ahead of the batch, so that real work waits behind it on its partitions
            await self._poison_wave(1, duplicates=False)
            self.submitted_at_s = self.now()
            for batch, path in zip(self.batches, paths, strict=True):  # the largest first: the others wait behind it
                self.progress.batch_submitted_at_s[batch.batch_id] = self.now()
                await self._submit(path, batch.batch_id, *(("--tenant", batch.tenant) if batch.tenant else ()),
                                   *(("--priority", batch.priority) if batch.priority else ()))
                self.say(f"[{self.now():5.0f}s] submitted {len(batch.submitted)} requests as batch {batch.batch_id}"
                         + (f" of {batch.label}" if batch.tenant else ""))
            self.poison += await inject(self.stack.kafka, self._duplicates(1), [])
            faults = asyncio.create_task(self._run_faults())
            try:
                await self._wait_settled()
            finally:
                self._stop_faults.set()
                with contextlib.suppress(asyncio.CancelledError):
                    await faults  # a fault in progress finishes
                await asyncio.gather(*self._restarts, *self._waves)  # a killed worker is started again
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return await self._collect()
        finally:
            for task in [*tasks, *self._restarts, *self._waves]:
                task.cancel()
            await asyncio.gather(*tasks, *self._restarts, *self._waves, return_exceptions=True)
            await self.states.stop()
            await self.outcomes.stop()
            await self.group_watch.stop()
            await self._http.aclose()

    async def _submit(self, path: Path, batch_id: str, *extra: str) -> None:
        code, out = await self.stack.cli("submit", str(path), "--batch-id", batch_id, *extra)
        if code != 0:
            raise ChaosError(f"streamproc submit {path.name} exited with {code}: {out.strip()[-2000:]}")

    async def _wait_settled(self) -> None:
        """Until every measured batch converged and every poison record is explained, or the timeout."""
        deadline = self.submitted_at_s + self.config.timeout_s
        last_said = 0.0
        while self.now() < deadline:
            await asyncio.sleep(POLL_S)
            if self.progress.converged_at_s is not None:
                self._stop_faults.set()
                if not self._waves and all(explained(p, self.outcomes.outcomes)[0] for p in self.poison):
                    self.say(f"[{self.now():5.0f}s] batch converged and every poison record explained")
                    return
            if self.now() - last_said >= PROGRESS_EVERY_S:
                last_said = self.now()
                self._say_progress()
        self.say(f"[{self.now():5.0f}s] TIMEOUT after {self.config.timeout_s:.0f}s")

    def _say_progress(self) -> None:
        status = self.progress.status
        failed = sum(status.get("failed", {}).values()) if status else 0
        alive = sum(1 for w in self.stack.workers if w.alive())
        poison_open = sum(1 for p in self.poison if not explained(p, self.outcomes.outcomes)[0])
        self.say(f"[{self.now():5.0f}s] {self.progress.fraction:6.1%} ended: succeeded {status.get('succeeded', 0)}, "
                 f"failed {failed}, retrying {status.get('retrying', 0)}, in flight {status.get('in_flight', 0)}, "
                 f"pending {status.get('pending', 0)}; poison open {poison_open}; workers up {alive}/"
                 f"{len(self.stack.workers)}")

    async def _follow(self) -> None:
        """Fold the changelog and the outcome topics once a second; note when the batch converged."""
        while True:
            await self.states.poll()
            await self.outcomes.poll()
            statuses = [self.states.status(b.batch_id, len(b.submitted)) for b in self.batches]
            self.progress.status = summed([status.as_json() for status in statuses])
            ended = sum(status.succeeded + status.terminal_failures for status in statuses)
            self.progress.fraction = ended / max(1, sum(status.submitted for status in statuses))
            for status in statuses:
                if status.converged and status.batch_id not in self.progress.batch_converged_at_s:
                    self.progress.batch_converged_at_s[status.batch_id] = self.now()
                    self.say(f"[{self.now():5.0f}s] batch converged: {json.dumps(status.as_json())}")
            if all(status.converged for status in statuses) and self.progress.converged_at_s is None:
                self.progress.converged_at_s = self.now()
            await asyncio.sleep(POLL_S)

    async def _watch_group(self) -> None:
        while True:
            await self.group_watch.observe(self.now())
            await asyncio.sleep(GROUP_WATCH_S)

    async def _scrape_loop(self) -> None:
        while True:
            await self._scrape_all()
            await asyncio.sleep(SCRAPE_S)

    async def _scrape_all(self) -> None:
        for slot in self.stack.workers:
            if slot.alive():
                reading = await scrape(self._http, slot.metrics_port)
                if reading is not None:
                    self.metrics.add(slot.index, slot.incarnation, reading, self.now())

    async def _supervise(self) -> None:
        """Restart a worker that exited on its own, with a growing pause if it keeps exiting."""
        backoff: dict[int, float] = {}
        while True:
            await asyncio.sleep(POLL_S)
            for slot in self.stack.workers:
                if slot.killing or slot.process is None or slot.process.poll() is None:
                    continue
                code = slot.process.returncode
                slot.exits.append(code)
                self.exits.append(WorkerExit(slot.index, code, self.now(), slot.last_words()))
                pause = backoff[slot.index] = min(10.0, backoff.get(slot.index, 1.0) * 2)
                self.say(f"[{self.now():5.0f}s] worker {slot.index} exited on its own with {code}; "
                         f"restarting it in {pause:g}s")
                self._restart_later(slot, pause)

    def _restart_later(self, slot: WorkerSlot, pause: float) -> None:
        """Start the worker again after ``pause`` in the background; ``slot.killing`` until then, so that
        the supervisor does not report it twice and no kill picks it."""
        slot.killing = True

        async def restart() -> None:
            await asyncio.sleep(pause)
            if not slot.alive():
                slot.start()
            slot.killing = False

        _in_background(self._restarts, restart())

    # -- faults ------------------------------------------------------------------------------------------
    async def _run_faults(self) -> None:
        previous = time.monotonic()
        for fault in self.plan:
            while not due(fault, self.progress.fraction, time.monotonic() - previous, self.config.max_fault_gap_s):
                if self._stop_faults.is_set():
                    return
                await asyncio.sleep(0.5)
            if self._stop_faults.is_set():
                return
            await self._fire(fault)
            previous = time.monotonic()

    async def _fire(self, fault: Fault) -> None:
        if fault.kind is FaultKind.POISON_WAVE:  # in the background: a slow submit must not hold the next fault
            _in_background(self._waves, self._fire_one(fault))
        else:
            await self._fire_one(fault)

    async def _fire_one(self, fault: Fault) -> None:
        at, progress = self.now(), self.progress.fraction
        gauge: float | None = None
        note = ""
        if fault.kind is FaultKind.KILL_WORKER:
            assert fault.worker is not None
            slot = self.stack.workers[fault.worker]
            gauge = await self._ready_to_kill(slot)
            at, progress = self.now(), self.progress.fraction
            slot.killing = True
            await asyncio.to_thread(slot.kill)
            shown = "?" if gauge is None else f"{gauge:g}"
            self.say(f"[{at:5.0f}s] SIGKILL worker {slot.index} (in flight {shown}), at {progress:.0%}")
            # its partitions wait for its session to expire, then rebalance twice (it leaves, it comes back)
            self.group_watch.excuse(self.config.session_timeout_s + fault.seconds)
            self._restart_later(slot, fault.seconds)  # the schedule goes on meanwhile: no fault is skipped
        elif fault.kind is FaultKind.RESTART_BROKER:
            self.say(f"[{at:5.0f}s] stopping the broker at {progress:.0%}")
            down = await asyncio.to_thread(self.stack.restart_broker, fault.seconds)
            note = f"unreachable {down:.1f}s"
            self.group_watch.excuse(down + self.config.session_timeout_s)  # no commit, then the group re-forms
            self.say(f"[{self.now():5.0f}s] broker back after {down:.1f}s")
        elif fault.kind is FaultKind.LLM_OUTAGE:
            await asyncio.to_thread(self.stack.outage, fault.seconds)
            self.say(f"[{at:5.0f}s] LLM outage of {fault.seconds:g}s begins at {progress:.0%}")
        else:
            await self._poison_wave(fault.wave)
        self.fired.append(FiredFault(fault, at, progress, self.now() - at, gauge, note))

    async def _ready_to_kill(self, slot: WorkerSlot) -> float | None:
        """Wait until every worker is up (one always keeps the batch moving), then (a while) until this one has
        calls in flight, so that the kill cuts work; its gauge then."""
        while not self._stop_faults.is_set():
            if all(w.alive() and not w.killing for w in self.stack.workers):
                break
            await asyncio.sleep(0.25)
        deadline = time.monotonic() + KILL_READY_WAIT_S
        value: float | None = None
        while time.monotonic() < deadline and not self._stop_faults.is_set():
            reading = await scrape(self._http, slot.metrics_port) if slot.alive() else None
            value = reading.in_flight if reading is not None else None
            if value:
                break
            await asyncio.sleep(0.25)
        return value

    def _tickets(self, wave: int) -> tuple[list[int], list[int]]:
        """Tickets of the batch whose ids poison reuses in this wave: produced duplicates, custom_ids reused."""
        per_kind = self.config.poison_per_kind
        first_batch = range(self.config.tenant_sizes()[0])  # names.batch_id: the batch poison reuses ids of
        tickets = random.Random(self.config.seed * 1000 + wave).sample(first_batch, 2 * per_kind)
        return tickets[:per_kind], tickets[per_kind:]

    def _duplicates(self, wave: int) -> list[DirectRecord]:
        """Second records, other bodies, for ids of the batch (only once the batch is on the broker)."""
        return build_direct(self.topology, self.names, wave, 0, self._tickets(wave)[0], random.Random(wave), 0)

    async def _poison_wave(self, wave: int, *, duplicates: bool = True) -> None:
        config = self.config
        rng = random.Random(config.seed * 1000 + wave)
        direct = build_direct(self.topology, self.names, wave, config.poison_per_kind, [], rng,
                              int(time.time() * 1000))
        big = big_body_candidates(self.topology, self.names, wave, config.big_body_bytes)
        sent = await inject(self.stack.kafka, [*direct, *(self._duplicates(wave) if duplicates else [])], big)
        submitted = build_submitted(self.names, wave, config.poison_per_kind, self._tickets(wave)[1])
        path = self.work_dir / f"poison-{wave}.jsonl"
        path.write_text("".join(line + "\n" for line in submitted.lines))
        code, out = await self.stack.cli("submit", str(path), "--batch-id", submitted.batch_id)
        refused = code != 0 and repr(submitted.duplicated_custom_id) in out
        first_line = next((line.strip() for line in out.splitlines() if line.strip()), "")
        sent.append(Poison(PoisonKind.DUPLICATE_IN_FILE, Expect.REFUSED,
                           f"{submitted.batch_id}: {submitted.duplicated_custom_id}",
                           note=f"submit exited {code}: {first_line[:80]}", refused_as_it_must=refused))
        if code != 0:  # as it must: then the valid lines, the first of the two included
            await self._submit(path, submitted.batch_id, "--skip-invalid")
        twice = request_id_for(submitted.batch_id, submitted.duplicated_custom_id)
        sent += [*submitted.poison, Poison(PoisonKind.DUPLICATE_IN_FILE, Expect.ENDED, twice, request_id=twice,
                                           note="the first of the two lines")]
        self.poison += sent
        self.say(f"[{self.now():5.0f}s] poison wave {wave}: {len(sent)} records")

    # -- the facts ---------------------------------------------------------------------------------------
    async def _collect(self) -> ChaosFacts:
        await self._scrape_all()
        await self.group_watch.observe(self.now())
        stalled_at_end = frozenset((w, t, p) for w, parts in self.metrics.stalled_now.items() for t, p in parts)
        for _ in range(3):  # late duplicates
            await self.outcomes.poll()
            await asyncio.sleep(0.5)
        await self.states.poll()
        assert self.stack.mock is not None and self.stack.proxy is not None
        stats = await asyncio.to_thread(self.stack.mock.stats, detail=True)
        calls = {i: int(entry["calls"]) for i, entry in stats.get("per_request_id", {}).items()}
        ledger = self.stack.proxy.ledger()
        batches = [await self._read_back(batch) for batch in self.batches]
        outcomes = self.outcomes.outcomes
        lost = [i for b in batches for i in lost_ids(b.batch_id, b.submitted, outcomes)]
        not_terminal = [i for b in batches for i in b.submitted if (entry := self.states.latest.get(i)) is None
                        or entry.state.status not in (RequestStatus.SUCCEEDED, RequestStatus.FAILED)]
        unfinished = sorted(set(lost) | set(not_terminal))
        batch_of = {i: b.batch_id for b in batches for i in b.submitted}
        described = {i: self._describe_state(i, batch_of[i]) for i in unfinished}
        trace = await trace_ids(self.stack.kafka, self.topology, unfinished[:20]) if unfinished else []
        if unfinished:
            where = Counter(partition_of(i, self.config.partitions) for i in unfinished)
            trace.insert(0, "not ended, by requests partition: " + ", ".join(
                f"{self.topology.requests}[{p}]: {n}" for p, n in sorted(where.items())))
        return ChaosFacts(
            batches=batches, outcomes=outcomes, llm_calls=calls, planned=self.plan, fired=self.fired,
            call_drops_s=[t - self.t0 for t in ledger.drops],
            stalls=self.metrics.stalls, group_stalls=self.group_watch.readings,
            stall_threshold_s=self._stall_threshold_s(), stalled_at_end=stalled_at_end,
            redriven=self.metrics.total(REDRIVEN), hedged=self.metrics.total(HEDGED),
            converged_at_s=self.progress.converged_at_s, submitted_at_s=self.submitted_at_s, wall_s=self.now(),
            poison=self.poison, unplanned_exits=self.exits, unfinished_states=described, trace=trace)

    async def _read_back(self, batch: MeasuredBatch) -> MeasuredBatch:
        """The batch's export and its status (summaries and ``--verify``) at the end."""
        exported = await self._export(batch)
        verified_json = await self._status(batch.batch_id, "--verify")
        status_json = await self._summary_status(batch.batch_id, verified_json)
        converged_at = self.progress.batch_converged_at_s.get(batch.batch_id)
        after = None if converged_at is None else converged_at - self.progress.batch_submitted_at_s[batch.batch_id]
        return replace(batch, export_ids=exported, status_json=status_json, verified_json=verified_json,
                       converged_after_s=after)

    def _stall_threshold_s(self) -> float:
        """The workers' watchdog threshold, as they compute it: slowest retry tier plus the LLM timeout."""
        timeout = self.config.llm_timeout_s or float(Settings.model_fields["llm_timeout_s"].default)
        return self.topology.tiers[-1].delay_ms / 1000 + timeout

    def _describe_state(self, request_id: str, batch_id: str) -> str:
        entry = self.states.latest.get(request_id)
        ended = self.outcomes.outcomes.get(batch_id, request_id)
        outcome = f"; outcome topics: {ended.results} result(s), terminal {ended.terminal_codes or 'none'}"
        if entry is None:
            return "no state written (never admitted by a worker)" + outcome
        s = entry.state
        return (f"{s.status.value}, attempt {s.attempts}, last {s.last_layer.value if s.last_layer else '-'}/"
                f"{s.last_error_code or '-'}, started by {s.source_topic}@{s.source_offset}, partition "
                f"{entry.partition}, updated {time.strftime('%X', time.localtime(s.updated_ms / 1000))}" + outcome)

    async def _export(self, batch: MeasuredBatch) -> list[str]:
        suffix = f"-{batch.tenant}" if batch.tenant else ""
        output, errors = self.work_dir / f"results{suffix}.jsonl", self.work_dir / f"errors{suffix}.jsonl"
        code, out = await self.stack.cli("results", "--batch-id", batch.batch_id, "--output", str(output),
                                         "--errors", str(errors))
        if code != 0:
            raise ChaosError(f"streamproc results exited with {code}: {out.strip()[-2000:]}")
        return await asyncio.to_thread(export_ids, output, errors)

    async def _summary_status(self, batch_id: str, verified: dict[str, Any] | None) -> dict[str, Any] | None:
        """``status`` from the workers' summaries, asked again until it counts what ``--verify`` counted (a worker
        writes what changed once a second, and a partition moved by a kill is written whole once restored) or
        ``SUMMARY_WAIT_S`` passed."""
        deadline = time.monotonic() + SUMMARY_WAIT_S
        while True:
            status = await self._status(batch_id)
            if (verified is None or status is None or counts_of(status) == counts_of(verified)
                    or time.monotonic() > deadline):
                return status
            await asyncio.sleep(1.0)

    async def _status(self, batch_id: str, *extra: str) -> dict[str, Any] | None:
        code, out = await self.stack.cli("status", "--batch-id", batch_id, "--json", *extra)
        if code != 0:
            self.say(f"streamproc status exited with {code}: {out.strip()[-500:]}")
            return None
        try:
            parsed: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None
        return parsed


SUMMARY_WAIT_S = 20.0
PROGRESS_COUNTS = ("succeeded", "retrying", "in_flight", "pending")


def summed(statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """The progress line's counts over every measured batch (``failed`` by code, the rest plain)."""
    total: dict[str, Any] = {key: sum(s.get(key, 0) for s in statuses) for key in PROGRESS_COUNTS}
    total["failed"] = dict(sum((Counter(s.get("failed", {})) for s in statuses), Counter()))
    return total


def _in_background(tasks: set[asyncio.Task[None]], work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` as a task kept in ``tasks`` while it runs (the run awaits or cancels what is left)."""
    task = asyncio.create_task(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


def tenants_settings(config: ChaosConfig, work_dir: Path) -> dict[str, str]:
    """With tenants, a tenants file naming each with weight 1 (equal shares), as the workers' setting."""
    if config.tenants == 1:
        return {}
    path = work_dir / "tenants.json"
    path.write_text(json.dumps({tenant_name(i): 1 for i in range(config.tenants)}))
    return {"tenants_file": str(path)}


def export_ids(*paths: Path) -> list[str]:
    """The custom_id of every line of the export files, in order (repeats kept: they are what is counted)."""
    ids: list[str] = []
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            ids += [json.loads(line)["custom_id"] for line in lines if line.strip()]
    return ids


async def run_chaos(config: ChaosConfig, say: Say = print) -> ChaosReport:
    """Run the whole thing; everything started is stopped again, also on an error or Ctrl-C/SIGTERM."""
    names = RunNames.new()
    work_dir = config.work_dir or Path(tempfile.mkdtemp(prefix="streamproc-chaos-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    stack = ChaosStack(config, names, work_dir)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    if main is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread: no handlers
            loop.add_signal_handler(signal.SIGTERM, main.cancel)
    ok = False
    try:
        say(f"chaos run {names.run_id} (work dir {work_dir})")
        began = time.monotonic()
        await asyncio.to_thread(stack.start_broker)
        say(f"broker at {stack.bootstrap} ({time.monotonic() - began:.0f}s)")
        await asyncio.to_thread(stack.start_llm)
        assert stack.mock is not None and stack.proxy is not None
        rpm = f", {config.mock_rpm} RPM" if config.mock_rpm else ""
        say(f"mock LLM ({config.mock_profile}{rpm}) at {stack.mock.url}, proxy at {stack.proxy.url}")
        await asyncio.to_thread(stack.start_workers, **tenants_settings(config, work_dir))
        say(f"{config.workers} workers starting (logs: {work_dir}/worker-*.log)")
        run = ChaosRun(config, names, stack, work_dir, say)
        facts = await run.execute()
        result = tally(facts)
        ok = result.ok
        return ChaosReport(facts, result, work_dir)
    finally:
        say("stopping the workers, the mock and the broker...")
        await asyncio.to_thread(stack.stop)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGTERM)
        if ok and config.work_dir is None and not config.keep_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
