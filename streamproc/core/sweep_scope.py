"""Which ``request_state`` entries a reconciler pass reads (design §4, "stranded requests").

The state table keeps every request ever seen, finished ones included: a million entries after a few big
batches. A pass that decoded all of them every 30 s would cost a worker more CPU than its requests do. Only
an open state (in flight or waiting) can be stranded, and a state changes only when the worker that owns
its partition writes it. So a pass reads every entry only when the worker's partitions changed (a start, a
rebalance: states it has never seen), and otherwise only the entries still open at the last pass and the
ones written since.
"""

from __future__ import annotations

from collections.abc import Hashable


class SweepScope:
    """Tracks the open keys and the keys written between passes; :meth:`plan` says what the next pass reads."""

    def __init__(self) -> None:
        self._open: set[bytes] = set()
        self._written: set[bytes] = set()
        self._swept: Hashable | None = None  # the assignment the last complete pass read in full

    def written(self, key: bytes) -> None:
        """A state was written (called for every table write)."""
        self._written.add(key)

    def plan(self, assignment: Hashable) -> set[bytes] | None:
        """The keys the pass over ``assignment`` must read, or None for every entry (the assignment is new)."""
        keys = None if assignment != self._swept else self._open | self._written
        self._written = set()
        return keys

    def done(self, assignment: Hashable, open_keys: set[bytes]) -> None:
        """The pass over ``assignment`` completed and found these keys open."""
        self._swept = assignment
        self._open = open_keys

    def reset(self) -> None:
        """A pass did not complete: the next one reads every entry."""
        self._swept = None
        self._open = set()
