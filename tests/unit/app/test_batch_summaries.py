"""A worker's batch summaries: built from the partition's store once restored, moved by writes, written when they
changed, dropped on revoke, tombstoned when forgotten.

The RocksDB store and faust's producer are in-memory fakes (the real ones run in the integration tests)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from streamproc import codec
from streamproc.app import batch_summaries
from streamproc.app.batch_summaries import BatchSummaries
from streamproc.codec.summary_record import decode_summary, decode_summary_key
from streamproc.core.batch_summary import SummaryKey
from streamproc.core.events import RequestState
from streamproc.core.vocabulary import RequestStatus

TOPIC = "llm.summaries"


class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[SummaryKey, Any]] = []

    async def send(self, topic: str, key: bytes, value: bytes | None, **_options: Any) -> asyncio.Future[None]:
        assert topic == TOPIC
        self.sent.append((decode_summary_key(key), None if value is None else decode_summary(value)[0]))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def state(request: str, status: RequestStatus, batch_id: str = "a") -> RequestState:
    return RequestState(f"{batch_id}/{request}", status, "h", batch_id=batch_id, created_ms=1, updated_ms=2)


class Store(dict[bytes, bytes]):
    """A partition's RocksDB as the scan reads it: items in key order from a key on."""

    def items(self, from_key: bytes | None = None) -> Any:
        return iter([(key, self[key]) for key in sorted(self) if from_key is None or key >= from_key])


def summaries(dbs: dict[int, Store], owned: set[int], forgotten: set[str],
              ready: list[bool]) -> tuple[BatchSummaries, Producer]:
    producer = Producer()
    table = SimpleNamespace(data=SimpleNamespace(_dbs=dbs))
    return BatchSummaries(table, producer, TOPIC, lambda: owned, lambda: forgotten, lambda: ready[0]), producer


async def test_a_partition_is_counted_from_its_store_once_restored_then_moved_by_each_write() -> None:
    old = state("1", RequestStatus.IN_FLIGHT)
    store = Store({b"a/1": codec.encode(old), b"b/1": codec.encode(state("1", RequestStatus.SUCCEEDED, "b")),
             b"__faust\x00offset__": b"17"})
    ready = [False]
    keeper, producer = summaries({4: store, 5: Store()}, owned={4}, forgotten=set(), ready=ready)
    written_early = state("2", RequestStatus.IN_FLIGHT)
    store[b"a/2"] = codec.encode(written_early)  # TableStore writes RocksDB first: the scan counts it, not this call
    keeper.written(4, b"a/2", None, written_early)
    assert await keeper.publish_once() == 0  # a rebalance under way: nothing built, nothing written
    ready[0] = True
    assert await keeper.publish_once() == 2  # every batch of the partition (5 is a standby: not ours)
    by_key = dict(producer.sent)
    assert by_key[SummaryKey("a", 4)].by_status == {"in_flight": 2}
    assert by_key[SummaryKey("b", 4)].by_status == {"succeeded": 1}

    producer.sent.clear()
    keeper.written(4, b"a/1", old, state("1", RequestStatus.SUCCEEDED))
    keeper.written(4, b"a/3", None, state("3", RequestStatus.RETRYING))
    assert await keeper.publish_once() == 1  # only the batch that changed
    assert producer.sent[0][0] == SummaryKey("a", 4)
    assert producer.sent[0][1].by_status == {"in_flight": 1, "succeeded": 1, "retrying": 1}
    assert await keeper.publish_once() == 0


async def test_a_revoked_partition_is_dropped_without_a_last_write_and_a_forgotten_batch_is_tombstoned() -> None:
    forgotten: set[str] = set()
    owned = {1, 2}
    keeper, producer = summaries({1: Store({b"a/1": codec.encode(state("1", RequestStatus.SUCCEEDED))}), 2: Store()},
                                 owned=owned, forgotten=forgotten, ready=[True])
    await keeper.publish_once()
    keeper.written(2, b"a/9", None, state("9", RequestStatus.IN_FLIGHT))
    keeper.revoked({2})
    owned.discard(2)
    producer.sent.clear()
    assert await keeper.publish_once() == 0  # its next owner writes it, from the same restored states

    forgotten.add("a")
    assert await keeper.publish_once() == 1
    assert producer.sent == [(SummaryKey("a", 1), None)]
    assert await keeper.publish_once() == 0  # once


async def test_writes_while_the_scan_runs_are_counted_once_behind_it_and_ahead_of_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_summaries, "SCAN_CHUNK", 2)
    states = {f"a/{i}".encode(): state(str(i), RequestStatus.IN_FLIGHT) for i in range(6)}
    store = Store({key: codec.encode(value) for key, value in states.items()})
    keeper, producer = summaries({0: store}, owned={0}, forgotten=set(), ready=[True])
    publishing = asyncio.create_task(keeper.publish_once())
    await asyncio.sleep(0)  # the scan counted a/0 and a/1 and yields
    for key in (b"a/0", b"a/5"):  # one behind the scan's cursor, one ahead of it
        ended = state(key.decode().split("/")[1], RequestStatus.SUCCEEDED)
        store[key] = codec.encode(ended)
        keeper.written(0, key, states[key], ended)
    await publishing
    [(summary_key, counts)] = producer.sent
    assert summary_key == SummaryKey("a", 0)
    assert counts.by_status == {"in_flight": 4, "succeeded": 2}


async def test_the_requests_without_a_batch_are_counted_as_the_stream_and_keep_a_week_of_hours() -> None:
    now_ms = int(time.time() * 1000)
    recent = RequestState("s-1", RequestStatus.SUCCEEDED, "h", created_ms=now_ms, updated_ms=now_ms)
    ancient = RequestState("s-2", RequestStatus.SUCCEEDED, "h", created_ms=1, updated_ms=2)  # a year ago and more
    store = Store({b"s-1": codec.encode(recent), b"s-2": codec.encode(ancient)})
    keeper, producer = summaries({0: store}, owned={0}, forgotten=set(), ready=[True])
    assert await keeper.publish_once() == 1
    [(key, counts)] = producer.sent
    hour = now_ms // 3_600_000 * 3_600_000
    assert key == SummaryKey(None, 0) and counts.by_status == {"succeeded": 2}
    assert (counts.arrived, counts.succeeded_in) == ({hour: 1}, {hour: 1})  # the ancient hours are not kept
    producer.sent.clear()
    keeper.written(0, b"s-3", None, RequestState("s-3", RequestStatus.IN_FLIGHT, "h", created_ms=now_ms))
    assert await keeper.publish_once() == 1
    assert producer.sent[0][1].by_status == {"succeeded": 2, "in_flight": 1}
