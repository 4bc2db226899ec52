"""The provider-batch route taking over an ``open`` record (design §8): a member's line answers only the attempt it
was gathered for. A later attempt (its earlier one's outcome written by the worker that was killed) is gathered
anew and the earlier attempt's line dropped, and the batch taken over still ends and is tombstoned."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from streamproc.app import provider_batch_route as route_module
from streamproc.app.provider_batch_route import ProviderBatchRoute
from streamproc.core.events import InferenceRequest
from streamproc.core.outcome import Failure
from streamproc.core.provider_batch_gatherer import OPENAI_LIMITS
from streamproc.core.provider_batch_lines import LineOutcome
from streamproc.core.provider_batch_objects import BatchPhase, ProviderBatchView
from streamproc.core.provider_batch_takeover import ProviderBatchRecord, RecordState, member_custom_id
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.provider_batches import BatchCallFailed
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


class Rig:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, *records: ProviderBatchRecord) -> None:
        self.lines_due = asyncio.Event()
        self.api, self.log = FakeApi(), FakeLog()

        async def owned(reader: object, owned: object, unreadable: object) -> dict[str, ProviderBatchRecord]:
            return {record.gather_id: record for record in records}

        async def ended(api: object, batch_id: str, policy: object) -> ProviderBatchView:
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
                                         max_age_ms=0, first_poll_s=0.01, max_poll_s=0.01)
        self.route = ProviderBatchRoute(settings, self.api, self.log, reader)  # type: ignore[arg-type]

    async def call(self, request_id: str, attempt: int) -> Failure:
        result = await asyncio.wait_for(
            self.route.call(InferenceRequest(request_id, "{}", batch_id="b"), dict(BODY), attempt, partition=0), 5)
        assert isinstance(result.outcome, Failure)
        return result.outcome

    async def ended_and_tombstoned(self, gather_id: str) -> None:
        for _ in range(100):
            if gather_id in self.log.forgotten:
                break
            await asyncio.sleep(0.01)
        assert [r.state for r in self.log.written if r.gather_id == gather_id][-1] is RecordState.ENDED
        assert gather_id in self.log.forgotten


async def test_a_later_attempt_is_gathered_anew_and_the_kept_line_of_the_earlier_one_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, TAKEN_OVER)
    assert await rig.route.held("r1", 1, 0) and not await rig.route.held("r1", 2, 0)
    rig.lines_due.set()  # the batch's lines come back before any member's record: both kept
    await rig.ended_and_tombstoned("g-1")
    assert await rig.route.held("r1", 1, 0) and not await rig.route.held("r1", 2, 0)
    assert await rig.call("r1", 2) == GATHERED_ANEW  # attempt 1's refusal was written by the worker killed
    assert [line for lines in rig.api.submitted for line in lines] == [f"{member_custom_id(0)}:gpt-test".encode()]
    assert not await rig.route.held("r1", 1, 0)  # the kept line was dropped
    assert await rig.call("r2", 1) == REFUSED  # redelivered, its outcome unwritten: the line answers it
    await rig.route.aclose()


async def test_a_later_attempt_asking_before_the_line_is_gathered_anew_and_the_batch_still_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, TAKEN_OVER)
    later = asyncio.create_task(rig.call("r1", 2))
    assert await later == GATHERED_ANEW  # not left waiting for the line of attempt 1
    waiting = asyncio.create_task(rig.call("r2", 1))
    await asyncio.sleep(0.05)
    rig.lines_due.set()
    assert await waiting == REFUSED
    rig.route.written("r2")
    await rig.ended_and_tombstoned("g-1")
    # no call waited for r1's line (attempt 2 had its answer): kept for attempt 1 only, dropped by a later one
    assert await rig.route.held("r1", 1, 0) and not await rig.route.held("r1", 2, 0)
    assert await rig.call("r1", 3) == GATHERED_ANEW and not await rig.route.held("r1", 1, 0)
    await rig.route.aclose()


async def test_a_line_waiting_while_a_later_attempt_is_gathered_does_not_answer_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The later attempt's call is in the new gather when the taken-over batch's line of the earlier comes back."""
    rig = Rig(monkeypatch, TAKEN_OVER)
    rig.api.submit = _never_created  # type: ignore[method-assign]  # the new gather never answers
    later = asyncio.create_task(rig.call("r1", 2))
    await asyncio.sleep(0.05)
    rig.lines_due.set()
    await rig.ended_and_tombstoned("g-1")  # r1's line dropped, r2's kept: no member awaited
    assert not later.done()
    assert not await rig.route.held("r1", 2, 0) and await rig.route.held("r2", 1, 0)
    later.cancel()
    await rig.route.aclose()


async def test_a_record_written_without_attempts_matches_by_request_id(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace
    rig = Rig(monkeypatch, replace(TAKEN_OVER, attempts=None))
    assert await rig.route.held("r1", 2, 0)
    rig.lines_due.set()
    await rig.ended_and_tombstoned("g-1")
    assert await rig.call("r1", 2) == REFUSED and rig.api.submitted == []
    await rig.route.aclose()


async def test_of_two_batches_taken_over_holding_a_request_its_later_attempts_line_answers_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker was killed after the refused batch's member went, retried, into a second batch, before the first
    ended: the retry's line answers it, the refusal is dropped, and neither is gathered a third time."""
    retried = ProviderBatchRecord("g-2", "openai", "gpt-test", 0, ("r1",), RecordState.OPEN, 2, 2,
                                  provider_batch_id="batch_2", attempts=(2,))
    rig = Rig(monkeypatch, retried, TAKEN_OVER)  # the earlier attempt's record followed last
    assert await rig.route.held("r1", 2, 0) and not await rig.route.held("r1", 1, 0)
    waiting = asyncio.create_task(rig.call("r1", 2))
    await asyncio.sleep(0.05)
    rig.lines_due.set()
    assert await waiting == EXPIRED and rig.api.submitted == []
    rig.route.written("r1")
    await rig.ended_and_tombstoned("g-2")
    await rig.ended_and_tombstoned("g-1")
    assert not await rig.route.held("r1", 2, 0)  # the refusal answers no later attempt (kept for attempt 1 at most)
    assert await rig.call("r1", 3) == GATHERED_ANEW
    await rig.route.aclose()


async def _never_created(lines: list[bytes], gather_id: str) -> object:
    await asyncio.Event().wait()
    raise AssertionError
