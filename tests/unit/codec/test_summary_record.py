"""The summary topic's records: keys name (batch, partition) unambiguously; values round-trip and refuse a newer
version rather than miscount."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from streamproc.codec.summary_record import decode_summary, decode_summary_key, encode_summary, encode_summary_key
from streamproc.core.batch_summary import BatchCounts, SummaryKey


def test_a_key_keeps_a_batch_id_with_colons_and_slashes() -> None:
    key = SummaryKey("team:a/2026-11", 11)
    assert encode_summary_key(key) == b"11:team:a/2026-11"
    assert decode_summary_key(encode_summary_key(key)) == key
    for bad in (b"x:batch", b"3", b"3:", b":b"):
        with pytest.raises(ValueError):
            decode_summary_key(bad)


def test_counts_round_trip() -> None:
    counts = BatchCounts(by_status=Counter({"succeeded": 3, "retrying": 2}), failed=Counter({"semantic": 1}),
                         parked=Counter({"circuit_open": 2}), usage={"m": (10, 20)}, batched_usage={"m": (4, 8)},
                         reused=1,
                         first_created_ms=5, last_ended_ms=9)
    assert decode_summary(encode_summary(counts, 1234)) == (counts, 1234)
    assert decode_summary(encode_summary(BatchCounts(), 7)) == (BatchCounts(), 7)


def test_a_newer_version_or_garbage_is_refused() -> None:
    with pytest.raises(ValueError, match="version 2"):
        decode_summary(json.dumps({"v": 2, "at_ms": 1, "counts": {}}).encode())
    for garbage in (b"[]", b'{"v": 1}', b'{"v": 1, "at_ms": 1, "counts": {"x": "y"}}'):
        with pytest.raises(ValueError):
            decode_summary(garbage)


def test_the_streams_key_and_its_hours_and_codes_round_trip() -> None:
    key = SummaryKey(None, 7)
    assert encode_summary_key(key) == b"stream:7" and decode_summary_key(b"stream:7") == key
    assert decode_summary_key(b"7:stream") == SummaryKey("stream", 7)  # a batch named "stream" is still a batch
    counts = BatchCounts(by_status=Counter({"failed": 2}), failed=Counter({"business": 2}),
                         codes=Counter({"invalid_json_request": 2}), arrived=Counter({3_600_000: 2}),
                         failed_in=Counter({7_200_000: 2}), last_ended_ms=7_200_001)
    assert decode_summary(encode_summary(counts, 5)) == (counts, 5)
