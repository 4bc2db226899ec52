"""Topic names and sizes; :meth:`streamproc.settings.Settings.topology` derives them from the settings."""

from __future__ import annotations

from dataclasses import dataclass

from streamproc.core.durations import parse_duration_ms
from streamproc.core.retry_policy import Tier
from streamproc.core.vocabulary import FailureLayer


@dataclass(frozen=True)
class Topology:
    """Every topic streamproc reads or writes; all request-carrying ones share one partition count."""

    prefix: str
    partitions: int
    tiers: tuple[Tier, ...]
    app_id: str = "streamproc"

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

    @property
    def batches(self) -> str:
        """Batch manifests (compacted, one partition): see :mod:`streamproc.codec.manifest`."""
        return f"{self.prefix}.batches"

    @property
    def state_changelog(self) -> str:
        """faust's backup topic of the ``request_state`` table (``<app_id>-<table>-changelog``)."""
        return f"{self.app_id}-request_state-changelog"

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


def parse_tiers(spec: str) -> tuple[Tier, ...]:
    """``"5s,30s,2m,10m"`` -> tiers named as written, with their delays."""
    tiers = []
    for name in spec.split(","):
        delay = parse_duration_ms(name.strip())
        if delay is None:
            raise ValueError(f"retry tier {name!r} is not a duration like 5s, 2m or 500ms")
        tiers.append(Tier(name.strip(), delay))
    return tuple(tiers)
