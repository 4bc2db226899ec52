"""Waiting for a provider batch to end, and reading its members' outcomes as its results arrive (issue 31): the
I/O around :mod:`streamproc.core.provider_batch_polling` (when to poll) and
:mod:`streamproc.core.provider_batch_lines` (what a line means).

Used by the worker's route, ``app.provider_batch_route`` (design §8).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Final, Protocol

from streamproc.core.outcome import ConfigurationProblem
from streamproc.core.provider_batch_lines import LineOutcome, MalformedLine, anthropic_line, openai_line
from streamproc.core.provider_batch_objects import ProviderBatchView
from streamproc.core.provider_batch_polling import (
    PollPolicy,
    after_answer,
    after_failure,
    first_poll,
    missing_outcomes,
)
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.provider_batches import BatchCallFailed

_PASSING: Final = frozenset({FailureLayer.TRANSPORT, FailureLayer.SERVICE})  # failures a later poll may not meet


class BatchApi(Protocol):
    """What the poller needs of a provider's client (:mod:`streamproc.llm.provider_batches`)."""

    async def retrieve(self, batch_id: str) -> ProviderBatchView: ...

    def ended_lines(self, view: ProviderBatchView) -> AsyncIterator[str]: ...


async def wait_until_ended(api: BatchApi, batch_id: str, policy: PollPolicy,
                           sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> ProviderBatchView:
    """Poll until the batch has ended, backing off as the policy says. A transport or service failure is waited
    out (the batch is still open at the provider); any other (a refused key, an unknown batch id, a 400) is
    raised: the same poll would get the same answer forever."""
    state = first_poll(policy)
    while True:
        try:
            view = await api.retrieve(batch_id)
        except BatchCallFailed as exc:
            if isinstance(exc.outcome, ConfigurationProblem) or exc.outcome.layer not in _PASSING:
                raise
            state = after_failure(policy, state, exc.outcome.retry_after_ms)
        else:
            if view.phase.ended:
                return view
            state = after_answer(policy, state, view)
        await sleep(state.delay_s)


async def member_outcomes(api: BatchApi, view: ProviderBatchView, members: Iterable[str],
                          unusable: Callable[[str], None]) -> AsyncIterator[LineOutcome]:
    """One outcome per member of the ended batch: each line's as it is read, then the members no line named.
    A line that is not the provider's shape, names no member or names one a second time goes to ``unusable``
    (to be logged), never into an outcome. A download that breaks raises :class:`BatchCallFailed`; read again,
    the batch gives the same outcomes (the caller skips the members it has already written)."""
    parse = openai_line if view.provider == "openai" else anthropic_line
    wanted = list(members)
    open_members = set(wanted)
    async for raw in api.ended_lines(view):
        try:
            outcome = parse(raw)
        except MalformedLine as exc:
            unusable(f"provider batch {view.batch_id}: {exc}: {raw[:200]!r}")
            continue
        if outcome.custom_id not in open_members:
            unusable(f"provider batch {view.batch_id}: a line for {outcome.custom_id!r}, not an open member")
            continue
        open_members.discard(outcome.custom_id)
        yield outcome
    answered = set(wanted) - open_members
    for missing in missing_outcomes(view, wanted, answered):
        yield missing
