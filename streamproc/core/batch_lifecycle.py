"""A batch's lifecycle as OpenAI's batch object tells it: its status and when it reached each step.

Everything is derived from what ``status`` already reads: the manifest (created, cancelled, completion window)
and the request states (when a worker first took a request, when the last one ended). Times are epoch
milliseconds here and Unix seconds in the JSON, as OpenAI's ``*_at`` fields.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from streamproc.core.batch_status import BatchStatus


@dataclass(frozen=True)
class Lifecycle:
    """OpenAI's batch ``status`` and its timestamps (None: not reached)."""

    status: str  # in_progress, cancelling, cancelled, expired, completed; forgotten (ours: ``streamproc forget``)
    created_ms: int
    in_progress_ms: int | None = None  # a worker first took a request of the batch
    expires_ms: int | None = None  # the end of the completion window
    completed_ms: int | None = None  # the last request ended (converged), neither cancelled nor past the window
    cancelling_ms: int | None = None  # ``streamproc cancel`` ran
    cancelled_ms: int | None = None  # a cancelled batch converged
    expired_ms: int | None = None  # a batch converged past its completion window
    forgotten_ms: int | None = None  # its states were forgotten (it had ended: the end above stays)

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, "created_at": _seconds(self.created_ms),
                **{f"{step}_at": _seconds(getattr(self, f"{step}_ms")) for step in _STEPS}}


_STEPS = ("in_progress", "expires", "completed", "cancelling", "cancelled", "expired", "forgotten")


def _seconds(ms: int | None) -> int | None:
    return None if ms is None else ms // 1000


def lifecycle(status: BatchStatus, created_ms: int, cancelled_ms: int | None = None,
              expires_ms: int | None = None, forgotten_ms: int | None = None) -> Lifecycle:
    """The lifecycle of a batch from its counts and manifest times (``cancelled_ms``: when cancel ran).

    A batch is ``in_progress`` until every request ended; a cancelled one ``cancelling`` until then. Once
    converged it is ``cancelled`` if cancel ran, ``expired`` if its last request ended at or after the end of
    its completion window (the window's deadline ended what was left), else ``completed``; the step's time is
    when the last request ended. A forgotten batch is ``forgotten``, its end kept.
    """
    ended = _ended(status, created_ms, cancelled_ms, expires_ms)
    return ended if forgotten_ms is None else replace(ended, status="forgotten", forgotten_ms=forgotten_ms)


def _ended(status: BatchStatus, created_ms: int, cancelled_ms: int | None, expires_ms: int | None) -> Lifecycle:
    base = Lifecycle("in_progress" if cancelled_ms is None else "cancelling", created_ms,
                     in_progress_ms=status.first_started_ms or None, expires_ms=expires_ms, cancelling_ms=cancelled_ms)
    if not status.converged:
        return base
    ended = status.last_progress_ms
    if cancelled_ms is not None:
        return replace(base, status="cancelled", cancelled_ms=max(ended, cancelled_ms))
    if expires_ms is not None and ended >= expires_ms:
        return replace(base, status="expired", expired_ms=ended)
    return replace(base, status="completed", completed_ms=ended)
