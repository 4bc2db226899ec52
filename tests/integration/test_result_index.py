"""The result index behind ``--reuse-results`` on a real broker and a real RocksDB: it answers from the results
topic (first answer of an input, never a reused one), reads the topic when a lookup misses, and a new instance on
the same directory resumes where the last one stopped; a store it cannot open means no reuse, not a failure."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamproc import codec
from streamproc.app.result_index import ResultIndex
from streamproc.core.events import InferenceResult
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Settings
from tests.integration.pipeline import produce

pytestmark = pytest.mark.integration


def result(request_id: str, digest: str, content: str, reused_from: str | None = None) -> InferenceResult:
    return InferenceResult(request_id, request_id.split("/")[0], "mock-small", "{}", content, 1, 5, 1, digest,
                           reused_from=reused_from)


async def create_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    finally:
        await admin.close()


async def send(bootstrap: str, topic: str, *results: InferenceResult | bytes) -> None:
    """One key, so one partition: the order in which answers of one input arrive is the order they were sent."""
    await produce(bootstrap, topic, [(b"k", item if isinstance(item, bytes) else codec.encode(item))
                                     for item in results])


def test_the_index_answers_the_first_called_answer_reads_on_a_miss_and_resumes(settings: Settings,
                                                                              tmp_path: Path) -> None:
    bootstrap = settings.kafka_bootstrap
    assert bootstrap is not None
    topic = settings.topology().results

    async def scenario() -> None:
        await create_topic(bootstrap, topic)
        await send(bootstrap, topic, result("b0/c-1", "h1", "reused elsewhere", reused_from="x/c-0"),
                   result("a/c-1", "h1", "first"), result("a/c-2", "h2", "two"), b"not a result",
                   result("a/c-3", "h1", "a later duplicate input"))
        index = ResultIndex(tmp_path / "index", KafkaConnection(bootstrap=bootstrap), topic)
        assert await index.get("h1") is None  # nothing read before a lookup
        found = await index.find("h1")
        assert found is not None and (found.request_id, found.content) == ("a/c-1", "first")
        assert await index.find("h3") is None
        await send(bootstrap, topic, result("a/c-4", "h3", "late"))
        late = await index.find("h3")  # a miss reads the topic up to its end first
        assert late is not None and late.content == "late"
        many = await asyncio.gather(*(index.find(f"none-{i}") for i in range(50)))  # misses share reads
        assert many == [None] * 50
        # the store is locked by the first one
        held = ResultIndex(tmp_path / "index", KafkaConnection(bootstrap=bootstrap), topic)
        assert await held.find("h1") is None  # the request is called instead: reuse never fails a request
        index.close()

        again = ResultIndex(tmp_path / "index", KafkaConnection(bootstrap=bootstrap), topic)
        assert await again.get("h3") is not None  # kept on disk
        await send(bootstrap, topic, result("a/c-5", "h5", "after the restart"))
        after = await again.find("h5")
        assert after is not None and after.content == "after the restart"
        assert (await again.find("h1") or result("?", "?", "?")).content == "first"
        again.close()

    asyncio.run(scenario())
