"""Create topics up front and refuse to run on a topic whose partition count differs from the plan.

Co-partitioning is what keeps per-request state local to the worker that owns a request, so a
mismatched topic is a configuration error to stop on, not something to work around.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_after_attempt, wait_fixed

from streamproc.app.namespace import refuse_legacy_takeover
from streamproc.core.replication import AUTOMATIC, Replication, ReplicationRequest, ReplicationUnsatisfiable
from streamproc.core.topology import Topology
from streamproc.errors import UserFacingError
from streamproc.kafka.clients import kafka_admin
from streamproc.kafka.connection import KafkaConnection


class TopicMismatchError(UserFacingError):
    """An existing topic has another partition count than streamproc needs."""


class ReplicationError(UserFacingError):
    """The cluster cannot hold the replicas the settings ask for."""


def _partition_counts(metadata: list[dict[str, object]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for topic in metadata:
        if topic.get("error_code", 0) == 0:
            partitions = topic.get("partitions")
            counts[str(topic["topic"])] = len(partitions) if isinstance(partitions, list) else 0
    return counts


def _some_missing(counts: dict[str, int]) -> bool:
    return any(count == 0 for count in counts.values())


def _last_result(state: RetryCallState) -> Any:
    assert state.outcome is not None
    return state.outcome.result()


async def _described_partitions(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """Partition counts of ``names`` (0 for a topic without partitions yet); a new topic's metadata can lag
    its creation by a moment, so they are asked again (50 times, 0.1 s apart) until every one has some."""

    async def describe() -> dict[str, int]:
        counts = _partition_counts(await admin.describe_topics(names))
        return {name: counts.get(name, 0) for name in names}

    retrying = AsyncRetrying(retry=retry_if_result(_some_missing), stop=stop_after_attempt(50), wait=wait_fixed(0.1),
                             retry_error_callback=_last_result)
    counts: dict[str, int] = await retrying(describe)
    return counts


async def ensure_topics(kafka: KafkaConnection, partitions_by_topic: Mapping[str, int],
                        configs: Mapping[str, Mapping[str, str]] | None = None,
                        replication: ReplicationRequest = AUTOMATIC) -> Replication:
    """Create the missing topics (with ``configs`` per topic, e.g. compaction, and ``replication`` settled against
    the cluster's broker count); raise :class:`TopicMismatchError` for an existing one of the wrong size.
    Returns the replication used, for the topics faust creates itself."""
    admin = kafka_admin(kafka)
    await admin.start()
    try:
        brokers = len((await admin.describe_cluster())["brokers"])
        try:
            plan = replication.plan(brokers)
        except ReplicationUnsatisfiable as exc:
            raise ReplicationError(str(exc)) from exc
        existing = set(await admin.list_topics())
        missing = [NewTopic(name, count, plan.factor,
                            topic_configs={**plan.topic_configs(), **(configs or {}).get(name, {})})
                   for name, count in partitions_by_topic.items() if name not in existing]
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):  # another worker created them first
                await admin.create_topics(missing)
        counts = await _described_partitions(admin, list(partitions_by_topic))
        wrong = {name: counts.get(name, 0) for name, want in partitions_by_topic.items()
                 if counts.get(name, 0) != want}
        if wrong:
            details = ", ".join(f"{name} has {have} (needs {partitions_by_topic[name]})"
                                for name, have in wrong.items())
            raise TopicMismatchError(
                f"topic partition counts differ from the configuration: {details}; every request-carrying "
                "topic must have the same partition count: recreate the topics or change the setting"
            )
        return plan
    finally:
        await admin.close()


COMPACTED = {"cleanup.policy": "compact"}
# Compaction never touches a partition's active segment, which by the broker's default rolls after 7 days or
# 1 GiB: a request's 2-4 state writes all stayed in the changelog for a week, and a worker restoring a partition
# (a new machine, a partition moved without a standby) read them all. Rolled every hour, they become one per
# request once the broker's cleaner passes.
# ``forget`` appends a tombstone per state; by the broker's defaults the cleaner waited for half the log to be
# dirty (tombstones are small: 800,000 of them beside 1,000,000 states are not half) and kept each tombstone
# a day after, and a restore read the forgotten states, then their tombstones: 7.96 x the live states' time.
# ``max.compaction.lag.ms`` makes a rolled segment with dirty records cleanable after an hour whatever the ratio,
# and ``delete.retention.ms`` lets a later pass drop a tombstone an hour after the first: the changelog holds the
# live states alone 2-4 hours after a forget (design §4, convergence after forget). An hour is the time a reader
# from the start of the log (a restore from scratch, ``status --verify``, ``forget``'s fold) has to reach a
# tombstone it must see; a worker whose disk is older than that purges the forgotten batches itself
# (app/table_purge.py).
HOUR_MS = str(60 * 60 * 1000)
STATE_CHANGELOG = {**COMPACTED, "segment.ms": HOUR_MS, "max.compaction.lag.ms": HOUR_MS,
                   "delete.retention.ms": HOUR_MS}
# A beat a second per worker: compaction keeps the latest of each worker once a segment rolls (every minute),
# and a worker gone without its tombstone (SIGKILLed) is deleted with its segment after an hour, so a worker
# starting reads a few minutes of beats.
FLEET = {"cleanup.policy": "compact,delete", "segment.ms": str(60 * 1000), "retention.ms": str(60 * 60 * 1000)}


# A summary is rewritten at most once a second per (batch, partition) while its batch moves: a segment rolled every
# ten minutes lets the cleaner bring the topic down to one record per key, live batches x partitions.
SUMMARIES = {**COMPACTED, "segment.ms": str(10 * 60 * 1000)}


async def ensure_pipeline_topics(kafka: KafkaConnection, topology: Topology,
                                 replication: ReplicationRequest = AUTOMATIC) -> Replication:
    """Every topic of the pipeline: the request-carrying ones co-partitioned, the batch manifests, the workers'
    beats, the batch summaries and the open provider batches compacted, the results and failure topics kept
    longer than automatic retention keeps a batch (when it is on: ``Topology.keep_outcomes_ms``).

    The state table's changelog is created here too, before any worker starts: when faust creates it
    itself, its consumer can cache metadata taken while the new topic has no partitions yet, and then
    refuses every table write (``PartitionsMismatch``) until the next metadata refresh (seen in tests).
    A namespace that would take over the work of the legacy shared group is refused first (app/namespace).
    """
    await refuse_legacy_takeover(kafka, topology)
    kept = ({} if topology.keep_outcomes_ms is None else
            {topic: {"retention.ms": str(topology.keep_outcomes_ms)} for topic in topology.outcomes})
    return await ensure_topics(kafka, {**topology.all_topics(), topology.state_changelog: topology.partitions,
                                           topology.batches: 1, topology.fleet: 1, topology.summaries: 1,
                                           topology.provider_batches: 1},
                               configs={**kept, topology.batches: COMPACTED, topology.state_changelog: STATE_CHANGELOG,
                                        topology.fleet: FLEET, topology.summaries: SUMMARIES,
                                        topology.provider_batches: COMPACTED},
                               replication=replication)
