"""The pipeline's topics as the broker holds them: compaction where the design says, and a state changelog whose
segments roll often enough for compaction to reach a request's repeated writes."""

from __future__ import annotations

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streamproc.app.topics import ensure_pipeline_topics
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings

pytestmark = pytest.mark.integration


async def topic_configs(bootstrap: str, topics: list[str], names: set[str]) -> dict[str, dict[str, str]]:
    """The broker's value of each config in ``names``, per topic (defaults included)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
    finally:
        await admin.close()
    return {resource[3]: {name: value for name, value, *_ in resource[4] if name in names}
            for response in responses for resource in response.resources}


async def test_the_state_changelog_is_compacted_with_hourly_segments_and_the_requests_topic_is_not(
        settings: Settings) -> None:
    assert settings.kafka_bootstrap is not None
    topology = settings.topology()
    await ensure_pipeline_topics(KafkaConnection(bootstrap=settings.kafka_bootstrap), topology)
    configs = await topic_configs(settings.kafka_bootstrap,
                                  [topology.state_changelog, topology.batches, topology.provider_batches,
                                   topology.requests],
                                  {"cleanup.policy", "segment.ms", "max.compaction.lag.ms", "delete.retention.ms"})
    hour = "3600000"  # forgotten states and their tombstones leave the changelog within hours, not days
    assert configs[topology.state_changelog] == {"cleanup.policy": "compact", "segment.ms": hour,
                                                 "max.compaction.lag.ms": hour, "delete.retention.ms": hour}
    assert configs[topology.batches] == {"cleanup.policy": "compact", "segment.ms": "604800000",  # the defaults
                                         "max.compaction.lag.ms": "9223372036854775807",
                                         "delete.retention.ms": "86400000"}
    assert configs[topology.provider_batches] == configs[topology.batches]
    assert configs[topology.requests] == {**configs[topology.batches], "cleanup.policy": "delete"}


async def test_with_automatic_retention_the_outcome_topics_keep_their_records_a_week_longer(
        settings: Settings) -> None:
    assert settings.kafka_bootstrap is not None
    retained = settings.model_copy(update={"retain_finished": "30d"})
    topology = retained.topology()
    await ensure_pipeline_topics(KafkaConnection(bootstrap=settings.kafka_bootstrap), topology)
    configs = await topic_configs(settings.kafka_bootstrap, [*topology.outcomes, topology.requests],
                                  {"retention.ms"})
    assert {topic: configs[topic]["retention.ms"] for topic in topology.outcomes} == dict.fromkeys(
        topology.outcomes, str(37 * 86_400_000))
    assert configs[topology.requests] == {"retention.ms": "604800000"}  # the broker's default
