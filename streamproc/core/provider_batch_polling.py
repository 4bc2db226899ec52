"""When to look at an open provider batch again, and what its members came to once it ended (issue 31). Pure:
the I/O loop (``streamproc.llm.provider_batch_poller``) gives the clock and the answers.

A provider batch runs for minutes to hours, so polling backs off: from ``first_s`` it doubles while nothing
changes, up to ``max_s``, and goes back to ``first_s`` when the batch makes progress or changes phase (it is
then likely to end soon: its output is wanted as it comes). A poll that fails (a 5xx, a refused connection)
backs off the same way; the batch is still open at the provider, so nothing is lost by waiting.

Once the batch has ended, every member gets exactly one outcome: its line's, or, for a member the provider's
results do not name (a line lost or malformed), ``provider_batch_line_missing``, and for each member of a batch
that failed validation ``provider_batch_failed``: service failures, so they go back through the retry tiers as
an expired line does.

Used by the worker's route, ``app.provider_batch_route`` (design §8).
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Final

from streamproc.core.outcome import Failure, truncate
from streamproc.core.provider_batch_lines import LineOutcome
from streamproc.core.provider_batch_objects import BatchPhase, ProviderBatchView
from streamproc.core.vocabulary import FailureLayer

LINE_MISSING: Final = "provider_batch_line_missing"
BATCH_FAILED: Final = "provider_batch_failed"


@dataclass(frozen=True)
class PollPolicy:
    first_s: float = 5.0
    max_s: float = 300.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s or self.factor < 1:
            raise ValueError(f"a poll policy needs 0 < first_s <= max_s and factor >= 1: {self}")


@dataclass(frozen=True)
class PollState:
    """What the last poll saw and how long the poller waits before the next."""

    delay_s: float
    seen: tuple[str, int] | None = None  # (phase, finished) of the last answer


def first_poll(policy: PollPolicy) -> PollState:
    return PollState(policy.first_s)


def after_answer(policy: PollPolicy, state: PollState, view: ProviderBatchView) -> PollState:
    """The state after a poll answered: back to ``first_s`` on progress or a new phase, else backed off."""
    seen = (view.phase.value, view.finished)
    if state.seen is None or seen != state.seen:
        return PollState(policy.first_s, seen)
    return PollState(_backed_off(policy, state.delay_s), seen)


def after_failure(policy: PollPolicy, state: PollState, retry_after_ms: int | None = None) -> PollState:
    """The state after a poll failed: backed off, and never sooner than the provider's ``Retry-After``."""
    delay = _backed_off(policy, state.delay_s)
    if retry_after_ms is not None:
        delay = max(delay, retry_after_ms / 1000)
    return PollState(delay, state.seen)


def _backed_off(policy: PollPolicy, delay_s: float) -> float:
    return min(policy.max_s, delay_s * policy.factor)


def missing_outcomes(view: ProviderBatchView, members: Iterable[str], seen: Container[str]) -> list[LineOutcome]:
    """The outcomes of the members of an ended batch that no line named, in the members' order: a service
    failure each, ``provider_batch_failed`` with the provider's validation errors when the batch failed as a
    whole, else ``provider_batch_line_missing``."""
    if view.phase is BatchPhase.FAILED:
        code, why = BATCH_FAILED, "failed validation: " + ("; ".join(view.errors) or "no errors given")
    else:
        code, why = LINE_MISSING, f"ended ({view.phase.value}) without a result line for this request"
    message = truncate(f"provider batch {view.batch_id} {why}")
    return [LineOutcome(custom_id, Failure(FailureLayer.SERVICE, code, message))
            for custom_id in members if custom_id not in seen]
