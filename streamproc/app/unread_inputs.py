"""Which input topics hold records that have not yet reached their agent: still at the broker, fetched by faust and
not handed over, or handed over and waiting in the agent's buffer.

faust hands the records of one fetch (up to ``broker_max_poll_records``) to the agents one by one, yielding to the
loop after each, and fetches again only once the whole batch is handed over. A batch of a ``low`` flood is thus handed
over at the pace its agent takes it (a reservation, a wait or a send per record), and ``high`` records fetched
meanwhile wait behind the rest of it: 18 to 34 s on a loaded machine (design §5.11, reading). A lower priority's agent
that holds off while a more urgent topic has such records lets faust hand the rest of its batch over at once (into a
buffer one fetch never fills, ``input_buffer``) and reach them. Records handed over but still in the ``high`` agent's
buffer count too: a ``low`` record waiting in memory that took the place a ``high`` call gave back would start
beside the ``high`` ones still to come.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping
from typing import Any


def unread_topics(consumer: Any, topics: Collection[str], reached: Mapping[Any, int],
                  fetched: Container[Any] = ()) -> set[str]:
    """The ``topics`` with an assigned partition whose log end (as of the consumer's latest fetch response) is past
    the last record that reached its agent (``reached``: offset per partition, kept by the worker). A partition no
    record reached since it was assigned counts from its committed offset. With none (a topic never committed,
    such as a first ``high`` batch's) the log end says nothing, but records the client holds fetched (``fetched``:
    :func:`fetched_partitions`) have not reached the agent. (faust's own read offset cannot tell: its seek sets it
    to the committed position, 0 for a partition never committed, as if record 0 had been handed over.)"""
    committed = consumer._committed_offset  # faust: the offset committed per partition
    found: set[str] = set()
    for tp in consumer.assignment():
        if tp.topic not in topics or tp.topic in found:
            continue
        last = reached.get(tp)
        next_offset = last + 1 if last is not None else committed.get(tp)
        if next_offset is None:
            if tp in fetched:
                found.add(tp.topic)
            continue
        end = consumer.highwater(tp)
        if end is not None and end > next_offset:
            found.add(tp.topic)
    return found


def fetched_partitions(consumer: Any) -> Container[Any]:
    """The partitions the Kafka client holds a fetched batch of that faust has not taken yet (aiokafka's fetcher
    buffer, in the consumer's thread: a membership test of its dict is atomic)."""
    try:
        records: Container[Any] = consumer._thread._ensure_consumer()._fetcher._records
    except (AttributeError, RuntimeError):  # not started, or stopped
        return ()
    return records
