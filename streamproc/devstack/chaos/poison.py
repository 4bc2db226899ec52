"""The hostile records: what each one is, how it reaches the broker, and how it must end.

Every poison record must end explained (a terminal failure event, a dead letter, or its result) and never
hold its partition up. Most are produced straight onto the topics with a plain producer, as a foreign or
buggy producer would; duplicate ids and the deep-JSON requests also go through ``streamproc submit``.
None of them belongs to the measured batch, so none can pass for one of its outcomes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError

from streamproc import codec
from streamproc.core import headers
from streamproc.core.events import InferenceRequest
from streamproc.core.identity import request_id_for
from streamproc.core.topology import Topology
from streamproc.devstack.chaos.batch import batch_line, ticket_body, ticket_id
from streamproc.devstack.chaos.config import RunNames
from streamproc.devstack.chaos.facts import body_digest, sha
from streamproc.devstack.chaos.proxy import DEEP_BODY_MARKER, DEEP_CONTENT_MARKER
from streamproc.kafka.clients import kafka_producer
from streamproc.kafka.connection import KafkaConnection

YEAR_MS = 365 * 86_400_000
# after the asked size, the sizes tried until the broker takes one: its message.max.bytes is Kafka's default
# 1,048,588 bytes per record batch (the built-in broker does not change it)
FALLBACK_BIG_SIZES = (1_048_000, 1_040_000, 1_000_000, 900_000, 500_000)


class PoisonKind(StrEnum):
    RANDOM_KEYED = "random bytes, keyed"
    RANDOM_UNKEYED = "random bytes, no key"
    CONFLUENT_SCHEMA_ID = "Confluent framing, unknown schema id"
    UNKNOWN_FINGERPRINT = "Avro framing, unknown schema fingerprint"
    TIER_FAR_FUTURE = "retry tier, x-due-ts a year ahead"
    TIER_NEGATIVE_DUE = "retry tier, negative x-due-ts"
    DUPLICATE_PRODUCED = "duplicate id, other body (produced)"
    DUPLICATE_IN_FILE = "duplicate custom_id in one file (submit)"
    REUSED_CUSTOM_ID = "batch's custom_id, other body, new batch (submit)"
    BIG_BODY = "big body"
    DEEP_BODY = "answer body 10,000-deep JSON"
    DEEP_CONTENT = "answer content 10,000-deep JSON"


class Expect(StrEnum):
    TERMINAL_FAILURE = "terminal failure"
    DEAD_LETTER = "dead letter"
    ENDED = "result or terminal failure"
    CONFLICT = "conflicting_duplicate failure"
    REFUSED = "refused by the broker"


@dataclass(frozen=True)
class Poison:
    """One hostile record as the report sees it: what it is and what must become of it."""

    kind: PoisonKind
    expect: Expect
    label: str
    request_id: str | None = None
    value_sha: str | None = None  # DEAD_LETTER: the value the dead letter must carry
    body_sha: str | None = None  # CONFLICT: the body its conflicting_duplicate failure must carry
    note: str = ""
    refused_as_it_must: bool = True  # REFUSED: whether the refusal came, and for the right reason


@dataclass(frozen=True)
class DirectRecord:
    """A poison record to produce as is."""

    topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    poison: Poison


def _request(request_id: str, names: RunNames, body: dict[str, Any]) -> InferenceRequest:
    return InferenceRequest(request_id=request_id, body_json=json.dumps(body), batch_id=names.poison_batch_id)


def _framing_poison(kind: PoisonKind, request_id: str, keyed: bool, value: bytes, topic: str) -> DirectRecord:
    if keyed:
        return DirectRecord(topic, request_id.encode(), value, (),
                            Poison(kind, Expect.TERMINAL_FAILURE, request_id, request_id=request_id))
    return DirectRecord(topic, None, value, (),
                        Poison(kind, Expect.DEAD_LETTER, f"{request_id} (no key)", value_sha=sha(value)))


def build_direct(topology: Topology, names: RunNames, wave: int, per_kind: int, duplicate_of: Sequence[int],
                 rng: random.Random, now_ms: int) -> list[DirectRecord]:
    """The produced poison of one wave, ``per_kind`` of each kind; ``duplicate_of`` are ticket numbers of the
    measured batch that get a second record with another body (the same request id, a poison batch id)."""
    records: list[DirectRecord] = []
    prefix = f"{names.run_id}-w{wave}"
    for i in range(per_kind):
        records.append(_framing_poison(PoisonKind.RANDOM_KEYED, f"{prefix}-random-{i}", True,
                                       rng.randbytes(rng.choice((1, 17, 512, 4096))), topology.requests))
        records.append(_framing_poison(PoisonKind.RANDOM_UNKEYED, f"{prefix}-random-nokey-{i}", False,
                                       rng.randbytes(rng.choice((1, 17, 512, 4096))), topology.requests))
        request_id = f"{prefix}-confluent-{i}"
        valid = _request(request_id, names, ticket_body(i))
        records.append(_framing_poison(PoisonKind.CONFLUENT_SCHEMA_ID, request_id, i % 2 == 0,
                                       codec.encode_confluent(valid, rng.randrange(1, 2**31)), topology.requests))
        request_id = f"{prefix}-fingerprint-{i}"
        framed = codec.encode(_request(request_id, names, ticket_body(i)))
        unknown = codec.SINGLE_OBJECT_MAGIC + rng.randbytes(8) + framed[len(codec.SINGLE_OBJECT_MAGIC) + 8:]
        records.append(_framing_poison(PoisonKind.UNKNOWN_FINGERPRINT, request_id, i % 2 == 0, unknown,
                                       topology.requests))
        tier = topology.tiers[i % len(topology.tiers)]
        for kind, due_ms in ((PoisonKind.TIER_FAR_FUTURE, now_ms + YEAR_MS),
                             (PoisonKind.TIER_NEGATIVE_DUE, -rng.choice((1, now_ms)))):
            request_id = f"{prefix}-{'far' if due_ms > 0 else 'negative'}-{i}"
            hop = ((headers.ATTEMPT, b"2"), (headers.DUE_TS, str(due_ms).encode()))
            records.append(DirectRecord(
                topology.retry(tier), request_id.encode(), codec.encode(_request(request_id, names, ticket_body(i))),
                hop, Poison(kind, Expect.ENDED, request_id, request_id=request_id,
                            note=f"{topology.retry(tier)}, x-due-ts {due_ms}")))
    for j, ticket in enumerate(duplicate_of):
        body = ticket_body(ticket, note=f" (duplicate {wave}-{j}, another body)")
        request_id = request_id_for(names.batch_id, ticket_id(ticket))
        request = _request(request_id, names, body)
        records.append(DirectRecord(topology.requests, request_id.encode(), codec.encode(request), (),
                                    Poison(PoisonKind.DUPLICATE_PRODUCED, Expect.CONFLICT, request_id,
                                           request_id=request_id, body_sha=body_digest(request.body_json))))
    return records


def big_body_candidates(topology: Topology, names: RunNames, wave: int, asked_bytes: int) -> list[DirectRecord]:
    """The big-body record at the asked size, then at smaller sizes: :func:`inject` sends the first one the
    broker takes. The body is a valid request whose prompt is far over the model's context window."""
    request_id = f"{names.run_id}-w{wave}-big"
    candidates = []
    for size in (asked_bytes, *(s for s in FALLBACK_BIG_SIZES if s < asked_bytes)):
        skeleton = {"model": "mock-small", "max_tokens": 16, "messages": [{"role": "user", "content": ""}]}
        filler = "lorem ipsum " * (size // 12 + 1)
        skeleton["messages"] = [{"role": "user", "content": filler[: max(0, size - len(json.dumps(skeleton)))]}]
        request = _request(request_id, names, skeleton)
        candidates.append(DirectRecord(
            topology.requests, request_id.encode(), codec.encode(request), (),
            Poison(PoisonKind.BIG_BODY, Expect.ENDED, request_id, request_id=request_id,
                   note=f"body {len(request.body_json):,} bytes")))
    return candidates


@dataclass(frozen=True)
class SubmittedPoison:
    """A poison file for ``streamproc submit``. It holds one custom_id twice, so submit must refuse it
    whole; sent again with ``--skip-invalid``, the rest goes in (the first of the two lines included)."""

    batch_id: str
    lines: list[str]
    poison: list[Poison]  # what must become of the lines that go in
    duplicated_custom_id: str


def build_submitted(names: RunNames, wave: int, per_kind: int, reuse: Sequence[int]) -> SubmittedPoison:
    """Requests the proxy answers with deep JSON, custom_ids of the measured batch with other bodies (in a
    new batch they are requests of their own), and one custom_id twice in the file."""
    batch_id = names.submitted_poison_batch_id(wave)
    lines: list[str] = []
    poisons: list[Poison] = []
    prefix = f"w{wave}"
    for i in range(per_kind):
        for kind, marker, fmt in ((PoisonKind.DEEP_BODY, DEEP_BODY_MARKER, None),
                                  (PoisonKind.DEEP_CONTENT, DEEP_CONTENT_MARKER, {"type": "json_object"})):
            custom_id = f"{prefix}-{'deep-body' if kind is PoisonKind.DEEP_BODY else 'deep-content'}-{i}"
            body: dict[str, Any] = {"model": "mock-small", "max_tokens": 64, "messages": [
                {"role": "user", "content": f"Describe item {i} as JSON. {marker}"}]}
            if fmt is not None:
                body["response_format"] = fmt
            lines.append(batch_line(custom_id, body))
            request_id = request_id_for(batch_id, custom_id)
            poisons.append(Poison(kind, Expect.ENDED, request_id, request_id=request_id))
    for j, ticket in enumerate(reuse):
        body = ticket_body(ticket, note=f" (reused custom_id {wave}-{j}, another body)")
        lines.append(batch_line(ticket_id(ticket), body))
        request_id = request_id_for(batch_id, ticket_id(ticket))
        poisons.append(Poison(PoisonKind.REUSED_CUSTOM_ID, Expect.ENDED, request_id, request_id=request_id))
    twice = f"{prefix}-twice"
    lines.append(batch_line(twice, ticket_body(wave, note=" (first of two lines with one custom_id)")))
    lines.append(batch_line(twice, ticket_body(wave, note=" (second line, another body)")))
    return SubmittedPoison(batch_id, lines, poisons, twice)


async def inject(kafka: KafkaConnection, records: Sequence[DirectRecord], big: Sequence[DirectRecord]) -> list[Poison]:
    """Produce ``records``, then the first of ``big`` the broker takes. Returns the poison now on the broker,
    plus one REFUSED entry per big size the broker refused (the refusal is that record's explanation)."""
    largest = max((len(r.value) for r in big), default=0)
    producer = kafka_producer(kafka, acks="all", linger_ms=5,
                                max_request_size=largest + 1024 * 1024)  # the broker, not the client, must judge
    await producer.start()
    sent: list[Poison] = []
    try:
        for record in records:
            await producer.send_and_wait(record.topic, record.value, key=record.key, headers=list(record.headers))
            sent.append(record.poison)
        for record in big:
            try:
                await producer.send_and_wait(record.topic, record.value, key=record.key)
            except MessageSizeTooLargeError as exc:
                sent.append(Poison(PoisonKind.BIG_BODY, Expect.REFUSED, f"{record.poison.label} ({record.poison.note})",
                                   note=f"{len(record.value):,}-byte record: {type(exc).__name__}"))
                continue
            sent.append(record.poison)
            break
    finally:
        await producer.stop()
    return sent
