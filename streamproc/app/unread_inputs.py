"""Which input topics hold records that faust has fetched, or the broker has, and not yet handed to their agent.

faust hands the records of one fetch (up to ``broker_max_poll_records``) to the agents one by one, yielding to the
loop after each, and fetches again only once the whole batch is handed over. A batch of a ``low`` flood is thus handed
over at the pace its agent takes it (a reservation, a wait or a send per record), and ``high`` records fetched
meanwhile wait behind the rest of it: 18 to 34 s on a loaded machine (design §5.11, reading). A lower priority's agent
that holds off while a more urgent topic has such records lets faust hand the rest of its batch over at once (into a
buffer one fetch never fills, ``input_buffer``) and reach them.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def unread_topics(consumer: Any, topics: Collection[str]) -> set[str]:
    """The ``topics`` with an assigned partition whose log end (as of the consumer's latest fetch response) is past
    the record faust last handed to its agent. A partition with nothing handed over since it was assigned and no
    committed offset counts as read: nothing says where its agent stands."""
    read = consumer._read_offset  # faust: the last offset handed to the agents, per partition (set after each)
    committed = consumer._committed_offset
    found: set[str] = set()
    for tp in consumer.assignment():
        if tp.topic not in topics or tp.topic in found:
            continue
        last = read.get(tp)
        next_offset = last + 1 if last is not None else committed.get(tp)
        end = consumer.highwater(tp)
        if next_offset is not None and end is not None and end > next_offset:
            found.add(tp.topic)
    return found
