"""The faust recovery fixes: order of resume and seek, uncommitted partitions, fetch snapshots.

faust's own steps are replaced by a fake that does what faust 0.15.3's ``on_recovery_completed`` does in the
same order (resume the stream partitions, seek, then the queue-clearing resume), so the test shows what the
wrapper changes around it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.transport.producer import ProducerBuffer
from faust.types import TP, ConsumerMessage

from streamproc.app import faust_fixes


class FakeConsumer:
    def __init__(self, assignment: set[str], committed: dict[str, int | None]) -> None:
        self._assignment = assignment
        self._committed_offset = committed
        self._read_offset: dict[str, int | None] = {}
        self.events: list[str] = []

    def assignment(self) -> set[str]:
        return self._assignment

    def resume_partitions(self, tps: Iterable[str]) -> None:
        self.events.append(f"resume {sorted(tps)}")

    async def perform_seek(self) -> None:
        self.events.append("seek to committed")

    async def earliest_offsets(self, *tps: str) -> dict[str, int]:
        return dict.fromkeys(tps, 0)

    async def seek(self, tp: str, offset: int) -> None:
        self.events.append(f"seek {tp} to {offset}")


class FakeApp:
    def __init__(self, consumer: FakeConsumer) -> None:
        self.consumer = consumer


class FakeRecovery:
    def __init__(self, consumer: FakeConsumer) -> None:
        self.app = FakeApp(consumer)


async def faust_steps(self: Any, generation_id: int = 0) -> None:
    """faust 0.15.3's order: resume the stream partitions, await the seek, then clear the queues."""
    consumer = self.app.consumer
    consumer.resume_partitions({tp for tp in consumer.assignment() if not tp.startswith("changelog")})
    await consumer.perform_seek()
    consumer.events.append("clear queues and resume flow")


async def test_stream_partitions_resume_after_the_seek_and_are_sought_again_uncommitted_ones_to_the_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faust_fixes, "_recovery_completed", faust_steps)
    consumer = FakeConsumer({"requests-0", "requests-1", "changelog-0"}, {"requests-0": 42, "requests-1": None})
    await faust_fixes._on_recovery_completed(FakeRecovery(consumer))
    assert consumer.events == [
        "seek to committed",
        "seek requests-0 to 42",  # again: a fetch that ended during faust's seek may have moved it on
        "seek requests-1 to 0",  # no committed offset: from its first record, not from wherever the fetch was
        "resume ['requests-0', 'requests-1']",
        "clear queues and resume flow",  # nothing awaited between the resume and the clear: no fetch lost
    ]
    assert consumer._read_offset == {"requests-0": 41, "requests-1": -1}  # a record after a jump shows the jump
    assert vars(consumer)[faust_fixes.START_OFFSETS] == {"requests-0": 42, "requests-1": 0}
    assert "resume_partitions" not in vars(consumer) and "perform_seek" not in vars(consumer)  # restored


async def test_the_consumer_methods_are_restored_when_recovery_is_interrupted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def interrupted(self: Any, generation_id: int = 0) -> None:
        self.app.consumer.resume_partitions({"requests-0"})
        raise RuntimeError("another rebalance")

    monkeypatch.setattr(faust_fixes, "_recovery_completed", interrupted)
    consumer = FakeConsumer({"requests-0"}, {})
    with pytest.raises(RuntimeError):
        await faust_fixes._on_recovery_completed(FakeRecovery(consumer))
    assert "resume_partitions" not in vars(consumer) and "perform_seek" not in vars(consumer)
    assert consumer.events == []  # held, not resumed: the next recovery resumes them


async def test_a_fetch_takes_a_snapshot_and_an_empty_one_fetches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[Any] = []

    async def fetch(self: Any, consumer: Any, partitions: Any, **kwargs: Any) -> dict[str, list[int]]:
        fetched.append(partitions)
        return {"requests-0": [1]}

    monkeypatch.setattr(faust_fixes, "_fetch_records", fetch)
    live = {"requests-0"}
    assert await faust_fixes._fetch_active_records(None, None, live, timeout=1.0) == {"requests-0": [1]}
    assert fetched[0] == live and fetched[0] is not live  # a copy: pausing later cannot empty it
    assert await faust_fixes._fetch_active_records(None, None, set(), timeout=1.0) == {}
    assert await faust_fixes._fetch_active_records(None, None, None, timeout=1.0) == {"requests-0": [1]}
    assert fetched == [{"requests-0"}, None]  # the empty set never reached aiokafka ("every partition")


def _acking_consumer() -> Any:
    """A real faust consumer (never started) whose app consumes topic ``requests`` with acks."""
    app = faust.App("fix-3", broker="kafka://127.0.0.1:1")
    app.topics.acking_topics.add("requests")
    app.consumer_generation_id = 2
    return app.consumer


def _message(offset: int, generation_id: int) -> Any:
    return ConsumerMessage("requests", 0, offset, 0.0, 0, None, b"k", b"v", None, tp=TP("requests", 0),
                           generation_id=generation_id)


def test_a_record_the_stream_dropped_unseen_is_not_acked_so_no_commit_passes_it() -> None:
    consumer = _acking_consumer()
    tp = TP("requests", 0)
    for offset in range(3, 8):  # fetched before a rebalance, dropped as old-generation: never tracked
        assert consumer.ack(_message(offset, generation_id=1)) is False
    assert consumer._new_offset(tp) is None  # faust alone would commit 8, past offsets 0..7 never handled


def test_records_an_agent_took_are_acked_and_committed_as_before() -> None:
    consumer = _acking_consumer()
    tp = TP("requests", 0)
    for offset in range(3):
        message = _message(offset, generation_id=2)
        message.tracked = True  # what the stream does when it hands the record to an agent
        assert consumer.ack(message) is True
    assert consumer._new_offset(tp) == 3


def test_a_record_of_an_earlier_generation_acked_late_is_not_counted_for_the_next() -> None:
    """The partition came back to this worker (generation 3); the record read in generation 2, parked when the
    rebalance woke it, was acked after faust had emptied the partition's acked offsets. The new generation reads
    it again from the committed offset 0: a commit must not pass it while that copy runs."""
    consumer = _acking_consumer()
    consumer.app.consumer_generation_id = 3
    tp = TP("requests", 0)
    consumer._committed_offset[tp] = 0
    late = _message(0, generation_id=2)
    late.tracked = True
    assert consumer.ack(late) is False
    assert consumer._new_offset(tp) is None


async def test_an_assignment_starts_its_partitions_with_no_acked_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _acking_consumer()
    tp, other = TP("requests", 0), TP("requests", 1)
    _ack_taken(consumer, 0, 1)  # acked after the revoke, before the assignment: the earlier generation's
    consumer._acked[other].append(5)
    assigned: list[set[TP]] = []

    async def fausts(self: Any, partitions: set[TP], generation_id: int = 0) -> None:
        assigned.append(partitions)

    monkeypatch.setattr(faust_fixes, "_on_partitions_assigned", fausts)
    await faust_fixes._assigned_unacked(consumer, {tp}, 3)
    assert assigned == [{tp}]
    assert not consumer._acked.get(tp) and not consumer._acked_index.get(tp)
    assert consumer._acked[other] == [5]  # not assigned here: untouched
    consumer._committed_offset[tp] = 0
    assert consumer._new_offset(tp) is None


class SlowChannel:
    """Stands in for a topic whose hand-over to aiokafka is slow (a broker that is restarting)."""

    def __init__(self) -> None:
        self.handed_over: list[int] = []

    async def publish_message(self, fut: Any, wait: bool = False) -> None:
        await asyncio.sleep(0.3)
        self.handed_over.append(fut.value)


async def test_the_flush_before_a_commit_waits_until_every_buffered_state_write_is_handed_over() -> None:
    channel = SlowChannel()
    buffer = ProducerBuffer()
    buffer.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))  # type: ignore[assignment]
    await buffer.start()
    try:
        for value in range(3):
            buffer.put(SimpleNamespace(value=value, message=SimpleNamespace(channel=channel)))  # type: ignore[arg-type]
        await buffer.flush()  # faust's own returned after 0.1 s with two writes queued and one under way
        assert channel.handed_over == [0, 1, 2]
        assert buffer.size == 0
    finally:
        await buffer.stop()


async def test_a_flush_refuses_a_producer_that_is_not_running_and_holds_messages() -> None:
    buffer = ProducerBuffer()
    buffer.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))  # type: ignore[assignment]
    await buffer.flush()  # nothing held: nothing to refuse
    buffer.put(SimpleNamespace(value=0, message=SimpleNamespace(channel=SlowChannel())))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not Running"):
        await buffer.flush()


def _ack_taken(consumer: Any, *offsets: int) -> None:
    for offset in offsets:
        message = _message(offset, generation_id=2)
        message.tracked = True
        assert consumer.ack(message) is True


def _with_log_start(consumer: Any, earliest: int) -> None:
    async def earliest_offsets(*tps: TP) -> dict[TP, int]:
        return dict.fromkeys(tps, earliest)

    consumer.earliest_offsets = earliest_offsets


def test_a_commit_never_passes_a_committed_offset_that_was_not_acked() -> None:
    consumer = _acking_consumer()
    tp = TP("requests", 0)
    faust_fixes.watch_skipped_records(consumer.app, ["requests"], lambda *args: pytest.fail("no gap"))
    consumer._committed_offset[tp] = 36
    _ack_taken(consumer, 37, 38)
    assert consumer._new_offset(tp) is None  # faust alone: 39, past offset 36 (faust-streaming #606)
    _ack_taken(consumer, 36)
    assert consumer._new_offset(tp) == 39
    zero = _acking_consumer()
    faust_fixes.watch_skipped_records(zero.app, ["requests"], lambda *args: pytest.fail("no gap"))
    zero._committed_offset[tp] = 0
    _ack_taken(zero, 5, 6)
    assert zero._new_offset(tp) is None  # faust alone: 7 (a committed 0 skipped its head check)


async def test_records_skipped_by_the_consumer_stop_the_worker_and_are_never_committed_past() -> None:
    """The CI chaos run's loss: committed 36, a record fetched before a seek (69) delivered after it."""
    consumer = _acking_consumer()
    tp = TP("requests", 0)
    skipped: list[tuple[str, int, int, int]] = []
    faust_fixes.watch_skipped_records(consumer.app, ["requests"], lambda *args: skipped.append(args))
    _with_log_start(consumer, 0)  # 36..68 are still in the log
    consumer._committed_offset[tp] = 36
    await consumer._add_gap(tp, 37, 69)  # what faust's drain does on seeing 69 with its read offset at 36
    _ack_taken(consumer, 69)
    assert skipped == [("requests", 0, 36, 68)]
    assert consumer._new_offset(tp) is None  # faust alone: 70, and 36..68 never handled


def test_with_nothing_committed_the_head_is_where_reading_started() -> None:
    consumer = _acking_consumer()
    tp = TP("requests", 0)
    faust_fixes.watch_skipped_records(consumer.app, ["requests"], lambda *args: pytest.fail("no gap"))
    consumer.__dict__[faust_fixes.START_OFFSETS] = {tp: 0}  # fix 2 sought it to its first offset
    _ack_taken(consumer, 5, 6)
    assert consumer._new_offset(tp) is None  # faust alone: 7, past 0..4 (no head check without a commit)
    _ack_taken(consumer, 0, 1, 2, 3, 4)
    assert consumer._new_offset(tp) == 7


async def test_records_deleted_by_retention_before_they_were_read_are_a_gap_as_before() -> None:
    consumer = _acking_consumer()
    tp = TP("requests", 0)
    skipped: list[tuple[str, int, int, int]] = []
    faust_fixes.watch_skipped_records(consumer.app, ["requests"], lambda *args: skipped.append(args))
    _with_log_start(consumer, 69)
    consumer._committed_offset[tp] = 36
    await consumer._add_gap(tp, 37, 69)
    _ack_taken(consumer, 69)
    assert skipped == []
    assert consumer._new_offset(tp) == 70


async def test_a_topic_the_worker_did_not_name_keeps_fausts_gaps() -> None:
    consumer = _acking_consumer()
    tp = TP("requests", 0)
    faust_fixes.watch_skipped_records(consumer.app, ["other"], lambda *args: pytest.fail("not watched"))
    consumer._committed_offset[tp] = 36
    await consumer._add_gap(tp, 36, 40)  # a compacted topic: 36..39 are gone, 40 revealed it (in the gap too)
    _ack_taken(consumer, 41)
    assert consumer._new_offset(tp) == 42  # faust's gap starts at 37: its head check lets 36 through


class FakeConductor:
    def __init__(self) -> None:
        self.app = SimpleNamespace(client_only=False)
        self._tp_to_callback: dict[TP, Any] = {}
        self._tp_to_callback_lock = asyncio.Lock()


async def test_a_record_of_a_partition_with_no_handler_is_left_unread_instead_of_crashing_the_fetcher() -> None:
    """faust's dispatch raised KeyError for it, which ended the fetcher's drain (fix 6)."""
    conductor = FakeConductor()
    on_message = faust_fixes._compile_unassigned_tolerant_handler(conductor)
    handled: list[int] = []

    async def handler(message: Any) -> None:
        handled.append(message.offset)

    held, other = TP("requests", 0), TP("requests", 7)
    conductor._tp_to_callback[held] = handler  # filled after compiling, as an assignment does
    await on_message(SimpleNamespace(tp=other, offset=5))
    await on_message(SimpleNamespace(tp=held, offset=6))
    assert handled == [6]
    with pytest.raises(KeyError):  # what faust's own dispatch does with it
        await faust_fixes._compile_message_handler(conductor)(SimpleNamespace(tp=other, offset=5))


def test_fausts_conductor_compiles_the_tolerant_dispatch() -> None:
    from faust.transport.conductor import Conductor

    assert Conductor._compile_message_handler is faust_fixes._compile_unassigned_tolerant_handler
