"""A batch's spend cap on the manifests topic and on its requests (design §5.9)."""

from __future__ import annotations

import pytest

from streamproc.app.manifest_follower import BatchSizes
from streamproc.codec.batch_cap import BatchCap, cap_key, decode_batch_cap, decode_cap, encode_batch_cap, encode_cap
from streamproc.codec.manifest import BatchManifest, decode_manifest, encode_manifest
from streamproc.core.spend_cap import Cap


def test_a_cap_reads_back_and_its_key_never_meets_a_manifest_s() -> None:
    written = BatchCap("b1", Cap(2.5, 10_000), 1_700_000_000_000)
    assert decode_batch_cap(encode_batch_cap(written)) == written
    assert decode_cap(encode_cap(Cap(max_tokens=7))) == Cap(None, 7)
    assert cap_key("b1") == b"b1/cap"  # a batch id holds no '/': never another batch's manifest key


def test_a_manifest_reader_skips_a_cap_and_a_cap_reader_a_manifest() -> None:
    manifest = encode_manifest(BatchManifest("b1", 10, 0, "in.jsonl"))
    with pytest.raises(ValueError):
        decode_manifest(encode_batch_cap(BatchCap("b1", Cap(1.0), 0)))
    with pytest.raises(ValueError):
        decode_batch_cap(manifest)


@pytest.mark.parametrize("value", [b"", b"[]", b'{"max_cost_usd":-1}', b'{"max_cost_usd":"1"}',
                                   b'{"max_tokens":1.5}', b'{"max_tokens":true}', b'{"max_cost_usd":NaN}'])
def test_anything_that_is_not_a_cap_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError):
        decode_cap(value)


def test_the_follower_keeps_the_latest_cap_of_each_batch_beside_its_manifest() -> None:
    sizes = BatchSizes()
    sizes.apply(encode_batch_cap(BatchCap("b1", Cap(1.0), 1)))
    sizes.apply(encode_manifest(BatchManifest("b1", 10, 0, "in.jsonl")))
    sizes.apply(encode_batch_cap(BatchCap("b1", Cap(3.0, 500), 2)))  # raise-cap
    assert sizes.cap("b1") == Cap(3.0, 500) and sizes.submitted("b1") == 10
    assert sizes.cap("b2") is None


def test_a_manifest_keeps_its_tenancy_and_one_written_before_tenants_reads_as_the_default() -> None:
    manifest = BatchManifest("b", 3, 1_000, "in.jsonl", tenant="team-a", priority="low")
    assert decode_manifest(encode_manifest(manifest)) == manifest
    old = decode_manifest(b'{"batch_id": "b", "submitted": 3, "created_ms": 1000}')
    assert (old.tenant, old.priority) == ("default", "normal")
    with pytest.raises(ValueError, match="not a batch manifest: tenant"):
        decode_manifest(b'{"batch_id": "b", "submitted": 3, "created_ms": 1000, "tenant": "a b"}')
