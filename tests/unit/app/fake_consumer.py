"""faust's consumer as the priority readers see it: the assignment, the highwaters and the committed offsets."""

from __future__ import annotations

from dataclasses import dataclass, field

from faust.types import TP


@dataclass
class FakeConsumer:
    ends: dict[TP, int | None]
    _committed_offset: dict[TP, int | None] = field(default_factory=dict)

    def assignment(self) -> set[TP]:
        return set(self.ends)

    def highwater(self, tp: TP) -> int | None:
        return self.ends[tp]
