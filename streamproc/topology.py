"""Topic names and sizes, derived from the settings in one place (DESIGN §3)."""

from __future__ import annotations

from dataclasses import dataclass

from streamproc.layers import FailureLayer
from streamproc.retry import Tier


@dataclass(frozen=True)
class Topology:
    """Every topic streamproc reads or writes; all request-carrying ones share one partition count."""

    prefix: str
    partitions: int
    tiers: tuple[Tier, ...]

    @property
    def requests(self) -> str:
        return f"{self.prefix}.requests"

    @property
    def results(self) -> str:
        return f"{self.prefix}.results"

    @property
    def dead_letters(self) -> str:
        """Records without even a readable request id: kept byte for byte, with the reason in headers."""
        return f"{self.prefix}.deadletter"

    def failed(self, layer: FailureLayer) -> str:
        return f"{self.prefix}.failed.{layer.value}"

    def retry(self, tier: Tier) -> str:
        return f"{self.prefix}.retry.{tier.name}"

    def all_topics(self) -> dict[str, int]:
        """Name -> partition count, for creation and the startup check."""
        names = [self.requests, self.results, self.dead_letters]
        names += [self.failed(layer) for layer in FailureLayer]
        names += [self.retry(tier) for tier in self.tiers]
        return dict.fromkeys(names, self.partitions)
