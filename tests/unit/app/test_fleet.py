"""A worker's place in its fleet without a broker: what its beat says, which records it reads, how it falls back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord

from streamproc.app.fleet import FleetMember, FleetTopic
from streamproc.codec.fleet_beat import decode_beat, encode_beat
from streamproc.core.events import InferenceRequest
from streamproc.core.fleet_share import Beat, FleetShares, ModelDemand
from streamproc.core.guards.rate_limits import RateLimiter, RateLimits
from streamproc.core.spend_cap import Cap, Exhausted, Spend, SpendLedger, batch_scope
from streamproc.kafka.connection import KafkaConnection
from streamproc.llm.client import CallResult

BODY = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """A caller that counts its calls and answers nothing of use."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        self.calls += 1
        return CallResult(outcome=None, response_body=b"", latency_ms=0)  # type: ignore[arg-type]


def member(clock: Clock, wall_s: float = 1_000.0) -> FleetMember:
    fleet = FleetMember(FleetTopic(KafkaConnection(bootstrap="127.0.0.1:1"), "llm.fleet", "streamproc", {}),
                        clock=clock, wall=lambda: wall_s)
    fleet.shares = FleetShares({}, 0.5, 2)  # as load() leaves it, one other worker known
    fleet.attach(RateLimiter(RateLimits(rpm=600), share=1.0), cost=lambda body: 150, membership=lambda: (False, 3))
    return fleet


def record(key: str, value: bytes | None, written_s: float) -> ConsumerRecord[Any, Any]:
    return ConsumerRecord(topic="llm.fleet", partition=0, offset=0, timestamp=int(written_s * 1000),
                          timestamp_type=0, key=key.encode(), value=value, checksum=None, serialized_key_size=0,
                          serialized_value_size=0, headers=())


def busy_beat(worker: str) -> bytes:
    return encode_beat(Beat(worker, {"m": ModelDemand(waiting_calls=50, sent_rpm=300, limit_rpm=600)}))


def test_the_beat_says_what_waits_what_was_sent_and_the_account_s_limit_before_the_share() -> None:
    clock = Clock()
    fleet = member(clock)
    limiter = fleet._limiter
    assert limiter is not None
    for _ in range(4):
        limiter.for_model("m", clock.now).reserve(150, clock.now)  # 5/s at 0.5 of 600 RPM; capacity 1
    fleet._on_sent(BODY)
    fleet._on_sent({"no": "model"})  # not counted
    clock.now += 1.0
    demand = fleet._demand(clock.now)["m"]
    assert demand.sent_rpm == 60.0 and demand.sent_tpm == 9000.0
    assert demand.limit_rpm == 600.0  # 300 RPM paced at a share of 0.5
    assert demand.waiting_calls == 0.0  # 3 owed at 5/s, a second ago


def test_the_meter_counts_what_it_passes_and_calls_for_an_idle_model_beat_at_once() -> None:
    clock = Clock()
    fleet = member(clock)
    inner = Counting()
    request = InferenceRequest("b/1", json.dumps(BODY), batch_id="b", submitted_ms=0)
    asyncio.run(fleet.metered(inner).call(request, BODY))
    assert inner.calls == 1 and fleet._wake.is_set()
    clock.now += 0.5
    assert fleet._sent.per_minute(clock.now) == {"m": (120.0, 18_000.0)}


def test_a_limit_just_learnt_is_told_the_fleet_at_once_not_in_a_beat() -> None:
    """The first contact: a 429 naming its bucket tells this worker the account's limit; the next call sent wakes
    the beat, so the other workers pace by it within a follow instead of meeting it too."""
    clock = Clock()
    fleet = FleetMember(FleetTopic(KafkaConnection(bootstrap="127.0.0.1:1"), "llm.fleet", "streamproc", {}),
                        clock=clock, wall=lambda: 1_000.0)
    limiter = RateLimiter(RateLimits(), share=1.0)  # no limit configured: it is learnt
    fleet.attach(limiter, cost=lambda body: 150, membership=lambda: (False, 3))
    fleet._on_sent(BODY)
    fleet._mine = fleet._demand(clock.now)  # beaten: the model is active, its limit not told
    fleet._wake.clear()
    fleet._on_sent(BODY)
    assert not fleet._wake.is_set()  # nothing new to tell
    limiter.for_model("m", clock.now).observe({"x-ratelimit-limit-requests": "3000"}, clock.now)
    fleet._on_sent(BODY)
    assert fleet._wake.is_set()
    fleet._mine = fleet._demand(clock.now)
    assert fleet._mine["m"].limit_told
    fleet._wake.clear()
    fleet._on_sent(BODY)
    assert not fleet._wake.is_set()  # told once


def test_beats_of_the_others_are_read_old_ones_and_foreign_records_are_not() -> None:
    clock = Clock()
    fleet = member(clock, wall_s=1_000.0)
    fleet._apply([record("a", busy_beat("a"), 999.5), record("old", busy_beat("old"), 900.0),
                  record("junk", b"not json", 999.9), record(fleet.worker, busy_beat(fleet.worker), 999.9)])
    assert [beat.worker for beat in fleet._view.live(clock.now)] == ["a"]
    fleet._apply([record("a", None, 999.9)])  # its tombstone
    assert fleet._view.live(clock.now) == []


def test_the_shares_follow_the_beats() -> None:
    clock = Clock()
    fleet = member(clock)
    fleet._heard_at = fleet._beaten_at = clock.now
    fleet._mine = {"m": ModelDemand(waiting_calls=50, sent_rpm=300, limit_rpm=600)}
    limiter = fleet._limiter
    assert limiter is not None
    limiter.for_model("m", clock.now)
    fleet._apply([record("a", busy_beat("a"), 1_000.0)])
    fleet._reshare(clock.now)
    assert fleet.shares.by_model == {"m": 0.5} and fleet.shares.workers == 2
    assert limiter.limits_by_model() == {"m": RateLimits(rpm=300)}


def test_a_limit_another_worker_was_told_paces_a_model_this_one_has_not_met_it_on() -> None:
    clock = Clock()
    fleet = FleetMember(FleetTopic(KafkaConnection(bootstrap="127.0.0.1:1"), "llm.fleet", "streamproc", {}),
                        clock=clock, wall=lambda: 1_000.0)
    limiter = RateLimiter(RateLimits(), share=1.0)  # nothing configured
    fleet.attach(limiter, cost=lambda body: 150, membership=lambda: (False, 3))
    fleet._heard_at = fleet._beaten_at = clock.now
    told = Beat("a", {"m": ModelDemand(waiting_calls=50, sent_rpm=1500, limit_rpm=3000, limit_told=True),
                      "n": ModelDemand(waiting_calls=5, limit_rpm=900)})  # n's limit was learnt: not passed on
    fleet._apply([record("a", encode_beat(told), 1_000.0)])
    fleet._reshare(clock.now)
    assert limiter.for_model("m", clock.now).limits == RateLimits(rpm=3000 * fleet.shares.default)
    assert limiter.for_model("n", clock.now).limits == RateLimits()
    assert fleet._demand(clock.now)["m"].limit_told  # and it tells the next one in turn


def test_without_the_topic_for_three_beats_the_shares_are_an_equal_part_per_group_member() -> None:
    clock = Clock()
    fleet = member(clock)
    fleet._heard_at = fleet._beaten_at = clock.now
    fleet._mine = {"m": ModelDemand(waiting_calls=50)}
    clock.now += 3.5
    assert fleet._degraded(clock.now)
    fleet._members = 4
    fleet._reshare(clock.now)
    assert fleet.shares.by_model == {"m": 0.25} and fleet.shares.default == 0.25
    fleet._members = None  # the broker does not say either: as many as there were
    fleet._reshare(clock.now)
    assert fleet.shares.by_model == {"m": 0.25}


def test_a_worker_that_cannot_read_the_beats_at_start_counts_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    async def two_members(_self: FleetTopic) -> int:
        return 2

    class Unreachable:
        def __init__(self, *_args: object) -> None:
            pass

        async def __aenter__(self) -> None:
            raise ConnectionError("no broker")

        async def __aexit__(self, *_exc: object) -> None:
            pass

    monkeypatch.setattr(FleetTopic, "group_members", two_members)
    monkeypatch.setattr("streamproc.app.fleet.TopicReader", Unreachable)
    fleet = FleetMember(FleetTopic(KafkaConnection(bootstrap="127.0.0.1:1"), "llm.fleet", "g", {}))
    assert asyncio.run(fleet.load()) == pytest.approx(1 / 3)  # two members already, and this one


def test_the_others_spend_is_kept_from_any_beat_even_an_old_one_or_one_a_tombstone_followed() -> None:
    clock = Clock()
    ledger = SpendLedger()
    fleet = FleetMember(FleetTopic(KafkaConnection(bootstrap="127.0.0.1:1"), "llm.fleet", "streamproc", {}),
                        clock=clock, wall=lambda: 1_000.0, spend=ledger)
    capped = batch_scope("b")
    fleet._apply([record("old", encode_beat(Beat("old", spend={capped: Spend(0.5, 10)})), 900.0),
                  record("a", encode_beat(Beat("a", spend={capped: Spend(0.25, 5)})), 999.5),
                  record(fleet.worker, encode_beat(Beat(fleet.worker, spend={capped: Spend(9.0, 9)})), 999.9),
                  record("a", None, 999.9)])  # a's tombstone: it stopped, what it spent stays
    assert ledger.spent(capped) == Spend(0.75, 15)  # its own beat read back is not counted twice
    assert fleet._view.live(clock.now) == []


class Producer:
    """Records what is sent, as (key, value)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes | None]] = []

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def send(self, topic: str, value: bytes | None, key: bytes) -> asyncio.Future[None]:
        self.sent.append((key, value))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def send_and_wait(self, topic: str, value: bytes | None, key: bytes) -> None:
        await self.send(topic, value, key)


async def test_the_beat_carries_this_worker_s_spend_and_its_last_spend_outlives_its_tombstone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = SpendLedger()
    fleet = FleetMember(FleetTopic(KafkaConnection(bootstrap="127.0.0.1:1"), "llm.fleet", "streamproc", {}),
                        clock=Clock(), spend=ledger)
    charge = ledger.begin([(batch_scope("b"), Cap(max_cost_usd=1.0))], Spend(0.2, 40))
    assert not isinstance(charge, Exhausted)
    producer = Producer()
    await fleet._beat(producer)
    key, value = producer.sent[-1]
    assert key == fleet.worker.encode()
    assert value is not None and decode_beat(fleet.worker, value).spend == {batch_scope("b"): Spend(0.2, 40)}

    ledger.settle(charge, Spend(0.1, 30))
    monkeypatch.setattr("streamproc.app.fleet.kafka_producer", lambda *_args, **_kwargs: producer)
    running = asyncio.ensure_future(fleet.run())
    await asyncio.sleep(0.05)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    (spent_key, spent), (gone_key, tombstone) = producer.sent[-2:]
    assert (spent_key, gone_key, tombstone) == (f"{fleet.worker}/spend".encode(), fleet.worker.encode(), None)

    later = SpendLedger()  # a worker started after it stopped reads both records
    reader = FleetMember(FleetTopic(KafkaConnection(bootstrap="127.0.0.1:1"), "llm.fleet", "streamproc", {}),
                         clock=Clock(), wall=lambda: 1_000.0, spend=later)
    reader._apply([record(spent_key.decode(), spent, 999.0), record(gone_key.decode(), None, 999.0)])
    assert later.spent(batch_scope("b")) == Spend(0.1, 30) and reader._view.live(100.0) == []
