"""A provider-batch route with fakes around it (design §8): a provider whose new batches are refused at create, so a
member gathered anew is told apart; a record log kept in memory; the takeover's records, the poll and the lines
given by the test. Used by the route's unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Iterable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from streamproc.app import provider_batch_route as route_module
from streamproc.app.provider_batch_route import ProviderBatchRoute
from streamproc.core.events import InferenceRequest
from streamproc.core.outcome import Failure
from streamproc.core.provider_batch_gatherer import OPENAI_LIMITS
from streamproc.core.provider_batch_lines import LineOutcome
from streamproc.core.provider_batch_objects import BatchPage, BatchPhase, ProviderBatchView
from streamproc.core.provider_batch_takeover import ProviderBatchRecord, RecordState
from streamproc.core.vocabulary import FailureLayer
from streamproc.core.written_outcome import WrittenOutcome
from streamproc.llm.client import CallResult
from streamproc.llm.provider_batches import BatchCallFailed
from streamproc.llm.routed import Deferred
from streamproc.settings import ProviderBatchSettings

BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
REFUSED = Failure(FailureLayer.SERVICE, "invalid_json_line", "the batch was refused by validation")
GATHERED_ANEW = Failure(FailureLayer.SERVICE, "second_batch", "the member went into a new batch")
EXPIRED = Failure(FailureLayer.SERVICE, "batch_expired", "the provider batch expired before running the line")
LINES = {"batch_1": REFUSED, "batch_2": EXPIRED}  # each provider batch's lines


class FakeApi:
    """A provider whose new batches are refused at create, so a member gathered anew is told apart."""

    provider = "openai"
    limits = OPENAI_LIMITS

    def __init__(self) -> None:
        self.submitted: list[list[bytes]] = []
        self.listed: tuple[ProviderBatchView, ...] = ()  # what a look for a batch created all the same finds

    async def page(self, after_id: str | None = None) -> BatchPage:
        return BatchPage(self.listed, False, None)

    @staticmethod
    def line(custom_id: str, body: dict[str, Any]) -> bytes:
        return f"{custom_id}:{body['model']}".encode()

    async def submit(self, lines: list[bytes], gather_id: str) -> object:
        self.submitted.append(lines)
        raise BatchCallFailed("create", GATHERED_ANEW)

    async def cancel(self, batch_id: str) -> None:
        pass

    async def aclose(self) -> None:
        pass


class FakeLog:
    def __init__(self) -> None:
        self.written: list[ProviderBatchRecord] = []
        self.forgotten: list[str] = []

    async def write(self, record: ProviderBatchRecord) -> None:
        self.written.append(record)

    async def forget(self, gather_id: str) -> None:
        self.forgotten.append(gather_id)


TAKEN_OVER = ProviderBatchRecord("g-1", "openai", "gpt-test", 0, ("r1", "r2"), RecordState.OPEN, 1, 1,
                                 provider_batch_id="batch_1", attempts=(1, 1))


class FakeOutcomes:
    """The outcomes written before a takeover, as given by the test; ``asked`` records each read."""

    def __init__(self, written: dict[str, list[WrittenOutcome]], unreadable: bool = False) -> None:
        self.written = written
        self.unreadable = unreadable
        self.asked: list[tuple[int, int, frozenset[str]]] = []

    async def since(self, partition: int, since_ms: int, members: Collection[str],
                    ) -> dict[str, list[WrittenOutcome]]:
        self.asked.append((partition, since_ms, frozenset(members)))
        if self.unreadable:
            raise OSError("the outcome topics could not be read")
        return {member: outcomes for member, outcomes in self.written.items() if member in members}


class Rig:
    """The route over partition 0, whose takeover reads ``records`` (once ``readable`` is set: cleared, a takeover
    waits mid-read); a provider batch ends once ``lines_due`` is set, and ``polls`` counts who waited for it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *records: ProviderBatchRecord,
                 written: FakeOutcomes | None = None, max_age_ms: int = 0) -> None:
        self.lines_due = asyncio.Event()
        self.readable = asyncio.Event()
        self.readable.set()
        self.polls: list[str] = []  # provider batch ids, once per poll begun
        self.api, self.log = FakeApi(), FakeLog()

        async def owned(reader: object, owned: object, unreadable: object) -> dict[str, ProviderBatchRecord]:
            await self.readable.wait()
            return {record.gather_id: record for record in records}

        async def ended(api: object, batch_id: str, policy: object) -> ProviderBatchView:
            self.polls.append(batch_id)
            await self.lines_due.wait()
            return ProviderBatchView("openai", batch_id, BatchPhase.FAILED, 2, 0)

        async def outcomes(api: object, view: ProviderBatchView, members: Iterable[str],
                           unusable: object) -> AsyncIterator[LineOutcome]:
            for custom_id in members:
                yield LineOutcome(custom_id, LINES[view.batch_id])

        @asynccontextmanager
        async def reader() -> AsyncIterator[object]:
            yield object()

        monkeypatch.setattr(route_module, "owned_records", owned)
        monkeypatch.setattr(route_module, "wait_until_ended", ended)
        monkeypatch.setattr(route_module, "member_outcomes", outcomes)
        settings = ProviderBatchSettings(routed_models=frozenset({"gpt-test"}), api="openai", max_requests=10,
                                         max_age_ms=max_age_ms, first_poll_s=0.01, max_poll_s=0.01)
        self.outcomes = written or FakeOutcomes({})
        self.giving_way = False  # a rebalance or stop under way
        self.route = ProviderBatchRoute(settings, self.api, self.log, reader,  # type: ignore[arg-type]
                                        outcomes=self.outcomes, giving_way=lambda: self.giving_way)

    async def call(self, request_id: str, attempt: int) -> Failure:
        result = await self.raw_call(request_id, attempt)
        assert isinstance(result, CallResult) and isinstance(result.outcome, Failure)
        return result.outcome

    async def raw_call(self, request_id: str, attempt: int) -> CallResult | WrittenOutcome | Deferred:
        return await asyncio.wait_for(
            self.route.call(InferenceRequest(request_id, "{}", batch_id="b"), dict(BODY), attempt, partition=0), 5)

    async def answered(self, request_id: str, attempt: int) -> Failure:
        """The call's answer, its outcome then written by the handler (as ``Handler._call`` tells the route)."""
        try:
            return await self.call(request_id, attempt)
        finally:
            self.route.written(request_id)

    async def ended_and_tombstoned(self, gather_id: str) -> None:
        for _ in range(100):
            if gather_id in self.log.forgotten:
                break
            await asyncio.sleep(0.01)
        assert [r.state for r in self.log.written if r.gather_id == gather_id][-1] is RecordState.ENDED
        assert gather_id in self.log.forgotten


async def never_created(lines: list[bytes], gather_id: str) -> object:
    await asyncio.Event().wait()
    raise AssertionError
