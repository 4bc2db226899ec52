"""Packing requests into provider batches (issue 31): one model per batch, as OpenAI requires of a batch
file, sealed when the next request would pass the provider's request or byte limit, or the room its members' ids
take in the batch's durable record (one Kafka record), or when the oldest request has waited ``max_age_ms``.
Pure: the caller gives the clock and uploads what is sealed.

Used by the worker's route, ``app.provider_batch_route`` (design §8).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from streamproc.core.record_size import RECORD_BYTES

MB: Final = 1024 * 1024
RECORD_ROOM: Final = RECORD_BYTES - 16 * 1024  # the record's members, beside its other fields (ids, model, times)

SealReason = Literal["requests", "bytes", "record", "age", "flush"]


@dataclass(frozen=True)
class BatchLimits:
    """A provider's limits on one batch; ``line_overhead`` and ``envelope_bytes`` are what its format adds
    around the lines (OpenAI: a newline per line; Anthropic: a comma per request and ``{"requests":[]}``)."""

    max_requests: int
    max_bytes: int
    max_age_ms: int
    line_overhead: int = 1
    envelope_bytes: int = 0
    max_record_bytes: int = RECORD_ROOM  # what the members may take of the batch's durable record

    def __post_init__(self) -> None:
        if self.max_requests < 1 or self.max_age_ms < 0 or self.max_bytes <= self.envelope_bytes + self.line_overhead:
            raise ValueError(f"batch limits cannot hold a request: {self}")

    @property
    def max_line_bytes(self) -> int:
        """The longest line a batch of its own can take."""
        return self.max_bytes - self.envelope_bytes - self.line_overhead


OPENAI_LIMITS: Final = BatchLimits(max_requests=50_000, max_bytes=200 * MB, max_age_ms=60_000)
ANTHROPIC_LIMITS: Final = BatchLimits(max_requests=100_000, max_bytes=256 * MB, max_age_ms=60_000,
                                      envelope_bytes=len(b'{"requests":[]}'))


class LineTooLarge(ValueError):
    """A request longer than a whole provider batch may be: it cannot go by this route."""


@dataclass(frozen=True)
class PendingLine:
    """One request as its provider batch carries it: the caller's id, its model and its line's bytes."""

    custom_id: str
    model: str
    line: bytes
    record_bytes: int = 0  # what the member takes in the batch's durable record (its id and attempt)


@dataclass(frozen=True)
class SealedBatch:
    """Requests of one model, in the order they came, ready to upload; ``reason`` says what sealed it."""

    model: str
    lines: tuple[PendingLine, ...]
    size_bytes: int
    reason: SealReason


@dataclass
class _Open:
    opened_ms: int
    lines: list[PendingLine] = field(default_factory=list)
    size_bytes: int = 0
    record_bytes: int = 0


class BatchGatherer:
    """Open batches per model; ``add`` and ``due`` give back the batches they seal."""

    def __init__(self, limits: BatchLimits) -> None:
        self.limits = limits
        self._open: dict[str, _Open] = {}

    def add(self, pending: PendingLine, now_ms: int) -> list[SealedBatch]:
        """Put one request into its model's open batch. A batch it would overflow is sealed first, and a batch it
        fills is sealed with it. Raises :class:`LineTooLarge` for a line no batch can hold (nothing is kept)."""
        limits = self.limits
        if len(pending.line) > limits.max_line_bytes:
            raise LineTooLarge(f"request {pending.custom_id!r} is {len(pending.line)} bytes; a provider batch holds "
                               f"lines of at most {limits.max_line_bytes} bytes")
        sealed: list[SealedBatch] = []
        cost = len(pending.line) + limits.line_overhead
        current = self._open.get(pending.model)
        if current is not None and current.size_bytes + cost > limits.max_bytes:
            sealed.append(self._seal(pending.model, "bytes"))
            current = None
        elif current is not None and current.record_bytes + pending.record_bytes > limits.max_record_bytes:
            sealed.append(self._seal(pending.model, "record"))
            current = None
        if current is None:
            current = self._open[pending.model] = _Open(now_ms, size_bytes=limits.envelope_bytes)
        current.lines.append(pending)
        current.size_bytes += cost
        current.record_bytes += pending.record_bytes
        if len(current.lines) >= limits.max_requests:
            sealed.append(self._seal(pending.model, "requests"))
        return sealed

    def due(self, now_ms: int) -> list[SealedBatch]:
        """Seal every open batch whose oldest request has waited ``max_age_ms``."""
        old = [model for model, batch in self._open.items() if now_ms - batch.opened_ms >= self.limits.max_age_ms]
        return [self._seal(model, "age") for model in old]

    def next_due_ms(self) -> int | None:
        """When the next open batch comes of age; None when none is open."""
        if not self._open:
            return None
        return min(batch.opened_ms for batch in self._open.values()) + self.limits.max_age_ms

    def flush(self) -> list[SealedBatch]:
        """Seal everything open (shutting down, or handing the partitions over)."""
        return [self._seal(model, "flush") for model in list(self._open)]

    def open_count(self) -> int:
        return sum(len(batch.lines) for batch in self._open.values())

    def _seal(self, model: str, reason: SealReason) -> SealedBatch:
        batch = self._open.pop(model)
        return SealedBatch(model, tuple(batch.lines), batch.size_bytes, reason)
