"""Calls judged in the order they were sent, not answered: a refusal comes back at once while an answer takes
seconds, so the first calls to *come back* are often refusals of calls sent after others still being answered
(a real llama.cpp server refusing ``json_schema`` at once). A pause judged in answer order would stop work whose
earlier calls were about to succeed. A call that ended without an answer is passed over as ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class SentOrder(Generic[T]):
    """Numbers calls as they are sent and hands their ends back in that order."""

    sent: int = 0  # calls numbered by :meth:`begin`
    judged: int = 0  # the next call to hand back
    ended: dict[int, T | None] = field(default_factory=dict)  # ended, waiting for those sent before

    def begin(self) -> int:
        self.sent += 1
        return self.sent - 1

    def end(self, call: int, value: T | None) -> list[T | None]:
        """Call number ``call`` ended with ``value``; the ends now due, in the order sent (those waiting for an
        earlier call stay). An end of a call older than the last :meth:`skip` is dropped."""
        if call < self.judged:
            return []
        self.ended[call] = value
        due: list[T | None] = []
        while self.judged in self.ended:
            due.append(self.ended.pop(self.judged))
            self.judged += 1
        return due

    def skip(self) -> None:
        """Forget the ends waiting: the calls sent so far no longer count (an answer, or a pause, settled them)."""
        self.ended.clear()
        self.judged = self.sent
