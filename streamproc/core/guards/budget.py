"""A retry budget per batch: retries stay a bounded fraction of the work, whatever fails.

Per-request attempt limits bound each request, not the batch: when a whole batch fails (a bad prompt
template, a provider outage that the breaker does not see) every request would use all its attempts and
multiply the load. The budget allows ``minimum + ratio x first attempts`` retries per batch; beyond that a
retryable failure is made terminal (``retry_budget_exhausted``), and backfill can replay it later. Two kinds of
retry are no part of a storm and spend nothing (core.retry_policy): a 429's, which the rate limiter paces,
and an escalation, a cut answer sent again with more room, which its own rule bounds.

The counts are per worker and in memory: each worker sees its partitions' share of a batch's first
attempts and retries, so the ratio holds across workers too. Counted alone, first attempts *so far* make
the budget strict early in a batch (an outage in its first minute exhausts it) and after a restart (the
count begins again while the batch's retries go on). So a caller that knows how many first attempts of the
batch are its share (the batch manifest's ``submitted`` count, times this worker's share of partitions)
passes that, and the larger of the two counts. Retries spent are also kept per request in the state table
(``retries_spent``): the worker's table sweep sums them per batch and raises the counts here to those sums
(:meth:`RetryBudget.at_least`), so a restart forgets them only until the first sweep.
"""

from __future__ import annotations

from collections import OrderedDict

from streamproc.core.events import RequestState
from streamproc.core.request_state import first_attempt_made

EXHAUSTED_REASON = "retry_budget_exhausted"


class RetryBudget:
    """Retries per batch <= minimum + ratio x first attempts; beyond it retryable failures become terminal
    (retry_budget_exhausted)."""

    def __init__(self, ratio: float = 0.2, minimum: int = 10, max_batches: int = 10_000) -> None:
        if not ratio >= 0:
            raise ValueError(f"ratio must be >= 0, got {ratio}")
        if minimum < 0:
            raise ValueError(f"minimum must be >= 0, got {minimum}")
        if max_batches < 1:
            raise ValueError(f"max_batches must be >= 1, got {max_batches}")
        self._ratio = ratio
        self._minimum = minimum
        self._max_batches = max_batches
        self._batches: OrderedDict[str, list[int]] = OrderedDict()  # batch -> [first attempts, retries]

    def on_first_attempt(self, batch: str) -> None:
        self._entry(batch)[0] += 1

    def try_spend(self, batch: str, expected_first_attempts: float = 0.0) -> bool:
        """True (and counted) if one more retry of ``batch`` fits in its budget; the budget is measured against
        the first attempts seen or ``expected_first_attempts``, whichever is larger."""
        entry = self._entry(batch)
        first_attempts = max(float(entry[0]), expected_first_attempts)
        if entry[1] + 1 > self._minimum + self._ratio * first_attempts + 1e-9:  # 0.2 x 15 is 3.0000000000000004
            return False
        entry[1] += 1
        return True

    def at_least(self, batch: str, first_attempts: int, retries: int) -> None:
        """Raise the counts of ``batch`` to what the durable state says (a restarted worker's memory starts
        empty; the table sweep sums its partitions' states), never lower them."""
        entry = self._entry(batch)
        entry[0] = max(entry[0], first_attempts)
        entry[1] = max(entry[1], retries)

    def counts(self, batch: str) -> tuple[int, int]:
        """(first attempts, retries spent) of ``batch``; (0, 0) if unknown or forgotten."""
        entry = self._batches.get(batch)
        return (entry[0], entry[1]) if entry is not None else (0, 0)

    def _entry(self, batch: str) -> list[int]:
        """The counts of ``batch``, now the most recently used; the least recently used beyond the cap go."""
        entry = self._batches.get(batch)
        if entry is None:
            entry = self._batches[batch] = [0, 0]
            while len(self._batches) > self._max_batches:
                self._batches.popitem(last=False)
        else:
            self._batches.move_to_end(batch)
        return entry


class SpentTally:
    """Sums, per batch, the first attempts and budget-spending retries recorded in request states (the table
    sweep feeds it one state at a time, then hands :meth:`totals` to :meth:`RetryBudget.at_least`).

    A first attempt counts only once it is behind the request (:func:`first_attempt_made`): the budget's memory
    is raised to the tally and then counts each first call as it is sent, so a request admitted or parked but not
    yet called would be counted twice, and the batch granted more retries than its ratio allows."""

    def __init__(self) -> None:
        self._totals: dict[str, list[int]] = {}

    def add(self, state: RequestState) -> None:
        if not first_attempt_made(state):
            return
        entry = self._totals.setdefault(state.batch_id or "", [0, 0])
        entry[0] += 1
        entry[1] += state.retries_spent

    def totals(self) -> dict[str, tuple[int, int]]:
        """batch -> (first attempts, retries spent)."""
        return {batch: (first, retries) for batch, (first, retries) in self._totals.items()}
