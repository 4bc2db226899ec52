"""Which changelog records a table restore still has to read, and how far a fetch brought it (issue 29).

Offsets follow faust's recovery bookkeeping: a partition's *offset* is the last record applied (-1 or None:
none yet), its *highwater* the last record in the log when the restore began (-1: an empty log)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

P = TypeVar("P", bound=Hashable)


@dataclass(frozen=True)
class Span:
    """The records of one partition still to read: from ``first`` through ``last``, both included."""

    first: int
    last: int

    @property
    def records(self) -> int:
        """At most this many records (compaction may have removed some)."""
        return self.last - self.first + 1


def changelog_reads(partitions: Iterable[P], applied: Mapping[P, int | None],
                    highwaters: Mapping[P, int | None]) -> dict[P, Span]:
    """The partitions with records past their last applied one up to the highwater, and from where."""
    reads: dict[P, Span] = {}
    for partition in partitions:
        highwater = highwaters.get(partition)
        done = applied.get(partition)
        first = 0 if done is None else done + 1
        if highwater is not None and highwater >= first:
            reads[partition] = Span(first, highwater)
    return reads


@dataclass(frozen=True)
class Applied:
    """A changelog fetch's writes for one partition: the latest value per key (``None``: a tombstone, a
    delete), and the highest offset it covered (None: no record within the span). Records past the span's
    end are left out: faust restores to the highwater it took, and what came after is not part of it."""

    writes: dict[bytes, bytes | None]
    last_offset: int | None

    @classmethod
    def of(cls, records: Iterable[tuple[int, bytes | None, bytes | None]], span: Span) -> Applied:
        """From ``(offset, key, value)`` records in log order; a record without a key is skipped (a table
        write always has one)."""
        writes: dict[bytes, bytes | None] = {}
        last = None
        for offset, key, value in records:
            if offset > span.last:
                break
            last = offset
            if key is not None:
                writes[key] = value  # a later write of the key replaces it: the log's order per key
        return cls(writes, last)
