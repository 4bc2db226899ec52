"""The provider-batch topic's records (issue 31): values round-trip in every state, keep request ids of any text,
refuse a newer version or a broken value rather than misread it, and a record too big for Kafka is refused at
encode, not by the producer."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.codec.provider_batch_record import (
    RecordTooLarge,
    decode_provider_batch,
    encode_provider_batch,
    member_bytes,
)
from streamproc.core.provider_batch_gatherer import RECORD_ROOM
from streamproc.core.provider_batch_objects import BatchPhase, ProviderBatchView
from streamproc.core.provider_batch_takeover import ProviderBatchRecord, RecordState
from streamproc.core.record_size import RECORD_BYTES

CREATING = ProviderBatchRecord("g-7:0:1733140000000", "openai", "gpt-4o-mini", 3, ("req/1", "req:2", "请求-3"),
                               RecordState.CREATING, 1_733_140_000_000, 1_733_140_000_000, input_file_id="file-1")


def test_each_state_round_trips() -> None:
    opened = CREATING.opened(ProviderBatchView("openai", "batch_9", BatchPhase.VALIDATING, 3, 0), 1_733_140_001_000)
    for record in (CREATING, opened, opened.ended(1_733_140_009_000)):
        assert decode_provider_batch(record.gather_id.encode(), encode_provider_batch(record)) == record


@given(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=30),
       st.sampled_from(["openai", "anthropic"]))
def test_members_of_any_text_round_trip(members: list[str], provider: str) -> None:
    record = ProviderBatchRecord("g", provider, "m", 0, tuple(members), RecordState.CREATING, 1, 1)  # type: ignore[arg-type]
    assert decode_provider_batch(b"g", encode_provider_batch(record)).members == tuple(members)


def test_members_attempts_round_trip_and_a_record_without_them_reads_as_attempts_unknown() -> None:
    with_attempts = replace(CREATING, attempts=(1, 3, 2))
    raw = encode_provider_batch(with_attempts)
    assert json.loads(raw)["attempts"] == [1, 3, 2]
    assert decode_provider_batch(with_attempts.gather_id.encode(), raw) == with_attempts
    written_before = json.loads(raw)
    del written_before["attempts"]  # a record of the version before members' attempts were kept
    read = decode_provider_batch(b"g", json.dumps(written_before).encode())
    assert read.attempts is None and read.member_attempts() == {"req/1": None, "req:2": None, "请求-3": None}
    assert "attempts" not in json.loads(encode_provider_batch(CREATING))


@pytest.mark.parametrize("change", [
    {"v": 2}, {"attempts": [1, 2]}, {"attempts": [1, 2, 0]}, {"attempts": [1, True, 2]}, {"attempts": "1"},
    {"attempts": [1, 2, "3"]}, {"provider": "azure"}, {"members": "req-1"}, {"members": [1, 2]}, {"state": "lost"},
    {"partition": "3"}, {"created_ms": True}, {"model": None}, {"provider_batch_id": 7},
])
def test_a_value_this_version_cannot_read_is_refused(change: dict[str, object]) -> None:
    fields = {**json.loads(encode_provider_batch(CREATING)), **change}
    with pytest.raises(ValueError):
        decode_provider_batch(b"g", json.dumps(fields).encode())


def test_a_value_missing_a_field_or_not_json_is_refused() -> None:
    fields = json.loads(encode_provider_batch(CREATING))
    del fields["members"]
    for raw in (json.dumps(fields).encode(), b"{not json", b"[]", b"\xff"):
        with pytest.raises(ValueError):
            decode_provider_batch(b"g", raw)


def test_an_open_record_without_its_provider_id_is_refused() -> None:
    fields = {**json.loads(encode_provider_batch(CREATING)), "state": "open"}
    with pytest.raises(ValueError, match="without a provider id"):
        decode_provider_batch(b"g", json.dumps(fields).encode())


def test_a_record_too_big_for_one_kafka_record_is_refused_at_encode() -> None:
    members = tuple(f"request-{i:010d}-" + "x" * 60 for i in range(20_000))
    with pytest.raises(RecordTooLarge, match="20000 members"):
        encode_provider_batch(ProviderBatchRecord("g", "openai", "m", 0, members, RecordState.CREATING, 1, 1))


@pytest.mark.parametrize("request_id", ["r1", "request-" + "x" * 200, 'quote"and\\back', "ünïcode-日本"])
def test_a_full_gather_of_long_ids_fits_one_record(request_id: str) -> None:
    """What the gatherer counts per member (member_bytes) keeps the record within one Kafka record."""
    members: list[str] = []
    used = 0
    while used + member_bytes(candidate := f"{request_id}{len(members)}") <= RECORD_ROOM:  # as the gatherer counts
        members.append(candidate)
        used += member_bytes(candidate)
    record = ProviderBatchRecord("g" * 32, "openai", "m" * 200, 0, tuple(members), RecordState.OPEN, 1, 1,
                                 provider_batch_id="batch_" + "b" * 60, input_file_id="file-" + "f" * 60,
                                 attempts=tuple(999_999 for _ in members))
    assert len(encode_provider_batch(record)) <= RECORD_BYTES
