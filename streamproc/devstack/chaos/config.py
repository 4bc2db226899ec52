"""The knobs of one chaos run: how big the batch is and how hard the faults hit.

The defaults are the full run of ``scripts/chaos``; the integration test passes a smaller set. A small batch
needs the mock's request rate lowered (``mock_rpm``) so that it lasts long enough for every planned fault to
land while requests are still moving; then fewer records in flight per worker (``in_flight``) keep a
rebalance, which waits for every record in flight, from lasting as long as the paced backlog takes.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChaosConfig:
    """Sizes, counts and timings of one run (every field has a command-line flag)."""

    requests: int = 3000
    tenants: int = 1  # more: the batch is split among tenants of equal weight, the first the largest (a flood)
    priorities: bool = False  # with tenants: the flood is submitted ``low``, the others ``high`` (their own topics)
    workers: int = 2
    kills: int = 5
    kill_pause_s: float = 5.0
    broker_restarts: int = 1
    broker_down_s: float = 5.0
    outage_s: float = 30.0
    poison_per_kind: int = 3
    big_body_bytes: int = 10 * 1024 * 1024
    deep_json_depth: int = 10_000
    mock_profile: str = "realistic"
    mock_rpm: int | None = None  # None: the profile's own limit (realistic: 6,000 RPM)
    in_flight: int | None = None  # the workers' STREAMPROC_IN_FLIGHT; None: their default (256)
    seed: int = 1
    partitions: int = 8
    retry_tiers: str = "2s,5s,15s,30s"
    llm_timeout_s: float | None = None  # None: the workers' default (60 s); part of their stall threshold
    session_timeout_s: float = 10.0
    timeout_s: float = 600.0
    max_fault_gap_s: float = 60.0
    work_dir: Path | None = None
    keep_work_dir: bool = False

    def __post_init__(self) -> None:
        if self.requests < 10:
            raise ValueError("a chaos batch needs at least 10 requests")
        if self.workers < 2 and self.kills:
            raise ValueError("killing workers needs at least 2 of them (one keeps the batch moving)")
        if not 1 <= self.tenants <= MAX_TENANTS:
            raise ValueError(f"tenants must be 1 to {MAX_TENANTS}")
        if self.priorities and self.tenants < 2:
            raise ValueError("priorities need at least 2 tenants (the first submits low, the others high)")
        if min(self.tenant_sizes()) < 1:
            raise ValueError(f"{self.requests} requests are too few for {self.tenants} tenants")
        if self.poison_per_kind < 1:
            raise ValueError("poison_per_kind must be at least 1")

    def tenant_sizes(self) -> list[int]:
        """Requests per tenant: each after the first gets a quarter of the batch shared among them, the first
        the rest, so a small tenant's batch waits behind a flood on the same partitions."""
        small = self.requests // (4 * (self.tenants - 1)) if self.tenants > 1 else 0
        return [self.requests - small * (self.tenants - 1)] + [small] * (self.tenants - 1)

    def tenant_priority(self, index: int) -> str | None:
        """The priority a tenant's batch is submitted at: with ``priorities``, the flood ``low`` and the others
        ``high``, so records go through every priority's requests topic while the faults hit; else the default."""
        if not self.priorities:
            return None
        return "low" if index == 0 else "high"


MAX_TENANTS = 4


@dataclass(frozen=True)
class RunNames:
    """Unique names per run, so that a run never meets the topics, group or state of another one."""

    run_id: str

    @classmethod
    def new(cls) -> RunNames:
        return cls(f"chaos-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")

    @property
    def topic_prefix(self) -> str:
        return self.run_id

    @property
    def app_id(self) -> str:
        return f"{self.run_id}-app"

    @property
    def batch_id(self) -> str:
        """The batch whose convergence is measured."""
        return f"{self.run_id}-batch"

    @property
    def poison_batch_id(self) -> str:
        """Poison produced directly: apart from the measured batch, so it can never count as its outcome."""
        return f"{self.run_id}-poison"

    def tenant_batch_id(self, index: int) -> str:
        """The first tenant's batch is the one poison reuses ids of; the others get their own."""
        return self.batch_id if index == 0 else f"{self.batch_id}-{tenant_name(index)}"

    def submitted_poison_batch_id(self, wave: int) -> str:
        """Poison sent through ``streamproc submit`` (a batch id is accepted once)."""
        return f"{self.run_id}-poison-submitted-{wave}"


def tenant_name(index: int) -> str:
    return f"team-{'abcd'[index]}"
