"""The handler's reservation of a record about to wait or be parked (core.reservation, design §4 and §5.11)."""

from __future__ import annotations

import pytest

from streamproc import codec
from streamproc.app.handler import Disposition, Record, StateWriteFailed
from streamproc.core.request_state import RecordRef, Start, admit, input_hash
from streamproc.core.vocabulary import RequestStatus
from tests.unit.app.test_handler import BODY, PARTITION, Rig, answer, make_request, only_failure, submission

BACKLOG = "llm.backlog"


def parked_copy(record: Record, offset: int) -> Record:
    return Record(BACKLOG, record.partition, offset, record.key, record.value, record.headers)


async def test_a_parked_original_owns_its_id_against_a_later_record_with_another_body() -> None:
    """The chaos run's ticket-407: the original parked, a hostile duplicate read after it meets a free hand."""
    rig = Rig([answer("the original's answer")])
    original = submission(make_request(), offset=100)
    hostile = submission(make_request(body={**BODY, "temperature": 1}), offset=101)

    assert await rig.handler.reserve(original) == input_hash(make_request())
    assert rig.state().status is RequestStatus.PENDING

    assert await rig.handle(hostile) is Disposition.ACK
    event, _ = only_failure(rig)
    assert event.error_code == "conflicting_duplicate" and event.request.body_json != make_request().body_json
    assert rig.state().status is RequestStatus.PENDING

    await rig.handler.name_parked("req-1", input_hash(make_request()), RecordRef(BACKLOG, 7))
    assert (rig.state().next_topic, rig.state().next_offset) == (BACKLOG, 7)
    assert await rig.handle(parked_copy(original, 7)) is Disposition.ACK
    assert len(rig.sink.results) == 1 and len(rig.sink.failures) == 1
    assert rig.state().status is RequestStatus.SUCCEEDED
    assert (rig.state().next_topic, rig.state().source_topic) == (None, None)


async def test_reserving_again_writes_nothing_and_a_record_that_holds_no_request_is_not_reserved() -> None:
    rig = Rig()
    original = submission(make_request(), offset=100)
    await rig.handler.reserve(original)
    await rig.handler.reserve(original)  # a redelivery after a crash, or its parked copy
    assert rig.log == ["state pending"]
    garbage = Record("llm.requests", PARTITION, 102, b"req-2", b"\x00not a request", {})
    assert await rig.handler.reserve(garbage) is None
    mismatched = Record("llm.requests", PARTITION, 103, b"other", codec.encode(make_request()), {})
    assert await rig.handler.reserve(mismatched) is None
    assert rig.log == ["state pending"]


async def test_a_reservation_that_cannot_be_sent_on_raises_so_the_record_is_held() -> None:
    rig = Rig()
    rig.store.unsent = {RequestStatus.PENDING}
    with pytest.raises(StateWriteFailed):
        await rig.handler.reserve(submission(make_request()))


async def test_a_record_a_dead_worker_left_in_flight_is_redelivered_only_by_itself() -> None:
    """Why the worker handles such a record at once instead of parking it (design §5.11): its parked copy is
    another record, which the state machine skips as a duplicate of the attempt in flight, and the request would
    wait for the reconciler."""
    rig = Rig([answer("the answer")])
    original = submission(make_request(), offset=100)
    started = admit(None, make_request(), 1, 1_000, source=RecordRef(original.topic, original.offset))
    assert isinstance(started, Start)
    rig.store.states["req-1"] = started.state  # written by a worker killed during the call

    assert rig.handler.redelivered(original)
    copy = parked_copy(original, 7)
    assert not rig.handler.redelivered(copy)
    assert await rig.handle(copy) is Disposition.ACK
    assert rig.state().status is RequestStatus.IN_FLIGHT and not rig.sink.results  # skipped: stranded

    assert await rig.handle(original) is Disposition.ACK
    assert rig.state().status is RequestStatus.SUCCEEDED and len(rig.sink.results) == 1
    assert not rig.handler.redelivered(original)


async def test_a_reserved_or_unknown_id_is_not_a_redelivery() -> None:
    rig = Rig()
    original = submission(make_request(), offset=100)
    assert not rig.handler.redelivered(original)
    await rig.handler.reserve(original)
    assert not rig.handler.redelivered(original)
    assert not rig.handler.redelivered(Record("llm.requests", PARTITION, 100, None, original.value, {}))
