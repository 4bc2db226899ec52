"""When a provider batch is in which phase, and how many of its lines are answered by then: pure functions of
the settings, the number of lines, the seconds since creation and when a cancel came.

OpenAI's phases: validating → in_progress → finalizing → completed, or validating → failed, or in_progress →
expired (what was answered is kept), or validating/in_progress → cancelling → cancelled. Anthropic shows the
same run as in_progress → (canceling →) ended.
"""

from __future__ import annotations

import math
from enum import StrEnum

from streamproc.mockllm.batch_settings import BatchSettings


class Phase(StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


ENDED = frozenset({Phase.FAILED, Phase.COMPLETED, Phase.EXPIRED, Phase.CANCELLED})
CANCELLABLE = frozenset({Phase.VALIDATING, Phase.IN_PROGRESS})


def timeline(settings: BatchSettings, cancelled_at: float | None = None) -> list[tuple[Phase, float]]:
    """Each phase the batch goes through with the second (since creation) it starts, in order."""
    start = settings.validating_seconds
    if settings.fail_validation:
        steps = [(Phase.VALIDATING, 0.0), (Phase.FAILED, start)]
    else:
        end = start + settings.in_progress_seconds
        steps = [(Phase.VALIDATING, 0.0), (Phase.IN_PROGRESS, start)]
        if settings.expire_after is not None:
            steps.append((Phase.EXPIRED, end))
        else:
            steps += [(Phase.FINALIZING, end), (Phase.COMPLETED, end + settings.finalizing_seconds)]
    if cancelled_at is None:
        return steps
    kept = [(phase, at) for phase, at in steps if at <= cancelled_at]
    if kept[-1][0] not in CANCELLABLE:  # the cancel came too late to change anything
        return steps
    return [*kept, (Phase.CANCELLING, cancelled_at), (Phase.CANCELLED, cancelled_at + settings.cancelling_seconds)]


def phase_at(steps: list[tuple[Phase, float]], elapsed: float) -> Phase:
    current = steps[0][0]
    for phase, at in steps:
        if at <= elapsed:
            current = phase
    return current


def answered_by(settings: BatchSettings, total: int, elapsed: float, cancelled_at: float | None = None) -> int:
    """How many lines (the first ones, in file order) are answered ``elapsed`` seconds after creation."""
    if settings.fail_validation:
        return 0
    if cancelled_at is not None and cancelled_at < elapsed:
        elapsed = cancelled_at
    running = elapsed - settings.validating_seconds
    if running < 0:
        return 0
    share = 1.0 if running >= settings.in_progress_seconds else running / settings.in_progress_seconds
    if settings.expire_after is not None:
        share = min(share, settings.expire_after)
    return min(total, math.floor(total * share))
