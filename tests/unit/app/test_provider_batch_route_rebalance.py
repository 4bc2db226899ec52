"""The provider-batch route's takeover across a rebalance, and the lines it keeps (design §8): a line answers at most
one call of the attempt it was gathered for. A takeover still reading when its partition is revoked follows nothing
and its waiting callers are cancelled (their records stay unacked, as a waiter's are); a gather this worker ended,
read back open by a later takeover, is forgotten, not polled and answered again; of two lines kept for one request,
the later attempt's stays."""

from __future__ import annotations

import asyncio

import pytest

from streamproc.core.provider_batch_takeover import ProviderBatchRecord, RecordState
from tests.unit.app.provider_batch_route_rig import EXPIRED, GATHERED_ANEW, REFUSED, TAKEN_OVER, Rig

RETRIED = ProviderBatchRecord("g-2", "openai", "gpt-test", 0, ("r1",), RecordState.OPEN, 2, 2,
                              provider_batch_id="batch_2", attempts=(2,))  # r1's attempt 2, after g-1 refused it


async def test_a_revoke_while_the_takeover_reads_cancels_its_callers_and_it_follows_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, TAKEN_OVER)
    rig.readable.clear()
    first = asyncio.create_task(rig.call("r1", 1))  # waits for the takeover's read
    await asyncio.sleep(0.05)
    rig.route.revoked({0})
    rig.readable.set()
    with pytest.raises(asyncio.CancelledError):  # not left to wait for a line beside the redelivered record
        await first
    await asyncio.sleep(0.05)
    assert rig.polls == [] and rig.log.written == []  # no batch of a partition it no longer owns is followed
    # the partition handed back: the redelivered record's call takes the batch over, once, and its line answers it
    rig.lines_due.set()
    assert await rig.answered("r1", 1) == REFUSED
    assert await rig.answered("r2", 1) == REFUSED
    await rig.ended_and_tombstoned("g-1")
    assert rig.polls == ["batch_1"]
    await rig.route.aclose()


async def test_a_gather_ended_here_and_read_back_open_is_forgotten_not_answered_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The record read back open (a read begun before the end was written, or an end whose write failed) after the
    partition came back: its batch is not polled again, so its lines answer no call a second time."""
    rig = Rig(monkeypatch, TAKEN_OVER)
    rig.lines_due.set()
    assert await rig.answered("r1", 1) == REFUSED  # r2's record not back yet: its line kept
    await rig.ended_and_tombstoned("g-1")
    rig.route.revoked({0})
    assert await rig.answered("r2", 1) == REFUSED  # the kept line, once
    assert rig.polls == ["batch_1"] and rig.log.forgotten == ["g-1", "g-1"]
    assert not await rig.route.held("r1", 1, 0) and not await rig.route.held("r2", 1, 0)
    # a call of attempt 1 again (a record the handler admitted again) is not answered by the line it had: gathered
    assert await rig.answered("r1", 1) == GATHERED_ANEW
    assert await rig.answered("r2", 1) == GATHERED_ANEW
    assert rig.polls == ["batch_1"]
    await rig.route.aclose()


@pytest.mark.parametrize("records", [(RETRIED, TAKEN_OVER), (TAKEN_OVER, RETRIED)],
                         ids=["later-first", "earlier-first"])
async def test_of_two_lines_kept_for_one_request_the_later_attempts_stays(
        monkeypatch: pytest.MonkeyPatch, records: tuple[ProviderBatchRecord, ProviderBatchRecord]) -> None:
    """Both batches taken over end before r1's retry record comes back, in either order: attempt 2's line answers
    it (the refusal of attempt 1, whose outcome the killed worker wrote, must not replace it)."""
    rig = Rig(monkeypatch, *records)
    assert await rig.route.held("r2", 1, 0)  # taken over
    rig.lines_due.set()
    assert await rig.answered("r2", 1) == REFUSED
    await rig.ended_and_tombstoned("g-1")
    await rig.ended_and_tombstoned("g-2")
    assert await rig.route.held("r1", 2, 0) and not await rig.route.held("r1", 1, 0)
    assert await rig.answered("r1", 2) == EXPIRED and rig.api.submitted == []
    await rig.route.aclose()
