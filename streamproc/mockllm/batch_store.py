"""The mock's provider-batch state: uploaded files, and batches with their lines and the answers given so far.

Kept in memory for the life of the server. A batch's lines are answered lazily: whenever the batch is looked
at, the lines due by now (``batch_timeline.answered_by``) are run through the engine, so the stats count them
as the batch advances and a test that never looks at a batch costs nothing.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamproc.mockllm.batch_settings import BatchSettings
from streamproc.mockllm.batch_timeline import ENDED, Phase, answered_by, phase_at, timeline


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


@dataclass(frozen=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int

    def describe(self) -> dict[str, Any]:
        """OpenAI's ``file`` object."""
        return {"id": self.id, "object": "file", "bytes": len(self.content), "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "status_details": None, "expires_at": None}


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch: the caller's ``custom_id`` and the OpenAI chat/completions body it runs as."""

    custom_id: str
    body: bytes


@dataclass(frozen=True)
class LineAnswer:
    """What the mock answered one line: an HTTP status and its JSON body, and the answer's request id."""

    status: int
    body: dict[str, Any]
    request_id: str

    @property
    def ok(self) -> bool:
        return self.status == 200


Answerer = Callable[[BatchLine], LineAnswer]


@dataclass
class ProviderBatch:
    """A batch of either provider; its phase is a function of the clock (see ``batch_timeline``)."""

    id: str
    settings: BatchSettings
    lines: list[BatchLine]
    created_mono: float
    created_wall: float
    details: dict[str, Any] = field(default_factory=dict)  # the provider's own fields (endpoint, metadata, ...)
    cancelled_at: float | None = None  # seconds after creation
    answers: list[LineAnswer] = field(default_factory=list)  # of the first len(answers) lines

    def elapsed(self, now: float) -> float:
        return now - self.created_mono

    def steps(self) -> list[tuple[Phase, float]]:
        return timeline(self.settings, self.cancelled_at)

    def phase(self, now: float) -> Phase:
        return phase_at(self.steps(), self.elapsed(now))

    def reached(self, phase: Phase, now: float) -> int | None:
        """When (Unix seconds) the batch entered ``phase``; None if it has not (or never will)."""
        for step, at in self.steps():
            if step is phase and at <= self.elapsed(now):
                return int(self.created_wall + at)
        return None

    def catch_up(self, now: float, answer: Answerer) -> Phase:
        """Answer the lines due by ``now``; the phase now."""
        due = answered_by(self.settings, len(self.lines), self.elapsed(now), self.cancelled_at)
        for line in self.lines[len(self.answers):due]:
            self.answers.append(answer(line))
        return self.phase(now)

    def ended(self, now: float) -> bool:
        return self.phase(now) in ENDED

    def unanswered(self) -> list[BatchLine]:
        return self.lines[len(self.answers):]

    def answered(self) -> Iterator[tuple[BatchLine, LineAnswer]]:
        return zip(self.lines, self.answers, strict=False)


@dataclass
class BatchStore:
    files: dict[str, StoredFile] = field(default_factory=dict)
    batches: dict[str, ProviderBatch] = field(default_factory=dict)  # in creation order

    def add_file(self, filename: str, purpose: str, content: bytes, created_at: int) -> StoredFile:
        stored = StoredFile(new_id("file-"), filename, purpose, content, created_at)
        self.files[stored.id] = stored
        return stored

    def describe(self, now: float, providers: Mapping[str, str]) -> dict[str, Any]:
        """What ``/stats`` shows: files held, and per provider (name -> id prefix) the batches created, the
        lines answered so far and the batches in each phase (OpenAI's names)."""
        out: dict[str, Any] = {"files": len(self.files)}
        for name, prefix in providers.items():
            chosen = [b for b in self.batches.values() if b.id.startswith(prefix)]
            phases = Counter(b.phase(now).value for b in chosen)
            out[name] = {"created": len(chosen), "lines_answered": sum(len(b.answers) for b in chosen),
                         "by_phase": dict(sorted(phases.items()))}
        return out

    def batch(self, batch_id: str, prefix: str) -> ProviderBatch | None:
        """The batch of that id, if it is one of the provider whose ids start with ``prefix``."""
        batch = self.batches.get(batch_id)
        return batch if batch is not None and batch_id.startswith(prefix) else None

    def page(
        self, prefix: str, after: str | None, limit: int, *, newest_first: bool
    ) -> tuple[list[ProviderBatch], bool]:
        """Batches whose id starts with ``prefix``, after the one named ``after``; and whether more follow."""
        chosen = [b for b in self.batches.values() if b.id.startswith(prefix)]
        if newest_first:
            chosen.reverse()
        if after is not None:
            ids = [b.id for b in chosen]
            chosen = chosen[ids.index(after) + 1:] if after in ids else []
        return chosen[:limit], len(chosen) > limit


def page_size(raw: str | None, most: int, default: int = 20) -> int | None:
    """A list call's ``limit`` query parameter; None when it is not an integer in 1..``most``."""
    try:
        limit = default if raw is None else int(raw)
    except ValueError:
        return None
    return limit if 1 <= limit <= most else None
