"""A provider batch taken over whose killed owner wrote some of its lines' outcomes already (design §8, "the crash
window is a batch wide"): those members get the written outcome back instead of their line (the handler then
writes their state and sends nothing), the others their lines, and the batch still ends. And a batch whose create
call failed but which was made all the same is followed, not made again."""

from __future__ import annotations

import pytest

from streamproc.app.provider_batch_route import TAKEOVER_FAILED
from streamproc.core.outcome import Failure, Success
from streamproc.core.provider_batch_objects import BatchPhase, ProviderBatchView
from streamproc.core.provider_batch_takeover import (
    CLOCK_SKEW_MS,
    GATHER_METADATA_KEY,
    ProviderBatchRecord,
    RecordState,
)
from streamproc.core.vocabulary import FailureLayer
from streamproc.core.written_outcome import WrittenOutcome
from streamproc.llm.provider_batches import BatchCallFailed
from tests.unit.app.provider_batch_route_rig import REFUSED, TAKEN_OVER, FakeOutcomes, Rig

ANSWERED = WrittenOutcome(1, Success("hello", "gpt-test", 12, 3))
OPENED_AT = ProviderBatchRecord("g-1", "openai", "gpt-test", 0, ("r1", "r2"), RecordState.OPEN, 1_000, 900_000,
                                provider_batch_id="batch_1", attempts=(1, 1))


async def test_a_member_whose_outcome_was_written_gets_it_back_and_its_line_is_not_answered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, OPENED_AT, written=FakeOutcomes({"r1": [ANSWERED]}))
    rig.lines_due.set()
    assert await rig.raw_call("r1", 1) == ANSWERED  # no line awaited: the batch's line for it is dropped
    rig.route.written("r1")
    assert await rig.answered("r2", 1) == REFUSED
    await rig.ended_and_tombstoned("g-1")
    # read from when the batch was recorded open (less the clock skew), for its members, once
    assert rig.outcomes.asked == [(0, 900_000 - CLOCK_SKEW_MS, frozenset({"r1", "r2"}))]
    assert rig.polls == ["batch_1"] and rig.api.submitted == []
    await rig.route.aclose()


async def test_a_terminal_failure_written_is_given_back_too(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = WrittenOutcome(1, Failure(FailureLayer.BUSINESS, "invalid_request", "bad", 400))
    rig = Rig(monkeypatch, TAKEN_OVER, written=FakeOutcomes({"r2": [refused]}))
    rig.lines_due.set()
    assert await rig.raw_call("r2", 1) == refused
    assert await rig.answered("r1", 1) == REFUSED
    await rig.ended_and_tombstoned("g-1")
    await rig.route.aclose()


async def test_an_outcome_of_another_attempt_does_not_end_the_member(monkeypatch: pytest.MonkeyPatch) -> None:
    """An outcome of an earlier run's attempt 2 is not this line's (gathered for attempt 1): the line answers."""
    rig = Rig(monkeypatch, TAKEN_OVER, written=FakeOutcomes({"r1": [WrittenOutcome(2, ANSWERED.ended)]}))
    rig.lines_due.set()
    assert await rig.answered("r1", 1) == REFUSED
    assert await rig.answered("r2", 1) == REFUSED
    await rig.ended_and_tombstoned("g-1")
    await rig.route.aclose()


async def test_outcomes_that_cannot_be_read_fail_the_takeover_and_nothing_is_answered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not knowing what was written, the route answers nothing (a line could end a request twice): the call fails
    as the takeover's failure (retried), and the next call tries the takeover again."""
    outcomes = FakeOutcomes({}, unreadable=True)
    rig = Rig(monkeypatch, TAKEN_OVER, written=outcomes)
    rig.lines_due.set()
    failed = await rig.call("r1", 1)
    assert failed.code == TAKEOVER_FAILED and failed.layer is FailureLayer.SERVICE
    assert rig.polls == []
    outcomes.unreadable = False
    assert await rig.answered("r1", 1) == REFUSED
    assert len(outcomes.asked) == 2
    await rig.route.aclose()


async def test_a_batch_found_at_the_provider_after_a_creating_record_reads_no_outcomes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an open record's lines can have been read by its killed owner: no outcome topic is read for none."""
    rig = Rig(monkeypatch, written=FakeOutcomes({"r1": [ANSWERED]}))
    rig.lines_due.set()
    await rig.route.aclose()
    assert rig.outcomes.asked == []


async def test_a_batch_created_although_its_create_call_failed_is_followed_not_made_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A create call whose answer was lost (a timeout) may have made the batch: it is looked for as a takeover
    looks, and followed, so its members get its lines instead of going, billed twice, into a new batch."""
    rig = Rig(monkeypatch)

    async def lost_answer(lines: list[bytes], gather_id: str) -> object:
        rig.api.submitted.append(lines)
        rig.api.listed = (ProviderBatchView("openai", "batch_1", BatchPhase.IN_PROGRESS, 1, 0,
                                            metadata={GATHER_METADATA_KEY: gather_id}, created_ms=1),)
        raise BatchCallFailed("create", Failure(FailureLayer.TRANSPORT, "read_timeout", "no answer"))

    monkeypatch.setattr(rig.api, "submit", lost_answer)
    rig.lines_due.set()
    assert await rig.answered("r1", 1) == REFUSED  # batch_1's line, not the create call's timeout
    assert len(rig.api.submitted) == 1 and rig.polls == ["batch_1"]
    await rig.route.aclose()
