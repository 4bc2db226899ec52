"""Batch sizes from manifest records: the retry budget's view of how big a batch is."""

from __future__ import annotations

from streamproc.app.manifest_follower import BatchSizes
from streamproc.codec.manifest import BatchManifest, encode_manifest


def test_manifests_give_sizes_and_a_later_one_replaces_an_earlier_one() -> None:
    sizes = BatchSizes()
    sizes.apply(encode_manifest(BatchManifest("b1", 20, 1, "in.jsonl")))
    sizes.apply(encode_manifest(BatchManifest("b2", 7, 1, "other.jsonl")))
    sizes.apply(encode_manifest(BatchManifest("b1", 25, 2, "in.jsonl")))
    assert (sizes.submitted("b1"), sizes.submitted("b2"), sizes.submitted("b3")) == (25, 7, None)


def test_records_that_are_not_manifests_are_ignored() -> None:
    sizes = BatchSizes()
    for value in (None, b"", b"{not json", b"[1, 2]", b'{"batch_id": "x"}'):
        sizes.apply(value)
    assert sizes.submitted("x") is None


def test_a_cancelled_manifest_closes_its_batch() -> None:
    from streamproc.codec.manifest import BatchManifest, encode_manifest

    sizes = BatchSizes()
    sizes.apply(encode_manifest(BatchManifest("b", 10, 5, "in.jsonl")))
    assert sizes.closed("b") is None
    sizes.apply(encode_manifest(BatchManifest("b", 10, 5, "in.jsonl", cancelled_ms=7)))
    assert (sizes.closed("b"), sizes.closed("other"), sizes.closed(None)) == ("batch_cancelled", None, None)
    assert sizes.submitted("b") == 10


def test_a_batch_closes_at_the_end_of_its_completion_window() -> None:
    from streamproc.codec.manifest import BatchManifest, encode_manifest

    now = [1_000]
    sizes = BatchSizes(clock_ms=lambda: now[0])
    sizes.apply(encode_manifest(BatchManifest("b", 10, 5, "in.jsonl", expires_ms=2_000)))
    assert sizes.closed("b") is None
    now[0] = 2_000
    assert sizes.closed("b") == "batch_expired"


def test_a_manifest_that_reuses_results_says_so_for_its_batch_only() -> None:
    sizes = BatchSizes()
    sizes.apply(encode_manifest(BatchManifest("again", 10, 5, "in.jsonl", reuse_results=True)))
    sizes.apply(encode_manifest(BatchManifest("fresh", 10, 5, "in.jsonl")))
    assert (sizes.reuses("again"), sizes.reuses("fresh"), sizes.reuses("unknown"), sizes.reuses(None)) == (
        True, False, False, False)


def test_a_forgotten_manifest_closes_its_batch_before_anything_else() -> None:
    from streamproc.core.retention import Forgotten

    sizes = BatchSizes()
    sizes.apply(encode_manifest(BatchManifest("b", 10, 5, "in.jsonl", cancelled_ms=7)))
    sizes.apply(encode_manifest(BatchManifest("kept", 10, 5, "in.jsonl")))
    assert not sizes.forgotten("b") and sizes.forgotten_batches == frozenset()
    sizes.apply(encode_manifest(BatchManifest("b", 10, 5, "in.jsonl", cancelled_ms=7,
                                              forgotten=Forgotten(9, 8, 10))))
    assert (sizes.closed("b"), sizes.closed("kept")) == ("batch_forgotten", None)
    assert sizes.forgotten("b") and not sizes.forgotten("kept") and not sizes.forgotten(None)
    assert sizes.forgotten_batches == frozenset({"b"})


def test_a_manifest_gives_its_batch_s_deadline_and_an_old_one_none() -> None:
    sizes = BatchSizes()
    sizes.apply(encode_manifest(BatchManifest("soon", 10, 5, "in.jsonl", deadline_ms=60_005)))
    sizes.apply(encode_manifest(BatchManifest("whenever", 10, 5, "in.jsonl")))
    assert (sizes.deadline("soon"), sizes.deadline("whenever"), sizes.deadline(None)) == (60_005, None, None)
