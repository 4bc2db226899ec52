"""Packing requests into provider batches (issue 31): one model per batch, never over the request or byte
limit, sealed by age, and every request in exactly one sealed batch, in the order it came."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.provider_batch_gatherer import (
    ANTHROPIC_LIMITS,
    OPENAI_LIMITS,
    BatchGatherer,
    BatchLimits,
    LineTooLarge,
    PendingLine,
    SealedBatch,
)

SMALL = BatchLimits(max_requests=3, max_bytes=30, max_age_ms=1000)


def line(custom_id: str, model: str = "m", size: int = 5) -> PendingLine:
    return PendingLine(custom_id, model, b"x" * size)


def ids(batch: SealedBatch) -> list[str]:
    return [p.custom_id for p in batch.lines]


def test_the_providers_limits() -> None:
    assert (OPENAI_LIMITS.max_requests, OPENAI_LIMITS.max_bytes) == (50_000, 200 * 1024 * 1024)
    assert (ANTHROPIC_LIMITS.max_requests, ANTHROPIC_LIMITS.max_bytes) == (100_000, 256 * 1024 * 1024)
    with pytest.raises(ValueError, match="cannot hold"):
        BatchLimits(max_requests=0, max_bytes=10, max_age_ms=0)


def test_a_batch_is_sealed_when_full() -> None:
    gatherer = BatchGatherer(SMALL)
    assert gatherer.add(line("a"), 0) == [] and gatherer.add(line("b"), 0) == []
    [sealed] = gatherer.add(line("c"), 0)
    assert (ids(sealed), sealed.reason, sealed.size_bytes) == (["a", "b", "c"], "requests", 18)
    assert gatherer.open_count() == 0


def test_a_line_that_would_pass_the_byte_limit_opens_the_next_batch() -> None:
    gatherer = BatchGatherer(SMALL)
    gatherer.add(line("a", size=20), 0)
    [sealed] = gatherer.add(line("b", size=20), 5)
    assert (ids(sealed), sealed.reason) == (["a"], "bytes")
    assert gatherer.open_count() == 1 and gatherer.next_due_ms() == 1005  # b opened the next one


def test_a_member_whose_id_would_pass_the_records_room_opens_the_next_batch() -> None:
    """The members' ids go into the batch's durable record, one Kafka record: long ids seal a batch early."""
    gatherer = BatchGatherer(BatchLimits(max_requests=10, max_bytes=1000, max_age_ms=1000, max_record_bytes=100))
    assert gatherer.add(PendingLine("a", "m", b"x", record_bytes=60), 0) == []
    [sealed] = gatherer.add(PendingLine("b", "m", b"x", record_bytes=60), 0)
    assert (ids(sealed), sealed.reason) == (["a"], "record")
    assert gatherer.open_count() == 1


def test_models_never_share_a_batch() -> None:
    gatherer = BatchGatherer(SMALL)
    for i, model in enumerate(["m1", "m2", "m1", "m2", "m1"]):
        sealed = gatherer.add(line(f"r{i}", model), 0)
    assert [(b.model, ids(b)) for b in sealed] == [("m1", ["r0", "r2", "r4"])]
    assert [(b.model, ids(b), b.reason) for b in gatherer.flush()] == [("m2", ["r1", "r3"], "flush")]


def test_an_old_batch_is_sealed_by_age() -> None:
    gatherer = BatchGatherer(SMALL)
    gatherer.add(line("a"), 100)
    gatherer.add(line("b", model="other"), 600)
    assert gatherer.next_due_ms() == 1100
    assert gatherer.due(1099) == []
    [sealed] = gatherer.due(1100)
    assert (ids(sealed), sealed.reason) == (["a"], "age")
    assert gatherer.next_due_ms() == 1600


def test_a_line_no_batch_can_hold_is_refused_and_nothing_is_kept() -> None:
    gatherer = BatchGatherer(SMALL)
    with pytest.raises(LineTooLarge, match="'big'"):
        gatherer.add(line("big", size=30), 0)
    assert gatherer.open_count() == 0
    assert gatherer.add(line("fits", size=SMALL.max_line_bytes), 0) == []


@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["m1", "m2", "m3"]), st.integers(0, 28), st.integers(0, 700)), max_size=60
    ),
    envelope=st.integers(0, 5),
)
def test_every_request_ends_in_one_batch_within_the_limits(steps: list[tuple[str, int, int]], envelope: int) -> None:
    limits = BatchLimits(max_requests=4, max_bytes=40, max_age_ms=1000, envelope_bytes=envelope)
    gatherer = BatchGatherer(limits)
    sealed: list[SealedBatch] = []
    sent: list[PendingLine] = []
    now = 0
    for i, (model, size, wait) in enumerate(steps):
        now += wait
        sealed += gatherer.due(now)
        pending = line(f"r{i}", model, size)
        if size > limits.max_line_bytes:
            with pytest.raises(LineTooLarge):
                gatherer.add(pending, now)
            continue
        sealed += gatherer.add(pending, now)
        sent.append(pending)
        due = gatherer.next_due_ms()
        assert due is None or due > now  # nothing stays open past its age once due() ran
    sealed += gatherer.flush()
    assert sorted(p.custom_id for b in sealed for p in b.lines) == sorted(p.custom_id for p in sent)
    for batch in sealed:
        assert batch.lines and {p.model for p in batch.lines} == {batch.model}
        assert len(batch.lines) <= limits.max_requests
        assert batch.size_bytes == envelope + sum(len(p.line) + 1 for p in batch.lines) <= limits.max_bytes
    for model in ("m1", "m2", "m3"):  # each model's requests keep their order across its batches
        order = [p.custom_id for b in sealed if b.model == model for p in b.lines]
        assert order == [p.custom_id for p in sent if p.model == model]
