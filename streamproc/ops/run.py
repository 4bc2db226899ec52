"""``run``: the whole job in one command — submit, follow the batch until it converged, export.

On a machine with nothing configured it brings up the local stack (broker, worker, and the mock LLM server
when asked for), so ``streamproc run requests.jsonl --output out.jsonl --mock-llm realistic`` works on a fresh
machine; with no LLM URL and no ``--mock-llm`` it refuses rather than answer a real file with fake answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamproc.app.bootstrap import resolve_connection
from streamproc.core.batch_stall import BatchStall
from streamproc.core.batch_status import BatchStatus
from streamproc.core.topology import Topology
from streamproc.devstack.stack import LocalStack
from streamproc.errors import ExitCode, UserFacingError
from streamproc.kafka.connection import KafkaConnection
from streamproc.kafka.schema_registry import request_encoder
from streamproc.ops.progress import Progress
from streamproc.ops.results import ExportReport, export_results
from streamproc.ops.status import BatchStatusReader
from streamproc.ops.submit import SubmitReport, submit_file
from streamproc.settings import Settings


class RunError(UserFacingError):
    """The batch did not converge (a worker died, or the timeout passed)."""

    exit_code = ExitCode.FAILED


class NoLLMError(UserFacingError):
    """No LLM endpoint is configured and the mock was not asked for: a real file never gets fake answers."""


@dataclass(frozen=True)
class RunReport:
    submit: SubmitReport
    status: BatchStatus
    export: ExportReport
    seconds: float
    llm_calls: int | None  # known when the mock server answered

    def as_json(self) -> dict[str, Any]:
        """``run --json``: what was sent, how the batch ended (``status --json``), where the lines went."""
        return {"batch_id": self.status.batch_id, "seconds": round(self.seconds, 3), "llm_calls": self.llm_calls,
                "submit": self.submit.as_json(), "status": self.status.as_json(), "export": self.export.as_json()}


Notify = Callable[[str], None]
"""Where ``run`` says what people should know while it waits (a batch that stopped moving)."""


async def follow_until_converged(kafka: KafkaConnection, topology: Topology, batch_id: str, *, timeout_s: float,
                                 stall_after_s: float, stack: LocalStack | None, progress: Progress | None,
                                 notify: Notify | None = None) -> BatchStatus:
    """Poll the batch's status (incrementally) until every request ended; say so, and why, whenever the batch
    stops moving (for ``stall_after_s``) or waits for another reason than before."""
    deadline = time.monotonic() + timeout_s
    async with BatchStatusReader(kafka, topology, batch_id) as reader:
        done = 0
        told: dict[str, int] | None = None
        while True:
            status = await reader.refresh()
            ended = status.ended
            if progress is not None:
                progress.start(status.submitted)
                progress.advance(ended - done)
            done = ended
            if status.converged:
                return status
            if stack is not None and not stack.workers_alive():
                raise RunError(f"the worker stopped before the batch converged; see {stack.worker_log(0)}")
            stall = await reader.stall(status, stall_after_s)
            if time.monotonic() > deadline:
                why = f"; {stall.describe()}" if stall is not None else ""
                raise RunError(f"batch {batch_id} did not converge within {timeout_s:.0f}s: {status.as_json()}{why}")
            if notify is not None and _news(stall, told):
                notify(stall.describe() if stall is not None else f"batch {batch_id} is moving again")
            told = None if stall is None else stall.reasons
            await asyncio.sleep(1.0)


def _news(stall: BatchStall | None, told: dict[str, int] | None) -> bool:
    """A stall begins or ends, or its reasons change (not merely their counts)."""
    if stall is None or told is None:
        return (stall is None) != (told is None)
    return set(stall.reasons) != set(told)


def run_batch(settings: Settings, file: Path, output: Path, errors: Path | None, batch_id: str,
              timeout_s: float, mock_profile: str | None, workers: int | None, notify: Notify | None = None,
              reuse_results: bool = False) -> RunReport:
    """Submit, follow and export, starting what the configuration lacks; the mock LLM server only when
    ``mock_profile`` names one (it then answers instead of any configured endpoint)."""
    if mock_profile is None and not settings.llm_base_url and settings.models_file is None:
        raise NoLLMError("no LLM endpoint: set STREAMPROC_LLM_BASE_URL (and STREAMPROC_LLM_API_KEY) or "
                         "STREAMPROC_MODELS_FILE, or pass --mock-llm realistic to try the built-in mock server, whose "
                         "answers are fake")
    started = time.monotonic()
    with LocalStack(settings, mock_profile=mock_profile, workers=workers) as stack:
        effective = stack.settings
        kafka = resolve_connection(effective)
        topology = effective.topology()
        with Progress(f"submitting {file.name}") as bar:
            submitted = asyncio.run(submit_file(
                lambda: kafka, topology, effective.durability, effective.input_limits, file, batch_id, progress=bar,
                reuse_results=reuse_results, encode_request=request_encoder(effective.schema_registry, topology)))
        with Progress("processing") as bar:
            status = asyncio.run(follow_until_converged(
                kafka, topology, batch_id, timeout_s=timeout_s, stall_after_s=effective.stall_after_s, stack=stack,
                progress=bar, notify=notify))
        exported = export_results(kafka, topology, batch_id, output, errors)
        calls = int(stack.mock.stats()["calls"]) if stack.mock is not None else None
    return RunReport(submitted, status, exported, time.monotonic() - started, calls)


def format_outcome(report: RunReport) -> str:
    """The outcome table printed at the end of ``run`` (and by the demo)."""
    status = report.status
    rows = [("submitted", status.submitted), ("succeeded", status.succeeded)]
    rows += [(f"failed: {layer}", count) for layer, count in status.failed.items()]
    lines = [f"{name:<18} {count:>9}" for name, count in rows]
    if report.llm_calls is not None:
        lines.append(f"{'LLM calls spent':<18} {report.llm_calls:>9}"
                     f"  ({report.llm_calls / max(status.submitted, 1):.2f} per request)")
    lines.append(f"{'time':<18} {report.seconds:>8.1f}s")
    lines.append(f"results: {report.export.output} ({report.export.results} lines)")
    if report.export.errors_path is not None:
        lines.append(f"errors:  {report.export.errors_path} ({report.export.failures} lines)")
    return "\n".join(lines)
