"""The provider-batch route taking over an ``open`` record (design §8): a member's line answers only the attempt it
was gathered for. A later attempt (its earlier one's outcome written by the worker that was killed) is gathered
anew and the earlier attempt's line dropped, and the batch taken over still ends and is tombstoned."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from streamproc.core.provider_batch_takeover import ProviderBatchRecord, RecordState, member_custom_id
from tests.unit.app.provider_batch_route_rig import (
    EXPIRED,
    GATHERED_ANEW,
    REFUSED,
    TAKEN_OVER,
    Rig,
    never_created,
)


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
    rig.api.submit = never_created  # type: ignore[method-assign]  # the new gather never answers
    later = asyncio.create_task(rig.call("r1", 2))
    await asyncio.sleep(0.05)
    rig.lines_due.set()
    await rig.ended_and_tombstoned("g-1")  # r1's line dropped, r2's kept: no member awaited
    assert not later.done()
    assert not await rig.route.held("r1", 2, 0) and await rig.route.held("r2", 1, 0)
    later.cancel()
    await rig.route.aclose()


async def test_a_record_written_without_attempts_matches_by_request_id(monkeypatch: pytest.MonkeyPatch) -> None:
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


async def test_two_attempts_waiting_at_once_each_get_their_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a crash a request's record (attempt 1, its state still ``in_flight``) and its retry record (attempt 2)
    can both be admitted (design §4): each call waits for its own attempt's line, and the later one does not take
    the earlier one's place (which left attempt 1's call waiting for ever, its record never acked)."""
    rig = Rig(monkeypatch, TAKEN_OVER)
    first = asyncio.create_task(rig.answered("r1", 1))  # the redelivered record: waits for the taken-over line
    await asyncio.sleep(0.05)
    assert await rig.answered("r1", 2) == GATHERED_ANEW  # the retry record's attempt: gathered anew, answered
    rig.lines_due.set()
    assert await first == REFUSED
    assert await rig.answered("r2", 1) == REFUSED
    await rig.ended_and_tombstoned("g-1")
    await rig.route.aclose()


async def test_one_attempt_asked_twice_at_once_shares_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its record handled again while the first handling waits: both get the line; neither waits for ever."""
    rig = Rig(monkeypatch, TAKEN_OVER)
    first = asyncio.create_task(rig.call("r1", 1))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(rig.call("r1", 1))
    await asyncio.sleep(0.05)
    rig.lines_due.set()
    assert await first == REFUSED and await second == REFUSED
    rig.route.written("r1")
    assert await rig.answered("r2", 1) == REFUSED
    await rig.ended_and_tombstoned("g-1")
    await rig.route.aclose()
