"""Topic names and sizes; :meth:`streamproc.settings.Settings.topology` derives them from the settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from streamproc.core.durations import parse_duration_ms
from streamproc.core.retry_policy import Tier
from streamproc.core.tenancy import DEFAULT_PRIORITY, DEFAULT_TENANT, PRIORITIES
from streamproc.core.tenant_groups import tenant_group
from streamproc.core.vocabulary import FailureLayer

DEFAULT_PREFIX: Final = "llm"
LEGACY_APP_ID: Final = "streamproc"
"""The app id every deployment had before it was derived from the prefix; the default prefix keeps it."""


def default_app_id(prefix: str) -> str:
    """The consumer group and state namespace of a deployment that sets no app id: under its topic prefix.

    Two deployments with different prefixes then share nothing on a cluster: not their topics, not their group,
    not the state changelog (``<app_id>-request_state-changelog``), nor faust's own topics (design §3). The
    default prefix keeps the app id it always had, so the default deployment keeps its offsets and state.
    """
    return LEGACY_APP_ID if prefix == DEFAULT_PREFIX else f"{prefix}.{LEGACY_APP_ID}"


@dataclass(frozen=True)
class Topology:
    """Every topic streamproc reads or writes; all request-carrying ones share one partition count."""

    prefix: str
    partitions: int
    tiers: tuple[Tier, ...]
    app_id: str = LEGACY_APP_ID
    keep_outcomes_ms: int | None = None  # retention of the results and failure topics they are created with (None:
    # the broker's default); longer than automatic retention keeps a batch, so a batch is exported before it goes
    by_priority: bool = True  # whether a request is written on its priority's topic (False during a rolling upgrade
    # from a release whose workers read ``requests`` alone: :meth:`request_topic`)
    tenant_groups: int = 1  # each priority's requests topic split in this many, a tenant's requests all on one
    pinned_groups: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}), hash=False)  # tenant ->
    # its group (the others hashed: :func:`~streamproc.core.tenant_groups.tenant_group`)

    @property
    def requests(self) -> str:
        return f"{self.prefix}.requests"

    def priority_requests(self, priority: str, group: int = 0) -> str:
        """The requests topic of ``priority`` and tenant ``group``: ``<prefix>.requests`` for the default priority,
        ``<prefix>.requests.<p>`` for the others, and ``.g<k>`` after either for a group past the first (design
        §5.11, lanes and tenant groups). Each has its own agent, so a batch is never read behind a flood of another
        priority or tenant group; keyed by request id and co-partitioned like the others, so a request's state stays
        on its partition."""
        topic = self.requests if priority == DEFAULT_PRIORITY else f"{self.requests}.{priority}"
        return topic if group == 0 else f"{topic}.g{group}"

    def priority_topics(self, priority: str) -> list[str]:
        """Every tenant group's requests topic of ``priority``."""
        return [self.priority_requests(priority, group) for group in range(self.tenant_groups)]

    @property
    def request_topics(self) -> list[str]:
        """Every priority's and tenant group's requests topic, the most urgent priority first."""
        return [topic for priority in PRIORITIES for topic in self.priority_topics(priority)]

    def request_topic(self, priority: str, tenant: str = DEFAULT_TENANT) -> str:
        """Where a new request of ``priority`` and ``tenant`` is written: its priority's topic of its tenant's group,
        or ``<prefix>.requests`` while :attr:`by_priority` is off (the older workers of a rolling upgrade read no
        other); an unknown priority goes to ``<prefix>.requests`` (the handler refuses it there)."""
        if not self.by_priority or priority not in PRIORITIES:
            return self.requests
        return self.priority_requests(priority, tenant_group(tenant, self.tenant_groups, self.pinned_groups))

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
    def fleet(self) -> str:
        """The workers' beats (compacted, one partition): see :mod:`streamproc.codec.fleet_beat`."""
        return f"{self.prefix}.fleet"

    @property
    def summaries(self) -> str:
        """Per-batch counts the workers keep, one record per (batch, partition) (compacted, one partition): see
        :mod:`streamproc.codec.summary_record`."""
        return f"{self.prefix}.summaries"

    @property
    def provider_batches(self) -> str:
        """The open provider batches, one record per gather (compacted, one partition): see
        :mod:`streamproc.codec.provider_batch_record`."""
        return f"{self.prefix}.provider-batches"

    @property
    def backlog(self) -> str:
        """Requests a worker parked because their tenant was at its quota (design §5.11); keyed by request id like
        the requests topic, so a request's state stays on its partition."""
        return f"{self.prefix}.backlog"

    @property
    def inputs(self) -> list[str]:
        """The topics the workers' group consumes: new requests (every priority's), the backlog and every retry tier."""
        return [*self.request_topics, self.backlog, *(self.retry(tier) for tier in self.tiers)]

    @property
    def state_changelog(self) -> str:
        """faust's backup topic of the ``request_state`` table (``<app_id>-<table>-changelog``)."""
        return f"{self.app_id}-request_state-changelog"

    def failed(self, layer: FailureLayer) -> str:
        return f"{self.prefix}.failed.{layer.value}"

    def retry(self, tier: Tier) -> str:
        return f"{self.prefix}.retry.{tier.name}"

    @property
    def outcomes(self) -> list[str]:
        """Where requests end: the results and the failure topics (what exports, the sink and backfill read)."""
        return [self.results, *(self.failed(layer) for layer in FailureLayer)]

    def all_topics(self) -> dict[str, int]:
        """Name -> partition count, for creation and the startup check."""
        names = [*self.request_topics, self.backlog, self.results, self.dead_letters]
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
