"""Forgetting batches: what the command reads of the changelog (app.forgetting), what a worker deletes from its own
disk (app.table_purge) and from its result index (app.result_index)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiokafka.structs import ConsumerRecord
from rocksdict import Options, Rdict

from streamproc import codec
from streamproc.app.forgetting import BatchHistory
from streamproc.app.result_index import ResultIndex
from streamproc.app.table_purge import TablePurge
from streamproc.codec.manifest import BatchManifest, encode_manifest
from streamproc.core.events import InferenceResult, RequestState
from streamproc.core.retention import Forgotten
from streamproc.core.topology import Topology, parse_tiers
from streamproc.core.vocabulary import RequestStatus

TOPOLOGY = Topology("t", 4, parse_tiers("1s"), "t-app")


def record(topic: str, partition: int, key: str, value: bytes | None) -> ConsumerRecord[Any, Any]:
    return ConsumerRecord(topic=topic, partition=partition, offset=0, timestamp=0, timestamp_type=0,
                          key=key.encode(), value=value, checksum=None, serialized_key_size=0,
                          serialized_value_size=0, headers=())


def state(request_id: str, batch_id: str, status: RequestStatus, updated_ms: int = 100) -> bytes:
    return codec.encode(RequestState(request_id, status, "h", batch_id=batch_id, created_ms=10,
                                     updated_ms=updated_ms))


def test_the_history_knows_where_each_live_state_is_and_which_batches_finished_when() -> None:
    history = BatchHistory()
    changelog = TOPOLOGY.state_changelog
    for taken in (record(changelog, 1, "a/1", state("a/1", "a", RequestStatus.IN_FLIGHT)),
                  record(changelog, 1, "a/1", state("a/1", "a", RequestStatus.SUCCEEDED, 300)),
                  record(changelog, 2, "a/2", state("a/2", "a", RequestStatus.FAILED, 200)),
                  record(changelog, 3, "b/1", state("b/1", "b", RequestStatus.RETRYING)),
                  record(changelog, 0, "old/1", state("old/1", "old", RequestStatus.SUCCEEDED, 50)),
                  record(changelog, 0, "old/1", None),  # tombstoned by an earlier forget
                  record(TOPOLOGY.batches, 0, "a", encode_manifest(BatchManifest("a", 2, 5, "in.jsonl"))),
                  record(TOPOLOGY.batches, 0, "old", encode_manifest(
                      BatchManifest("old", 1, 5, "", forgotten=Forgotten(60, 50, 1)))),
                  record(TOPOLOGY.batches, 0, "x", b"not a manifest"),
                  record(changelog, 0, "x", b"not a state")):
        history.take(taken, TOPOLOGY)
    assert history.keys == {b"a/1": (1, "a"), b"a/2": (2, "a"), b"b/1": (3, "b")}
    assert history.status("a").converged and not history.status("b").converged
    assert (history.finished_before(301), history.finished_before(300)) == (["a"], [])  # "old" is forgotten already
    assert history.known("b") and history.known("old") and not history.known("x")


class FakeTable:
    """The state table as TablePurge sees it: faust's RocksDB store with its partitions' databases."""

    def __init__(self, root: Path, partitions: list[int]) -> None:
        self.changelog_topic_name = "t-app-request_state-changelog"
        self.data = type("Store", (), {})()
        self.data._dbs = {p: Rdict(str(root / str(p)), Options(raw_mode=True)) for p in partitions}


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, int]] = []

    async def send(self, topic: str, key: bytes, value: bytes | None, *, partition: int, timestamp: Any,
                   headers: Any) -> None:
        self.sent.append((topic, key, value, partition))


def test_a_worker_deletes_and_tombstones_forgotten_batches_by_key_range_on_the_partitions_it_owns(
        tmp_path: Path) -> None:
    table, producer = FakeTable(tmp_path, [0, 1]), FakeProducer()
    for partition, key in ((0, b"a/1"), (0, b"ab/1"), (1, b"a/2"), (1, b"b/1"), (0, b"a"), (1, b"a0")):
        table.data._dbs[partition][key] = b"state"
    forgotten: set[str] = set()
    owned = {1}
    purge = TablePurge(table, producer, lambda: forgotten, owned=lambda: owned)
    assert asyncio.run(purge.run_once()) == 0
    forgotten.add("a")
    assert asyncio.run(purge.run_once()) == 1
    assert [list(table.data._dbs[p].keys()) for p in (0, 1)] == [[b"a", b"a/1", b"ab/1"], [b"a0", b"b/1"]]
    assert producer.sent == [(table.changelog_topic_name, b"a/2", None, 1)]  # partition 0 is a standby here
    table.data._dbs[1][b"a/3"] = b"state"  # written again meanwhile: not looked for again while owned
    assert asyncio.run(purge.run_once()) == 0  # nothing new: no pass over the partitions
    owned.add(0)  # its owner died before its pass: the standby taken over is purged of every forgotten batch
    table.data._dbs[2] = Rdict(str(tmp_path / "2"), Options(raw_mode=True))
    table.data._dbs[2][b"a/9"] = b"state"
    owned.add(2)  # a partition new to this worker too
    assert asyncio.run(purge.run_once()) == 2
    assert [list(table.data._dbs[p].keys()) for p in (0, 2)] == [[b"a", b"ab/1"], []]
    assert producer.sent[1:] == [(table.changelog_topic_name, b"a/1", None, 0),
                                 (table.changelog_topic_name, b"a/9", None, 2)]
    owned.discard(1)
    assert asyncio.run(purge.run_once()) == 0
    owned.add(1)  # back after another worker owned it: the state written again above goes too
    assert asyncio.run(purge.run_once()) == 1 and list(table.data._dbs[1].keys()) == [b"a0", b"b/1"]
    for db in table.data._dbs.values():
        db.close()


def result(request_id: str, batch_id: str, digest: str) -> bytes:
    return codec.encode(InferenceResult(request_id, batch_id, "m", "{}", "answer", 1, 10, 100, digest))


def test_a_forgotten_batchs_answers_leave_the_index_and_are_not_indexed_again(tmp_path: Path) -> None:
    forgotten: set[str] = set()
    index = ResultIndex(tmp_path / "index", kafka=None, results_topic="t.results",  # type: ignore[arg-type]
                        forgotten=lambda batch_id: batch_id in forgotten)
    assert asyncio.run(index.drop_batches({"a"})) == 0  # never opened: nothing to drop, nothing created
    assert not (tmp_path / "index").exists()
    for value in (result("a/1", "a", "h1"), result("b/1", "b", "h2"), result("a/2", "a", "h3")):
        asyncio.run(index._add(value))
    forgotten.add("a")
    assert asyncio.run(index.drop_batches({"a"})) == 2
    assert (asyncio.run(index.get("h1")), asyncio.run(index.get("h3"))) == (None, None)
    assert asyncio.run(index.get("h2")) is not None
    asyncio.run(index._add(result("a/1", "a", "h1")))  # read again from the topic (an index rebuilt from scratch)
    assert asyncio.run(index.get("h1")) is None
    assert asyncio.run(index.drop_batches({"a"})) == 0  # remembered as dropped: no second pass
    index.close()
