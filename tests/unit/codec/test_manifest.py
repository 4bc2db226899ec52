"""Batch manifests: what submit writes so that status and the retry budget know a batch's size."""

from __future__ import annotations

from streamproc.codec.manifest import BatchManifest, decode_manifest, encode_manifest


def test_manifest_round_trip_and_rejects_foreign_records() -> None:
    manifest = BatchManifest("b", 10, 123, "in.jsonl", invalid_skipped=2)
    assert decode_manifest(encode_manifest(manifest)) == manifest
    for foreign in (b"[]", b'{"batch_id": "b"}', b'{"batch_id": "b", "submitted": "x", "created_ms": 1}'):
        try:
            decode_manifest(foreign)
        except ValueError:
            continue
        raise AssertionError(f"{foreign!r} was accepted")


def test_a_cancelled_manifest_round_trips_and_an_old_one_reads_as_not_cancelled() -> None:
    from streamproc.codec.manifest import BatchManifest, decode_manifest, encode_manifest

    cancelled = BatchManifest("b", 10, 5, "in.jsonl", 0, cancelled_ms=99, expires_ms=500)
    assert decode_manifest(encode_manifest(cancelled)) == cancelled
    old = b'{"batch_id":"b","submitted":10,"created_ms":5,"source":"in.jsonl"}'
    assert decode_manifest(old).cancelled_ms is None


def test_a_manifest_that_reuses_results_round_trips_and_an_old_one_does_not_reuse() -> None:
    reusing = BatchManifest("b", 10, 5, "in.jsonl", reuse_results=True)
    assert decode_manifest(encode_manifest(reusing)) == reusing
    assert not decode_manifest(b'{"batch_id":"b","submitted":10,"created_ms":5}').reuse_results


def test_a_forgotten_manifest_round_trips_with_its_counts_and_an_old_one_is_not_forgotten() -> None:
    from streamproc.core.retention import Forgotten

    forgotten = BatchManifest("b", 10, 5, "in.jsonl", forgotten=Forgotten(900, 800, 7, {"service": 2, "business": 1},
                                                                         {"gpt-4o-mini": (120, 30)},
                                                                         {"gpt-4o-mini": (100, 20)}))
    assert decode_manifest(encode_manifest(forgotten)) == forgotten
    assert decode_manifest(b'{"batch_id":"b","submitted":10,"created_ms":5}').forgotten is None
    for broken in (b'{"batch_id":"b","submitted":1,"created_ms":5,"forgotten":{"at_ms":1}}',
                   b'{"batch_id":"b","submitted":1,"created_ms":5,"forgotten":[1]}'):
        try:
            decode_manifest(broken)
        except ValueError:
            continue
        raise AssertionError(f"{broken!r} was accepted")


def test_a_deadline_round_trips_and_an_old_manifest_has_none() -> None:
    with_deadline = BatchManifest("b", 10, 5, "in.jsonl", expires_ms=86_400_005, deadline_ms=3_600_005)
    assert decode_manifest(encode_manifest(with_deadline)) == with_deadline
    assert decode_manifest(b'{"batch_id":"b","submitted":10,"created_ms":5}').deadline_ms is None
