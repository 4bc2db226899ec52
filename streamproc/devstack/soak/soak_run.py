"""One soak run: batches submitted all the time, a worker SIGKILLed on a schedule, a sample every minute.

It reuses the chaos run's stack (a private broker, the mock LLM behind its proxy, worker slots that can be
killed and started again). What it samples, per minute: each worker's resident memory, open files and CPU
time (``/proc``) with the results it wrote (its ``/metrics``), the state changelog's bytes on the broker's
disk, the states the table holds (the sum of ``batches``' counts), and how long ``status --batch-id`` and
``batches`` take; after each restart, how long the worker took to restore its table. Then a slope per
measure, and a leak wherever a slope is past its bound (``trend``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from streamproc.devstack.chaos.batch import batch_line, ticket_body
from streamproc.devstack.chaos.chaos_stack import ChaosStack, WorkerSlot
from streamproc.devstack.chaos.config import ChaosConfig, RunNames
from streamproc.devstack.chaos.worker_metrics import RESULTS, scrape
from streamproc.devstack.soak.probes import changelog_bytes, open_files_by_kind, read_process, recovered_at
from streamproc.devstack.soak.trend import Bound, Point, Verdict, judge, pooled_slope, slope

Say = Callable[[str], None]

WARM_UP_MIN = 2.0  # an incarnation's first minutes (imports, caches, restore) are not part of its slope

BOUNDS = {  # a slope past these is a leak; the relative ones are % of the measure's mean over the run
    "rss": Bound("worker memory (RSS)", "MB", 3.0),
    "fds": Bound("worker open files", "files", 0.5),
    "cpu": Bound("CPU time per result", "% of mean", 2.0),
    "states": Bound("states in the table", "% of mean", 2.0),
    "status": Bound("status --batch-id latency", "% of mean", 2.0),
    "batches": Bound("batches latency", "% of mean", 2.0),
    "restore": Bound("restore after a restart", "% of mean", 2.0),
}


@dataclass(frozen=True)
class SoakConfig:
    minutes: float = 30.0
    workers: int = 2
    kill_every_s: float = 300.0
    kill_pause_s: float = 5.0
    batch_requests: int = 300
    batches_ahead: int = 2  # batches submitted and not yet converged, kept topped up
    sample_every_s: float = 60.0
    retain_finished: str = "3m"  # STREAMPROC_RETAIN_FINISHED of the workers
    mock_profile: str = "realistic"
    mock_rpm: int | None = 3000
    seed: int = 1
    work_dir: Path | None = None
    keep_work_dir: bool = False

    def stack_config(self) -> ChaosConfig:
        return ChaosConfig(workers=self.workers, kills=0, mock_profile=self.mock_profile, mock_rpm=self.mock_rpm,
                           seed=self.seed, retry_tiers="2s,5s,15s", work_dir=self.work_dir)


@dataclass
class Samples:
    rss: list[Point] = field(default_factory=list)
    fds: list[Point] = field(default_factory=list)
    fds_by_kind: dict[str, list[Point]] = field(default_factory=dict)  # what the open files are, for the report
    cpu_per_result: list[tuple[float, float]] = field(default_factory=list)
    changelog_mb: list[tuple[float, float]] = field(default_factory=list)
    states: list[tuple[float, float]] = field(default_factory=list)
    status_s: list[tuple[float, float]] = field(default_factory=list)
    batches_s: list[tuple[float, float]] = field(default_factory=list)
    restore_s: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class SoakReport:
    samples: Samples
    verdicts: list[Verdict]
    submitted: list[str]
    converged: set[str]
    kills: int
    work_dir: Path

    @property
    def unfinished(self) -> list[str]:
        return [batch for batch in self.submitted if batch not in self.converged]

    @property
    def ok(self) -> bool:
        return not self.unfinished and not any(verdict.leaks for verdict in self.verdicts)

    def lines(self) -> list[str]:
        s = self.samples
        rows = [f"{len(self.submitted)} batches submitted, {len(self.converged)} converged, {self.kills} SIGKILLs",
                _series("changelog on disk (MB)", s.changelog_mb), _series("states in the table", s.states),
                _series("status --batch-id (s)", s.status_s), _series("batches (s)", s.batches_s),
                _series("restore after restart (s)", s.restore_s),
                _series("CPU s per 1000 results", [(m, v * 1000) for m, v in s.cpu_per_result])]
        rows += [verdict.line() for verdict in self.verdicts]
        rows += [_kind_line(kind, points) for kind, points in sorted(s.fds_by_kind.items())]
        if self.unfinished:
            rows.append(f"NOT CONVERGED: {', '.join(self.unfinished)}")
        return rows


def _kind_line(kind: str, points: list[Point]) -> str:
    """One kind of open file: its slope within the workers' lives (not judged: the total is) and its range."""
    rate = pooled_slope(points)
    counts = [p.value for p in points]
    slope_text = "n/a" if rate is None else f"{rate:+.3f} /min"
    return f"  open files, {kind:<14} {min(counts):.0f}-{max(counts):.0f}, slope {slope_text}"


def _series(name: str, points: list[tuple[float, float]]) -> str:
    values = " ".join(f"{v:.3g}" for _, v in points)
    return f"{name:<28} {values or '(none)'}"


class SoakRun:
    def __init__(self, config: SoakConfig, names: RunNames, stack: ChaosStack, say: Say) -> None:
        self.config = config
        self.names = names
        self.stack = stack
        self.say = say
        self.began = time.monotonic()
        self.samples = Samples()
        self.submitted: list[str] = []
        self.converged: set[str] = set()
        self.kills = 0
        self._cpu: dict[tuple[int, int], tuple[float, float]] = {}  # (slot, incarnation) -> (cpu s, results)
        self._restarts: list[tuple[WorkerSlot, int, datetime, int]] = []  # slot, incarnation, start, log offset

    def minute(self) -> float:
        return (time.monotonic() - self.began) / 60

    async def execute(self) -> SoakReport:
        end = self.began + self.config.minutes * 60
        tasks = [asyncio.create_task(self._submit_until(end)), asyncio.create_task(self._kill_until(end)),
                 asyncio.create_task(self._sample_until(end))]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        await self._drain(timeout_s=300.0)
        return SoakReport(self.samples, self._verdicts(), self.submitted, self.converged, self.kills,
                          self.stack.work_dir)

    # -- the load ------------------------------------------------------------------------------------------
    async def _submit_until(self, end: float) -> None:
        while time.monotonic() < end:
            await self._check_converged()
            if len([b for b in self.submitted if b not in self.converged]) < self.config.batches_ahead:
                await self._submit(len(self.submitted))
            await asyncio.sleep(5.0)

    async def _submit(self, index: int) -> None:
        batch_id = f"soak-{index:04d}"
        path = self.stack.work_dir / f"{batch_id}.jsonl"
        lines = (batch_line(f"t-{i}", ticket_body(index * 7919 + i)) + "\n" for i in range(self.config.batch_requests))
        await asyncio.to_thread(path.write_text, "".join(lines), encoding="utf-8")
        code, output = await self.stack.cli("submit", str(path), "--batch-id", batch_id)
        if code != 0:
            self.say(f"submit of {batch_id} failed ({code}): {output.strip()[-300:]}")
            return
        path.unlink()
        self.submitted.append(batch_id)

    async def _check_converged(self) -> None:
        for batch_id in [b for b in self.submitted if b not in self.converged]:
            with contextlib.suppress(TimeoutError, ValueError):
                _, output = await self.stack.cli("status", "--batch-id", batch_id, "--json", timeout_s=120)
                if json.loads(output).get("converged"):
                    self.converged.add(batch_id)

    async def _drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.converged) < len(self.submitted):
            await self._check_converged()
            await asyncio.sleep(5.0)

    async def _kill_until(self, end: float) -> None:
        while True:
            await asyncio.sleep(self.config.kill_every_s)
            if time.monotonic() >= end:
                return
            slot = self.stack.workers[self.kills % len(self.stack.workers)]
            slot.killing = True
            await asyncio.to_thread(slot.kill)
            self.kills += 1
            await asyncio.sleep(self.config.kill_pause_s)
            offset = slot.log_path.stat().st_size if slot.log_path.exists() else 0
            started = datetime.now()
            slot.killing = False
            await asyncio.to_thread(slot.start)
            self._restarts.append((slot, slot.incarnation, started, offset))
            self.say(f"minute {self.minute():.1f}: worker {slot.index} SIGKILLed and restarted")

    # -- the samples ---------------------------------------------------------------------------------------
    async def _sample_until(self, end: float) -> None:
        async with httpx.AsyncClient() as client:
            while time.monotonic() < end:
                await asyncio.sleep(self.config.sample_every_s)
                await self._sample(client)

    async def _sample(self, client: httpx.AsyncClient) -> None:
        minute = self.minute()
        cpu_spent = results = 0.0
        for slot in self.stack.workers:
            if slot.process is None or not slot.alive():
                continue
            process = read_process(slot.process.pid)
            reading = await scrape(client, slot.metrics_port)
            if process is None or reading is None:
                continue
            key = (slot.index, slot.incarnation)
            if (time.monotonic() - slot.started_at) / 60 >= WARM_UP_MIN:
                self.samples.rss.append(Point(key, minute, process.rss_mb))
                self.samples.fds.append(Point(key, minute, process.open_files))
                for kind, count in open_files_by_kind(slot.process.pid).items():
                    self.samples.fds_by_kind.setdefault(kind, []).append(Point(key, minute, count))
            written = reading.counters.get(RESULTS, 0.0)
            before = self._cpu.get(key)
            if before is not None:
                cpu_spent += process.cpu_s - before[0]
                results += written - before[1]
            self._cpu[key] = (process.cpu_s, written)
        if results > 0:
            self.samples.cpu_per_result.append((minute, cpu_spent / results))
        broker_data = self.stack.work_dir / "broker"
        mb = await asyncio.to_thread(changelog_bytes, broker_data, f"{self.names.app_id}-request_state-changelog")
        self.samples.changelog_mb.append((minute, mb / 1e6))
        await self._time_commands(minute)
        self._read_restores()
        self.say(f"minute {minute:.1f}: {len(self.submitted)} batches submitted, {len(self.converged)} converged; "
                 f"RSS {' '.join(f'{p.value:.0f}' for p in self.samples.rss[-len(self.stack.workers):])} MB; "
                 f"changelog {mb / 1e6:.1f} MB")

    async def _time_commands(self, minute: float) -> None:
        done = [b for b in self.submitted if b in self.converged]
        if done:
            began = time.monotonic()
            code, _ = await self.stack.cli("status", "--batch-id", done[-1], "--json", timeout_s=120)
            if code == 0:
                self.samples.status_s.append((minute, time.monotonic() - began))
        began = time.monotonic()
        code, output = await self.stack.cli("batches", "--limit", "0", "--json", timeout_s=120)
        if code == 0:
            self.samples.batches_s.append((minute, time.monotonic() - began))
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entries = json.loads(output)["data"]
                live = [entry["counts"] for entry in entries if entry["status"] != "forgotten"]
                self.samples.states.append((minute, sum(_states(counts) for counts in live)))

    def _read_restores(self) -> None:
        waiting = []
        for slot, incarnation, started, offset in self._restarts:
            with open(slot.log_path, "rb") as log:
                log.seek(offset)
                recovered = recovered_at(log.read().decode(errors="replace"))
            if recovered is None:
                waiting.append((slot, incarnation, started, offset))
            else:
                minute = self.minute()
                self.samples.restore_s.append((minute, (recovered - started).total_seconds()))
        self._restarts = waiting

    def _verdicts(self) -> list[Verdict]:
        s = self.samples
        half = self.config.minutes / 2  # the table fills for a retention period before it can level off
        return [
            judge(BOUNDS["rss"], pooled_slope(s.rss)),
            judge(BOUNDS["fds"], pooled_slope(s.fds)),
            judge(BOUNDS["cpu"], slope(_relative(s.cpu_per_result))),
            judge(BOUNDS["states"], slope(_relative([p for p in s.states if p[0] >= half]))),
            judge(BOUNDS["status"], slope(_relative(s.status_s))),
            judge(BOUNDS["batches"], slope(_relative(s.batches_s))),
            judge(BOUNDS["restore"], slope(_relative(s.restore_s))),
        ]


def _states(counts: Mapping[str, Any]) -> int:
    """The states a batch's counts say the table holds: every request a worker has seen."""
    failed = counts.get("failed") or {}
    return sum(int(n) for n in failed.values()) + sum(int(counts.get(key) or 0)
                                                       for key in ("succeeded", "retrying", "in_flight"))


def _relative(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Each value as a percentage of the series' mean, so one bound fits measures of any size."""
    if not points:
        return []
    mean = sum(v for _, v in points) / len(points)
    return [(m, 100 * v / mean) for m, v in points] if mean > 0 else []


async def run_soak(config: SoakConfig, say: Say = print) -> SoakReport:
    """Run it; everything started is stopped again, also on an error or Ctrl-C."""
    names = RunNames.new()
    work_dir = config.work_dir or Path(tempfile.mkdtemp(prefix="streamproc-soak-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    stack = ChaosStack(config.stack_config(), names, work_dir)
    ok = False
    try:
        say(f"soak run {names.run_id}: {config.minutes:g} min, {config.workers} workers, a SIGKILL every "
            f"{config.kill_every_s:g} s, retention {config.retain_finished} (work dir {work_dir})")
        await asyncio.to_thread(stack.start_broker)
        await asyncio.to_thread(stack.start_llm)
        await asyncio.to_thread(stack.start_workers, retain_finished=config.retain_finished)
        report = await SoakRun(config, names, stack, say).execute()
        ok = report.ok
        return report
    finally:
        say("stopping the workers, the mock and the broker...")
        await asyncio.to_thread(stack.stop)
        if ok and config.work_dir is None and not config.keep_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
