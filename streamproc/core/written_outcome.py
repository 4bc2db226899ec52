"""An outcome already on Kafka for a member of a provider batch taken over (design §8, "the crash window is a
batch wide"). Pure: ``app.written_outcomes`` reads the outcome topics, ``app.provider_batch_route`` uses it.

A worker killed after it wrote the outcomes of a provider batch's lines, but before their state writes and the
batch's ``ended`` record reached the broker, leaves the batch open and its members ``in_flight``: the next owner
polls the same ended batch, and its lines would answer the redelivered records again (a second result each). So the
next owner first looks for the members' outcomes written since the batch was opened; a member whose attempt has
a result or a terminal failure written ends from it (its state is written, nothing is sent again). A retried
attempt's failure event is not taken: its retry record may not have been written (it goes after the event), so
that line answers again, and its event is repeated keyed alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamproc.core.events import FailureEvent, InferenceResult
from streamproc.core.outcome import Failure, Success


@dataclass(frozen=True)
class WrittenOutcome:
    """How an attempt ended, read from its event: the result's answer (with the tokens the provider counted) or the
    terminal failure."""

    attempt: int
    ended: Success | Failure


def written_result(result: InferenceResult, tokens: tuple[int, int]) -> WrittenOutcome:
    return WrittenOutcome(result.attempts, Success(result.content, result.model, *tokens))


def written_failure(event: FailureEvent) -> WrittenOutcome | None:
    """The terminal failure an event ends its request with; None for a retried attempt's (see the module)."""
    if not event.terminal:
        return None
    return WrittenOutcome(event.attempt, Failure(event.layer, event.error_code, event.message, event.http_status))


def for_attempt(written: list[WrittenOutcome], gathered_for: int | None) -> WrittenOutcome | None:
    """The outcome written for the attempt a line was gathered for (None: a record without attempts, whose line
    answers the latest attempt: the latest written)."""
    fitting = [w for w in written if gathered_for is None or w.attempt == gathered_for]
    return max(fitting, key=lambda w: w.attempt, default=None)
