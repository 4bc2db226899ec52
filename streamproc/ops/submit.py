"""``submit``: validate a JSONL batch file whole, then stream its requests onto ``llm.requests``.

Nothing is sent from an invalid file (unless the caller asks to skip invalid lines): a half-sent batch is
worse than a rejected one. Both passes stream the file, so memory does not grow with its size. The
manifest (how many were submitted) is written last, once every request is acknowledged by the broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamproc import codec
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.codec.batch_cap import SPEND_CAP_HEADER, BatchCap, cap_key, encode_batch_cap, encode_cap
from streamproc.codec.manifest import BatchManifest, encode_manifest
from streamproc.core import headers
from streamproc.core.events import InferenceRequest
from streamproc.core.identity import batch_id_problem
from streamproc.core.reuse import REUSE_RESULTS, REUSE_RESULTS_ON
from streamproc.core.scheduling_headers import scheduling_headers
from streamproc.core.spend_cap import Cap
from streamproc.core.tenancy import DEFAULT_TENANCY, Tenancy
from streamproc.core.topology import Topology
from streamproc.errors import ExitCode, UserFacingError
from streamproc.kafka.clients import kafka_producer
from streamproc.kafka.connection import KafkaConnection
from streamproc.ops.input_file import iter_requests, validate_file
from streamproc.ops.input_lines import BatchLimits, LineError
from streamproc.ops.progress import Progress
from streamproc.ops.status import BatchStatusReader
from streamproc.settings import Durability, InputLimits

_CONFIRM_EVERY = 5_000  # deliveries awaited in chunks: bounded memory, still pipelined
# aiokafka's default max_request_size, which the submit producer keeps: every record is checked against it while
# the file is validated, so a record the producer would refuse stops the file before anything is sent
PRODUCER_MAX_REQUEST_BYTES = 1_048_576


class SubmitError(UserFacingError):
    """The batch was not sent; the message is the one-line reason."""

    exit_code = ExitCode.USAGE


class InvalidBatchFile(SubmitError):
    def __init__(self, path: Path, errors: list[LineError], error_count: int) -> None:
        shown = "\n".join(f"  {error}" for error in errors)
        more = f"\n  ... and {error_count - len(errors)} more" if error_count > len(errors) else ""
        super().__init__(f"{path}: {error_count} invalid line(s); nothing was sent "
                         f"(--skip-invalid sends the valid ones):\n{shown}{more}")
        self.errors = errors
        self.error_count = error_count


@dataclass(frozen=True)
class SubmitReport:
    batch_id: str
    sent: int
    skipped_invalid: int
    seconds: float

    def as_json(self) -> dict[str, Any]:
        """``submit --json``."""
        return {"batch_id": self.batch_id, "submitted": self.sent, "skipped_invalid": self.skipped_invalid,
                "seconds": round(self.seconds, 3)}


def limits_of(limits: InputLimits, reuse_results: bool = False, cap: Cap | None = None,
              tenancy: Tenancy = DEFAULT_TENANCY, route: str | None = None) -> BatchLimits:
    """What a line may hold, its record measured with the headers submit sends it with; ``tenancy`` is the
    tenant and priority of every line that names none."""
    return BatchLimits(max_body_bytes=limits.max_body_bytes, default_model=limits.default_model,
                       max_record_bytes=PRODUCER_MAX_REQUEST_BYTES,
                       record_headers=_headers(reuse_results, cap, route), tenancy=tenancy)


def _headers(reuse_results: bool, cap: Cap | None, route: str | None) -> tuple[tuple[str, bytes], ...]:
    reuse = ((REUSE_RESULTS, REUSE_RESULTS_ON),) if reuse_results else ()
    routed = ((headers.ROUTE, route.encode()),) if route is not None else ()
    return reuse + routed + (((SPEND_CAP_HEADER, encode_cap(cap)),) if cap is not None else ())


async def submit_file(connect: Callable[[], KafkaConnection], topology: Topology, durability: Durability,
                      input_limits: InputLimits, path: Path, batch_id: str, *, skip_invalid: bool = False,
                      progress: Progress | None = None, completion_window_s: float | None = None,
                      deadline_s: float | None = None,
                      reuse_results: bool = False, cap: Cap | None = None,
                      tenancy: Tenancy = DEFAULT_TENANCY, route: str | None = None,
                      encode_request: Callable[[InferenceRequest], bytes] = codec.encode) -> SubmitReport:
    """Validate ``path``, send its requests keyed by (batch, custom_id), then write the batch manifest (with the
    end of the completion window, when one is given: what is not called by then ends ``batch_expired``).
    ``connect`` is asked for the connection only once the file is known to be worth sending.

    ``reuse_results``: a request whose input already got an answer is answered with it, without a call; each
    record says so (the manifest does too, but comes last; core.reuse).

    ``deadline_s``: past it (from the submission), a request of a provider-batch-routed model goes by a synchronous
    call instead of a new provider batch; shorter than the completion window.

    ``cap``: the batch's spend cap (design §5.9), written before its first request and carried by each.

    ``tenancy``: ``--tenant``/``--priority``, of every line that names no tenant or priority of its own.

    ``route``: ``--route`` (``provider-batch`` or ``call``), carried by every record and its retries: how the
    requests are answered whatever their models' routes (design §8).

    ``encode_request``: how a request is written (the Confluent wire format when a schema registry is set)."""
    started = time.monotonic()
    if (problem := batch_id_problem(batch_id)) is not None:
        raise SubmitError(f"--batch-id {batch_id!r}: {problem}")
    limits = limits_of(input_limits, reuse_results, cap, tenancy, route)
    report = await asyncio.to_thread(validate_file, path, limits, batch_id)
    if report.error_count and not skip_invalid:
        raise InvalidBatchFile(path, report.errors, report.error_count)
    if report.valid == 0:
        raise SubmitError(f"{path}: no valid request to send ({report.lines} lines)")
    kafka = connect()
    await ensure_pipeline_topics(kafka, topology, durability.replication)
    async with BatchStatusReader(kafka, topology, batch_id) as existing:
        await existing.refresh()
        if existing.manifest is not None:
            forgotten = "" if existing.manifest.forgotten is None else ", forgotten since"
            raise SubmitError(f"batch {batch_id!r} was already submitted ({existing.manifest.submitted} requests "
                              f"from {existing.manifest.source}{forgotten}); choose another --batch-id")

    if progress is not None:
        progress.start(report.valid)
    producer = kafka_producer(kafka, **durability.producer_options(), linger_ms=20,
                                max_batch_size=512 * 1024, compression_type="gzip")
    sent = 0
    record_headers = list(limits.record_headers)  # the headers the records were measured with, and their tenancy's
    try:
        await producer.start()  # inside: a producer the cluster refuses is closed too
        if cap is not None:  # before any request: a worker reading the requests knows the cap
            await producer.send_and_wait(topology.batches, key=cap_key(batch_id),
                                         value=encode_batch_cap(BatchCap(batch_id, cap, int(time.time() * 1000))))
        pending: list[asyncio.Future[object]] = []
        submitted_ms = int(time.time() * 1000)
        for request in iter_requests(path, limits, batch_id, submitted_ms, skip_invalid):
            scheduled_by = scheduling_headers(request)
            # a priority's and tenant group's own topic: a high batch is not read behind a low flood, nor a tenant
            # behind another group's (design §5.11, lanes and tenant groups)
            pending.append(await producer.send(topology.request_topic(request.priority, request.tenant),
                                               key=request.request_id.encode(),
                                               value=encode_request(request),
                                               headers=[*record_headers, *scheduled_by] or None))
            if len(pending) >= _CONFIRM_EVERY:
                sent += await _confirm(pending, progress)
        sent += await _confirm(pending, progress)
        expires_ms = None if completion_window_s is None else submitted_ms + round(completion_window_s * 1000)
        deadline_ms = None if deadline_s is None else submitted_ms + round(deadline_s * 1000)
        manifest = BatchManifest(batch_id, sent, submitted_ms, str(path), report.error_count, expires_ms=expires_ms,
                                 deadline_ms=deadline_ms,
                                 reuse_results=reuse_results, tenant=tenancy.tenant, priority=tenancy.priority)
        await producer.send_and_wait(topology.batches, key=batch_id.encode(), value=encode_manifest(manifest))
    finally:
        await producer.stop()
    return SubmitReport(batch_id, sent, report.error_count, time.monotonic() - started)


async def _confirm(pending: list[asyncio.Future[object]], progress: Progress | None) -> int:
    """Wait until the broker acknowledged every pending send; a failed delivery aborts the submit."""
    count = len(pending)
    await asyncio.gather(*pending)
    pending.clear()
    if progress is not None:
        progress.advance(count)
    return count
