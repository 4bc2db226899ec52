"""The outcomes already written for the members of provider batches a worker takes over (design §8): one
partition of the results and failure topics, read from a time on (offsets by timestamp) to their ends, with no
consumer group. The members' outcomes sit on their requests' partition: every topic has the same partition count
and is keyed by request id.

A taken-over batch whose killed owner wrote some of its lines' outcomes (but not their states) ends those members
from what was written instead of answering them again (``core.written_outcome``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from aiokafka.structs import ConsumerRecord, TopicPartition

from streamproc import codec
from streamproc.core.events import FailureEvent, InferenceResult
from streamproc.core.topology import Topology
from streamproc.core.written_outcome import WrittenOutcome, written_failure, written_result
from streamproc.kafka.clients import kafka_consumer
from streamproc.kafka.connection import KafkaConnection
from streamproc.kafka.schema_registry import NO_REGISTRY, SchemaReader
from streamproc.llm.completion import answer_tokens

log = logging.getLogger(__name__)

_FETCH_MAX_WAIT_MS = 20


class WrittenOutcomes:
    """Reads one request partition's outcomes, through the worker's connection and schema reader."""

    def __init__(self, kafka: KafkaConnection, topology: Topology, schemas: SchemaReader = NO_REGISTRY) -> None:
        self._kafka = kafka
        self._results = topology.results
        self._outcomes = topology.outcomes  # the results and the failure topics
        self._schemas = schemas

    async def since(self, partition: int, since_ms: int, members: Collection[str],
                    ) -> dict[str, list[WrittenOutcome]]:
        """The results and terminal failures of ``members`` written on ``partition`` from ``since_ms`` on."""
        wanted = set(members)
        written: dict[str, list[WrittenOutcome]] = {}
        async for record in self._records(partition, since_ms):
            if record.key is None or (request_id := record.key.decode(errors="replace")) not in wanted:
                continue
            outcome = await self._outcome(record)
            if outcome is not None:
                written.setdefault(request_id, []).append(outcome)
        return written

    async def _outcome(self, record: ConsumerRecord[Any, Any]) -> WrittenOutcome | None:
        try:
            await self._schemas.fetch_ahead(record.value)
            if record.topic == self._results:
                result = codec.decode(record.value, InferenceResult, schema_lookup=self._schemas.lookup)
                return written_result(result, answer_tokens(result.response_json.encode()))
            return written_failure(codec.decode(record.value, FailureEvent, schema_lookup=self._schemas.lookup))
        except codec.CodecError as exc:  # a foreign record: no outcome of ours
            log.warning("%s[%d]@%d is no outcome: %s", record.topic, record.partition, record.offset, exc)
            return None

    async def _records(self, partition: int, since_ms: int) -> Any:
        consumer = kafka_consumer(self._kafka, group_id=None, enable_auto_commit=False,
                                  auto_offset_reset="earliest", fetch_max_wait_ms=_FETCH_MAX_WAIT_MS)
        await consumer.start()
        try:
            parts = [TopicPartition(topic, partition) for topic in self._outcomes]
            consumer.assign(parts)
            ends = await consumer.end_offsets(parts)
            starts = await consumer.offsets_for_times(dict.fromkeys(parts, since_ms))
            for part in parts:
                found = starts.get(part)
                consumer.seek(part, ends[part] if found is None else found.offset)
            while behind := [p for p in parts if await consumer.position(p) < ends[p]]:
                fetched = await consumer.getmany(*behind, timeout_ms=500, max_records=10_000)
                for part, records in fetched.items():
                    for record in records:
                        if record.offset < ends[part]:
                            yield record
        finally:
            await consumer.stop()
