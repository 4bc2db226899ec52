"""How many requests each batch submitted, and which batches are closed (cancelled, past their completion
window, or forgotten), followed from the manifests topic.

The retry budget of a batch is a fraction of its first attempts (design §5). Counting them as they happen
makes the budget strict early in a batch and after a restart, so a worker also reads the batch manifests
(``llm.batches``: compacted, one partition, written by ``submit`` once a file is sent, see
:mod:`streamproc.codec.manifest`). Every worker reads the whole topic without a consumer group, so each knows
every batch whatever partitions it owns. A batch produced without ``submit`` has no manifest: its budget
counts first attempts as they happen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_fixed

from streamproc.app.topic_reader import TopicReader
from streamproc.codec.batch_cap import decode_batch_cap
from streamproc.codec.manifest import decode_manifest
from streamproc.core.retention import BATCH_FORGOTTEN
from streamproc.core.spend_cap import Cap
from streamproc.kafka.connection import KafkaConnection

log = logging.getLogger(__name__)

BATCH_CANCELLED = "batch_cancelled"  # OpenAI's error codes of a request its batch's end reached first
BATCH_EXPIRED = "batch_expired"

FOLLOW_INTERVAL_S = 2.0


class BatchSizes:
    """batch id -> submitted count, and the cancelled batches, from the manifests read so far."""

    def __init__(self, clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self._sizes: dict[str, int] = {}
        self._cancelled: set[str] = set()
        self._expires: dict[str, int] = {}
        self._deadlines: dict[str, int] = {}
        self._reusing: set[str] = set()
        self._caps: dict[str, Cap] = {}
        self._forgotten: set[str] = set()
        self._clock_ms = clock_ms

    @property
    def forgotten_batches(self) -> frozenset[str]:
        """The batches forgotten so far (``streamproc forget``, automatic retention)."""
        return frozenset(self._forgotten)

    def forgotten(self, batch_id: str | None) -> bool:
        return batch_id in self._forgotten

    def submitted(self, batch_id: str) -> int | None:
        return self._sizes.get(batch_id)

    def reuses(self, batch_id: str | None) -> bool:
        """Whether the batch was submitted with ``--reuse-results`` (as far as its manifest is known yet)."""
        return batch_id in self._reusing

    def cap(self, batch_id: str) -> Cap | None:
        """The batch's spend cap as last written (``submit``, ``raise-cap``); None: none read."""
        return self._caps.get(batch_id)

    def deadline(self, batch_id: str | None) -> int | None:
        """When the batch's ``submit --deadline`` passes (None: none read): then a routed model's request goes by a
        call instead of a provider batch."""
        return None if batch_id is None else self._deadlines.get(batch_id)

    def closed(self, batch_id: str | None) -> str | None:
        """Why a request of the batch must not be called any more: ``batch_forgotten`` once it was forgotten, then
        OpenAI's error codes, ``batch_cancelled`` once ``streamproc cancel`` ran for it, ``batch_expired`` past its
        completion window; else None."""
        if batch_id is None:
            return None
        if batch_id in self._forgotten:
            return BATCH_FORGOTTEN
        if batch_id in self._cancelled:
            return BATCH_CANCELLED
        expires = self._expires.get(batch_id)
        return BATCH_EXPIRED if expires is not None and self._clock_ms() >= expires else None

    def apply(self, value: bytes | None) -> None:
        """Take one record of the manifests topic; anything that is not a manifest or a cap is ignored."""
        if not value:
            return
        try:
            batch_cap = decode_batch_cap(value)
        except ValueError:
            pass
        else:
            self._caps[batch_cap.batch_id] = batch_cap.cap
            return
        try:
            manifest = decode_manifest(value)
        except ValueError as exc:
            log.debug("ignoring a record of the manifests topic: %s", exc)
            return
        self._sizes[manifest.batch_id] = manifest.submitted
        if manifest.cancelled_ms is not None:
            self._cancelled.add(manifest.batch_id)
        if manifest.expires_ms is not None:
            self._expires[manifest.batch_id] = manifest.expires_ms
        if manifest.deadline_ms is not None:
            self._deadlines[manifest.batch_id] = manifest.deadline_ms
        if manifest.reuse_results:
            self._reusing.add(manifest.batch_id)
        if manifest.forgotten is not None:
            self._forgotten.add(manifest.batch_id)

    async def load(self, kafka: KafkaConnection, topic: str) -> None:
        """Read the manifests topic up to now (at start-up, before any request is handled)."""
        async with TopicReader(kafka, [topic]) as reader:
            for record in await reader.read_to_end():
                self.apply(record.value)

    async def follow(self, kafka: KafkaConnection, topic: str, interval_s: float = FOLLOW_INTERVAL_S) -> None:
        """Keep reading new manifests until cancelled; a broker problem is logged and retried after
        ``interval_s * 5`` seconds, for ever (the budget falls back to counting; never stop the worker for it)."""

        def warn(state: RetryCallState) -> None:
            assert state.outcome is not None
            log.warning("could not read the batch manifests from %s (%s); retrying", topic, state.outcome.exception())

        retrying = AsyncRetrying(retry=retry_if_exception_type(Exception), wait=wait_fixed(interval_s * 5),
                                 before_sleep=warn)  # never stops; cancellation is no Exception, so it ends it
        await retrying(self._poll, kafka, topic, interval_s)

    async def _poll(self, kafka: KafkaConnection, topic: str, interval_s: float) -> None:
        """Read the new manifests every ``interval_s`` seconds, for as long as the reader works (a poll by
        design, not a retry)."""
        async with TopicReader(kafka, [topic]) as reader:
            while True:
                for record in await reader.read_to_end():
                    self.apply(record.value)
                await asyncio.sleep(interval_s)
