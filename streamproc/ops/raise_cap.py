"""``streamproc raise-cap``: give a capped batch a larger spend cap; its requests waiting at the cap go on.

The cap is a record on the manifests topic keyed ``<batch id>/cap`` (codec.batch_cap), so raising it writes the
record again. Every worker follows that topic (``app/manifest_follower``) and lets calls start again within a
poll of the manifests; requests parked at the cap come back from the shortest retry tier within its delay.
"""

from __future__ import annotations

import time

from streamproc.app.topic_reader import TopicReader
from streamproc.codec.batch_cap import BatchCap, cap_key, decode_batch_cap, encode_batch_cap
from streamproc.core.spend_cap import Cap
from streamproc.core.topology import Topology
from streamproc.errors import ExitCode, UserFacingError
from streamproc.kafka.clients import kafka_producer
from streamproc.kafka.connection import KafkaConnection
from streamproc.settings import Durability


class CapError(UserFacingError):
    """The batch has no cap to raise, or the new one is lower."""

    exit_code = ExitCode.USAGE


async def raise_cap(kafka: KafkaConnection, topology: Topology, durability: Durability, batch_id: str,
                    max_cost_usd: float | None, max_tokens: int | None) -> BatchCap:
    """Write the batch's cap again with the new limits (a limit not given stays as it was); returns it."""
    current = await read_cap(kafka, topology, batch_id)
    if current is None:
        raise CapError(f"batch {batch_id!r} has no spend cap on {topology.batches}: only a batch submitted with "
                       "--max-cost-usd or --max-tokens can have its cap raised")
    old = current.cap
    new = Cap(old.max_cost_usd if max_cost_usd is None else max_cost_usd,
              old.max_tokens if max_tokens is None else max_tokens)
    if _lower(new.max_cost_usd, old.max_cost_usd) or _lower(new.max_tokens, old.max_tokens):
        raise CapError(f"batch {batch_id!r}: the new cap ({new.describe()}) is lower than the current one "
                       f"({old.describe()}); a cap can only be raised")
    raised = BatchCap(batch_id, new, int(time.time() * 1000))
    producer = kafka_producer(kafka, **durability.producer_options())
    try:
        await producer.start()
        await producer.send_and_wait(topology.batches, key=cap_key(batch_id), value=encode_batch_cap(raised))
    finally:
        await producer.stop()
    return raised


async def read_cap(kafka: KafkaConnection, topology: Topology, batch_id: str) -> BatchCap | None:
    """The batch's latest cap on the manifests topic, or None."""
    found = None
    async with TopicReader(kafka, [topology.batches]) as reader:
        for record in await reader.read_to_end():
            if record.key == cap_key(batch_id) and record.value:
                try:
                    found = decode_batch_cap(record.value)
                except ValueError:
                    continue
    return found


def _lower(new: float | None, old: float | None) -> bool:
    """Whether ``new`` caps more tightly than ``old`` (None: no cap)."""
    return new is not None and (old is None or new < old)
