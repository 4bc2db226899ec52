"""This worker in its fleet: it publishes its beat, follows the others' and sets its rate limiter's shares.

The shares come from :mod:`streamproc.core.fleet_share` (design §5.8). Each beat carries, per model, what waits
at this worker's pace (the limiter's debt), what it sent over the last beat (counted by :class:`SentMeter` below
the pace) and the account's limits as it knows them, and whether its group holds its records (a rebalance, no
input partition). The topic ``<prefix>.fleet`` is read from the start with no consumer group, like the batch
manifests. A worker beats from its start, every second, and at once when calls come for a model that was idle
or its partitions come or go (the others then give way within their next read, a fifth of a second), and it
writes a tombstone when it stops cleanly. Its beat also carries its spend on each capped batch and day (design
§5.9), which the others' spend ledgers keep, even once it is gone: a worker that stops writes its last spend
under ``<worker id>/spend`` before its tombstone, so workers started later count it too. When it cannot read
the topic or write its beat for three beats, its shares fall back to an equal part per member of the workers'
consumer group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.structs import ConsumerRecord
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_fixed

from streamproc.app.topic_reader import TopicReader
from streamproc.codec.fleet_beat import SPENT_SUFFIX, decode_beat, encode_beat
from streamproc.core.events import InferenceRequest
from streamproc.core.fleet_share import (
    BEAT_S,
    STALE_BEATS,
    Beat,
    FleetShares,
    FleetView,
    ModelDemand,
    Round,
    SentCounter,
    shares,
    starting_share,
    told_limits,
)
from streamproc.core.guards.rate_limits import RateLimiter
from streamproc.core.spend_cap import SpendLedger
from streamproc.kafka.clients import kafka_admin, kafka_producer
from streamproc.kafka.connection import KafkaConnection
from streamproc.llm.client import Caller, CallResult

log = logging.getLogger(__name__)

FOLLOW_S = 0.2  # how often the topic is read: how soon the others' beats are known
FORGOTTEN_AFTER_S = 60.0  # a beat written longer ago than this (by its record's time) is a worker long gone


def worker_id() -> str:
    """This process's key on the fleet topic: host and pid for people, and a few random bytes for a pid reused."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class SentMeter:
    """The :class:`Caller` below the pace: every call it passes is one sent, for the beat's ``sent_*``."""

    def __init__(self, inner: Caller, on_sent: Callable[[dict[str, Any]], None]) -> None:
        self._inner = inner
        self._on_sent = on_sent

    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        self._on_sent(body)
        return await self._inner.call(request, body)


@dataclass(frozen=True)
class FleetTopic:
    """Where a deployment's workers meet: the beats' topic, their consumer group (the fallback's count), and the
    producer options every producer of the deployment writes with."""

    kafka: KafkaConnection
    topic: str
    group: str
    producer_options: Mapping[str, Any]

    async def group_members(self) -> int | None:
        """How many members the workers' consumer group has (None when the broker does not say)."""
        admin = kafka_admin(self.kafka, request_timeout_ms=5000)
        try:
            await admin.start()
            (response,) = await admin.describe_consumer_groups([self.group])
            (group,) = response.to_object()["groups"]
            return None if group.get("error_code") else len(group.get("members") or [])
        except Exception as exc:
            log.debug("could not describe the consumer group %s: %s", self.group, exc)
            return None
        finally:
            await admin.close()


class FleetMember:
    """One worker's place in the fleet. :meth:`load` reads the beats so far (before the limiter exists, for its
    starting share), :meth:`attach` gives it the limiter, :meth:`run` beats and follows until cancelled."""

    def __init__(self, where: FleetTopic, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, spend: SpendLedger | None = None) -> None:
        """``spend``: this worker's spend ledger, published in its beats and told the others'."""
        self.worker = worker_id()
        self._where, self._clock, self._wall = where, clock, wall
        self._spend = spend or SpendLedger()
        self._view = FleetView(self.worker)
        self._sent = SentCounter(clock())
        self._limiter: RateLimiter | None = None
        self._cost: Callable[[dict[str, Any]], int] = lambda _body: 0
        self._membership: Callable[[], tuple[bool, int]] = lambda: (True, 0)
        self._out: Callable[[], Mapping[str, str]] = dict  # its deployments out of rotation, and why
        self._said = (True, 0)  # what the last beat said of its membership: paused, generation
        self._round = Round(0, clock())  # its group generation, and since when
        self._mine: dict[str, ModelDemand] = {}  # this worker's demand as its last beat said
        self.shares = FleetShares({}, 1.0, 1)  # what the limiter paces at now
        self._heard_at = -math.inf  # the last time the topic was read to its end
        self._beaten_at = -math.inf  # the last time a beat of ours was acknowledged
        self._members: int | None = None  # the consumer group's members, while the topic is out of reach
        self._live: frozenset[str] | None = None  # the others, as last logged
        self._wake = asyncio.Event()

    # -- start-up ----------------------------------------------------------------------------------------
    async def load(self) -> float:
        """Read the beats so far; the share this worker's limiter starts with (``1/(known + 1)``)."""
        try:
            async with TopicReader(self._where.kafka, [self._where.topic]) as reader:
                self._apply(await reader.read_to_end())
            self._heard_at = self._clock()
            known = len(self._view.live(self._clock()))
        except Exception as exc:  # the group says how many there are
            log.warning("could not read the fleet's beats from %s (%s); starting from the consumer group",
                        self._where.topic, exc)
            known = await self._where.group_members() or 0
        self.shares = FleetShares({}, starting_share(known), known + 1)
        return self.shares.default

    def metered(self, caller: Caller) -> Caller:
        return SentMeter(caller, self._on_sent)

    def attach(self, limiter: RateLimiter, cost: Callable[[dict[str, Any]], int],
               membership: Callable[[], tuple[bool, int]], out: Callable[[], Mapping[str, str]] = dict) -> None:
        """The limiter whose shares this sets, the tokens a call costs at its pace, the worker's place in its
        consumer group (whether the group holds its records now: a rebalance, no input partition; and the
        generation it was last given partitions in), and its deployments out of rotation with why (for status)."""
        self._limiter = limiter
        self._cost = cost
        self._membership = membership
        self._out = out
        limiter.set_shares(self.shares.by_model, self.shares.default, self._clock())  # a model called first paces so

    # -- running -----------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Beat every second (and at once when a model wakes) and follow the others, until cancelled; then say
        this worker is gone (a tombstone), so the others take its share at once."""
        producer = kafka_producer(self._where.kafka, **self._where.producer_options)
        await producer.start()
        self._beaten_at = self._clock()  # the first beat has three beats to be acknowledged
        following = asyncio.ensure_future(self._follow())
        try:
            while True:
                await self._beat(producer)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), BEAT_S)
                self._wake.clear()
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            try:
                if spent := self._spend.own():  # its tombstone removes its beat; what it spent stays counted
                    last = encode_beat(Beat(self.worker, spend=spent))
                    key = f"{self.worker}{SPENT_SUFFIX}".encode()
                    await asyncio.wait_for(producer.send_and_wait(self._where.topic, last, key=key), 5.0)
                await asyncio.wait_for(producer.send_and_wait(self._where.topic, None, key=self.worker.encode()), 5.0)
            except Exception as exc:  # its beat goes stale instead: the others take its share three beats later
                log.warning("could not tell the fleet that this worker stops: %s", exc)
            await producer.stop()

    def _on_sent(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if not isinstance(model, str):
            return
        self._sent.sent(model, self._cost(body))
        known = self._mine.get(model)
        if known is None or not known.active:  # calls for an idle model: tell the fleet now, not in a second
            self._wake.set()
        elif not known.limit_told and self._limiter is not None and self._limiter.told_for(model):
            # a limit just learnt (a 429 naming its bucket): the others meet it paced within a follow, not a beat
            self._wake.set()

    async def _beat(self, producer: Any) -> None:
        now = self._clock()
        self._mine = self._demand(now)
        self._said = self._membership()
        if self._said[1] != self._round.generation:
            self._round = Round(self._said[1], now)
        beat = Beat(self.worker, self._mine, BEAT_S, *self._said, spend=self._spend.own(), out=self._out())
        try:  # a full buffer or missing metadata must not hold the shares up
            delivery = await asyncio.wait_for(
                producer.send(self._where.topic, encode_beat(beat), key=self.worker.encode()), BEAT_S)
            delivery.add_done_callback(self._on_delivered)
        except Exception as exc:
            log.debug("a fleet beat was not sent: %s", exc)
        if self._degraded(now):
            self._members = await self._where.group_members()
        self._reshare(now)

    def _on_delivered(self, delivery: asyncio.Future[Any]) -> None:
        if not delivery.cancelled() and delivery.exception() is None:
            self._beaten_at = self._clock()

    def _demand(self, now: float) -> dict[str, ModelDemand]:
        """This worker's demand per model: what waits at its pace, what it sent, the account's limits."""
        if self._limiter is None:
            return {}
        waiting = self._limiter.waiting_by_model(now)
        limits = self._limiter.limits_by_model()
        told = self._limiter.told_by_model()
        sent = self._sent.per_minute(now)
        demand = {}
        for model in {*waiting, *sent}:
            share = self.shares.by_model.get(model, self.shares.default)
            calls, tokens = waiting.get(model, (0.0, 0.0))
            rpm, tpm = sent.get(model, (0.0, 0.0))
            known = limits.get(model)
            demand[model] = ModelDemand(
                waiting_calls=calls, waiting_tokens=tokens, sent_rpm=rpm, sent_tpm=tpm,
                limit_rpm=known.rpm / share if known is not None and known.rpm is not None else None,
                limit_tpm=known.tpm / share if known is not None and known.tpm is not None else None, share=share,
                limit_told=told.get(model, False))
        return demand

    async def _follow(self) -> None:
        """Read the others' beats for ever; a broker problem is logged and retried (the shares fall back)."""

        def warn(state: RetryCallState) -> None:
            assert state.outcome is not None
            log.warning("could not read the fleet's beats from %s (%s); retrying", self._where.topic,
                        state.outcome.exception())

        retrying = AsyncRetrying(retry=retry_if_exception_type(Exception), wait=wait_fixed(BEAT_S),
                                 before_sleep=warn)  # never stops; cancellation is no Exception, so it ends it
        await retrying(self._poll)

    async def _poll(self) -> None:
        async with TopicReader(self._where.kafka, [self._where.topic]) as reader:
            while True:
                records = await reader.read_to_end()
                self._heard_at = self._clock()
                if records:
                    self._apply(records)
                    self._reshare(self._heard_at)
                if self._membership() != self._said:  # partitions came or went: the others hold by it
                    self._wake.set()
                await asyncio.sleep(FOLLOW_S)

    def _apply(self, records: Iterable[ConsumerRecord[Any, Any]]) -> None:
        now, wall_ms = self._clock(), self._wall() * 1000
        for record in records:
            if not record.key:
                continue
            worker = bytes(record.key).decode(errors="replace")
            spent = worker.endswith(SPENT_SUFFIX)  # a stopped worker's last spend, in place of its last beat's
            worker = worker.removesuffix(SPENT_SUFFIX)
            if record.value is None:
                if not spent:
                    self._view.gone(worker)
                continue
            try:
                beat = decode_beat(worker, record.value)
            except ValueError as exc:
                log.debug("ignoring a record of the fleet topic: %s", exc)
                continue
            if worker != self.worker:  # what a worker spent counts however long ago it beat
                self._spend.heard(worker, beat.spend)
            if not spent and wall_ms - record.timestamp <= FORGOTTEN_AFTER_S * 1000:
                self._view.heard(beat, now)

    # -- the shares ---------------------------------------------------------------------------------------
    def _degraded(self, now: float) -> bool:
        """Whether the topic was out of reach (not read, or our beats not written) for three beats."""
        return now - min(self._heard_at, self._beaten_at) > STALE_BEATS * BEAT_S

    def _reshare(self, now: float) -> None:
        if self._limiter is None:
            return
        others = self._view.live(now)
        if self._degraded(now):  # an equal part per member of the group, else as many as there were
            workers = self._members or self.shares.workers
            computed = FleetShares(dict.fromkeys(self._mine, 1.0 / workers), 1.0 / workers, workers)
        else:
            mine = self._round
            computed = shares(self._mine, others, lambda worker, model: self._view.holds(worker, model, now, mine))
        for model, limits in told_limits(others).items():  # so a worker meets a limit the fleet knows paced
            self._limiter.adopt(model, limits, now)
        self._limiter.set_shares(computed.by_model, computed.default, now)
        self.shares = computed
        self._log_membership(others)

    def _log_membership(self, others: list[Beat]) -> None:
        live = frozenset(beat.worker for beat in others)
        if live == self._live:
            return
        before = self._live or frozenset()
        joined, left = sorted(live - before), sorted(before - live)
        self._live = live
        paced = ", ".join(f"{model} {share:.3f}" for model, share in sorted(self.shares.by_model.items()))
        log.info("fleet: %d workers%s%s; shares %s (%.3f for a model called later)", len(live) + 1,
                 f", joined {', '.join(joined)}" if joined else "", f", gone {', '.join(left)}" if left else "",
                 paced or "none yet", self.shares.default)
