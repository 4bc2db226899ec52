"""``streamproc cancel``: mark a batch cancelled on its manifest; the workers end what they have not called.

The manifest topic is compacted and keyed by batch id, so the cancel is the batch's manifest written again
with ``cancelled_ms``. Every worker follows that topic (``app/manifest_follower``) and ends a request of a
cancelled batch as a business ``batch_cancelled`` failure (OpenAI's code) instead of calling it; calls
already in flight finish. So the batch converges, and ``results`` exports those requests in the errors file.
"""

from __future__ import annotations

import time
from dataclasses import replace

from streamproc.app.topic_reader import TopicReader
from streamproc.codec.manifest import BatchManifest, encode_manifest
from streamproc.core.topology import Topology
from streamproc.errors import ExitCode, UserFacingError
from streamproc.kafka.clients import kafka_producer
from streamproc.kafka.connection import KafkaConnection
from streamproc.ops.status import decode_records
from streamproc.settings import Durability


class NoManifestError(UserFacingError):
    """The batch has no manifest (unknown, or produced without ``submit``)."""

    exit_code = ExitCode.USAGE


async def cancel_batch(kafka: KafkaConnection, topology: Topology, durability: Durability,
                       batch_id: str) -> BatchManifest:
    """Write the batch's manifest again, cancelled now (or keep the first cancel time); returns it."""
    manifest: BatchManifest | None = None
    async with TopicReader(kafka, [topology.batches]) as reader:
        found, _ = decode_records(await reader.read_to_end(), topology)
        for candidate in found:
            if candidate.batch_id == batch_id:
                manifest = candidate
    if manifest is None:
        raise NoManifestError(f"no manifest for batch {batch_id!r} on {topology.batches}: only a batch sent with "
                              "`streamproc submit` (or `run`) can be cancelled")
    if manifest.cancelled_ms is not None:
        return manifest
    cancelled = replace(manifest, cancelled_ms=int(time.time() * 1000))
    producer = kafka_producer(kafka, **durability.producer_options())
    try:
        await producer.start()
        await producer.send_and_wait(topology.batches, key=batch_id.encode(), value=encode_manifest(cancelled))
    finally:
        await producer.stop()
    return cancelled
