"""``streamproc forget``: remove finished batches' states so that the state table, its changelog and every restore
stop growing with all history (design §8, "State size"); the work is :class:`streamproc.app.forgetting.BatchForgetter`.

A forgotten batch's results and failures stay on their topics (exports and the sink are untouched); ``status`` and
``batches`` report it as forgotten with the counts and usage it ended with; a request of it that arrives later is
refused as the business failure ``batch_forgotten``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from streamproc.app.forgetting import BatchForgetter, Forgetting
from streamproc.core.topology import Topology
from streamproc.errors import ExitCode, UserFacingError
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Durability


class NotForgottenError(UserFacingError):
    """A batch named was unknown or had not finished (the others named were forgotten)."""

    exit_code = ExitCode.USAGE


def cutoff_ms(date: datetime) -> int:
    """``--finished-before``: a date or time without a zone is UTC."""
    return round((date if date.tzinfo is not None else date.replace(tzinfo=UTC)).timestamp() * 1000)


async def forget(kafka: KafkaConnection, topology: Topology, durability: Durability, batch_ids: Sequence[str],
                 finished_before: datetime | None, force: bool) -> list[Forgetting]:
    """Forget the batches named (finished ones, or any with ``force``) and those that finished before the date."""
    forgetter = BatchForgetter(kafka, topology, durability.producer_options())
    done = await forgetter.forget(batch_ids, force) if batch_ids else []
    if finished_before is not None:
        done += await forgetter.forget_finished_before(cutoff_ms(finished_before))
    return done


def refused(outcomes: Sequence[Forgetting]) -> NotForgottenError | None:
    """The error the command ends with when a batch named could not be forgotten, or None."""
    reasons = [outcome.refused for outcome in outcomes if outcome.refused is not None]
    return NotForgottenError("; ".join(reasons)) if reasons else None


def as_json(outcome: Forgetting) -> dict[str, Any]:
    """One batch's line of ``forget --json``."""
    kept = outcome.forgotten
    return {"batch_id": outcome.batch_id, "forgotten": kept is not None, "states_removed": outcome.states,
            "forgotten_at": None if kept is None else kept.at_ms // 1000,
            "finished_at": None if kept is None else kept.finished_ms // 1000, "refused": outcome.refused}


def describe(outcome: Forgetting) -> str:
    """One batch's line for people."""
    if outcome.forgotten is None:
        return f"batch {outcome.batch_id}: not forgotten: {outcome.refused}"
    return (f"batch {outcome.batch_id}: forgotten, {outcome.states} states removed ({outcome.forgotten.succeeded} "
            f"succeeded, {sum(outcome.forgotten.failed.values())} failed); its results and failures stay")
