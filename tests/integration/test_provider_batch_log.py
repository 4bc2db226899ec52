"""The provider-batch records on the real broker (issue 31): each write is on the broker when it returns, a reader
gets the latest record of each gather of the partitions it owns, a tombstone forgets one, and a record this
version cannot read hides the older ones of its key instead of letting a worker act on a stale state."""

from __future__ import annotations

import pytest

from streamproc.app.provider_batch_log import ProviderBatchLog, owned_records
from streamproc.app.topic_reader import TopicReader
from streamproc.app.topics import ensure_pipeline_topics
from streamproc.core.provider_batch_objects import BatchPhase, ProviderBatchView
from streamproc.core.provider_batch_takeover import ProviderBatchRecord, RecordState
from streamproc.kafka.clients import kafka_producer
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings

pytestmark = pytest.mark.integration


def record(gather_id: str, partition: int) -> ProviderBatchRecord:
    return ProviderBatchRecord(gather_id, "openai", "gpt-4o-mini", partition, (f"{gather_id}/r1", f"{gather_id}/r2"),
                               RecordState.CREATING, 1, 1)


async def test_a_takeover_reads_the_latest_record_of_each_owned_gather(settings: Settings) -> None:
    assert settings.kafka_bootstrap is not None
    kafka = KafkaConnection(bootstrap=settings.kafka_bootstrap)
    topology = settings.topology()
    await ensure_pipeline_topics(kafka, topology)
    producer = kafka_producer(kafka, **settings.durability.producer_options())
    await producer.start()
    try:
        log = ProviderBatchLog(producer, topology.provider_batches)
        creating, other, ended, newer = record("g-1", 0), record("g-2", 1), record("g-3", 0), record("g-4", 0)
        opened = creating.opened(ProviderBatchView("openai", "batch_1", BatchPhase.VALIDATING, 2, 0), 2)
        for step in (creating, other, ended, newer, opened):
            await log.write(step)
        await log.forget(ended.gather_id)
        await producer.send_and_wait(topology.provider_batches, key=b"g-4", value=b'{"v":2,"members":[]}')
    finally:
        await producer.stop()

    unreadable: list[str] = []
    async with TopicReader(kafka, [topology.provider_batches]) as reader:
        found = await owned_records(reader, {0}, unreadable.append)
    assert found == {"g-1": opened}  # g-2 is partition 1's, g-3 forgotten, g-4 written by a newer version
    assert len(unreadable) == 1 and "g-4" in unreadable[0] and "version 2" in unreadable[0]
