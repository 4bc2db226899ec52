"""Reading the summary topic: every batch's summaries, or one batch's only (status of one batch), its tombstones
and the stream's kept apart."""

from __future__ import annotations

from collections import Counter
from typing import Any

from aiokafka.structs import ConsumerRecord

from streamproc.app.summary_reader import read_summaries
from streamproc.codec.summary_record import encode_summary, encode_summary_key
from streamproc.core.batch_summary import BatchCounts, SummaryKey, SummaryView
from streamproc.core.topology import Topology

TOPOLOGY = Topology("llm", 2, ())


def summary(batch_id: str | None, partition: int, succeeded: int | None) -> ConsumerRecord[Any, Any]:
    """A summary record (``succeeded`` None: the batch's tombstone)."""
    value = None if succeeded is None else encode_summary(BatchCounts(by_status=Counter(succeeded=succeeded)), 7)
    return ConsumerRecord(topic=TOPOLOGY.summaries, partition=0, offset=0, timestamp=0, timestamp_type=0,
                          key=encode_summary_key(SummaryKey(batch_id, partition)), value=value, checksum=None,
                          serialized_key_size=0, serialized_value_size=0, headers=())


RECORDS = [summary("a", 0, 2), summary("b", 0, 5), summary("a", 1, 3), summary(None, 0, 9), summary("b", 1, 1),
           summary("b", 1, None)]


def test_every_batch_is_read_without_a_batch_id() -> None:
    view = SummaryView()
    read_summaries(RECORDS, TOPOLOGY, view)
    assert {key: counts.by_status["succeeded"] for key, (counts, _) in view.latest.items()} == {
        SummaryKey("a", 0): 2, SummaryKey("b", 0): 5, SummaryKey("a", 1): 3, SummaryKey(None, 0): 9}


def test_only_the_batch_named_is_read() -> None:
    view = SummaryView()
    read_summaries(RECORDS, TOPOLOGY, view, "a")
    assert set(view.latest) == {SummaryKey("a", 0), SummaryKey("a", 1)}
    assert view.batch("a") == (BatchCounts(by_status=Counter(succeeded=5)), 7)
