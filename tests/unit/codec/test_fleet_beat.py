"""Fleet beats on the wire: versioned JSON that a reader of an older version still reads (design §5.8)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamproc.codec.fleet_beat import VERSION, decode_beat, encode_beat
from streamproc.core.fleet_share import Beat, ModelDemand
from streamproc.core.spend_cap import Scope, Spend

amounts = st.one_of(st.just(0.0), st.floats(0.001, 1e9).map(lambda x: round(x, 3)))
limits = st.one_of(st.none(), st.floats(0.001, 1e9).map(lambda x: round(x, 3)))
active_demands = st.builds(ModelDemand, waiting_calls=st.floats(0.001, 1e6).map(lambda x: round(x, 3)),
                           waiting_tokens=amounts, sent_rpm=amounts, sent_tpm=amounts, limit_rpm=limits,
                           limit_tpm=limits, share=st.one_of(st.none(), st.floats(0.001, 1).map(lambda x: round(x, 3))),
                           limit_told=st.booleans())
model_names = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=20)


@given(st.dictionaries(model_names, active_demands, max_size=10), st.sampled_from([0.5, 1.0, 2.0]))
def test_a_beat_reads_back_as_written(models: dict[str, ModelDemand], every_s: float) -> None:
    beat = Beat("host-1-abc", models, every_s)
    assert decode_beat("host-1-abc", encode_beat(beat)) == beat


def test_a_worker_s_place_in_its_group_reads_back() -> None:
    beat = Beat("w", {}, 2.0, paused=True, generation=7)
    assert decode_beat("w", encode_beat(beat)) == beat
    assert b"paused" not in encode_beat(Beat("w", {})) and b"generation" not in encode_beat(Beat("w", {}))


def test_idle_models_are_left_out_and_read_back_idle() -> None:
    beat = Beat("w", {"busy": ModelDemand(waiting_calls=3, limit_rpm=600), "idle": ModelDemand(limit_rpm=600)})
    decoded = decode_beat("w", encode_beat(beat))
    assert set(decoded.models) == {"busy"}
    assert not decoded.demand("idle").active


def test_fields_a_reader_does_not_know_are_skipped() -> None:
    """A newer worker adds fields without raising the version."""
    record = {"v": VERSION, "every_ms": 1000, "quota": {"b1": 1.5},
              "models": {"m": {"waiting_calls": 2, "sent_rpm": 60, "spend_usd": 0.2}}}
    beat = decode_beat("w", json.dumps(record).encode())
    assert beat == Beat("w", {"m": ModelDemand(waiting_calls=2, sent_rpm=60)}, 1.0)


spends = st.builds(Spend, st.floats(0, 1e6).map(lambda x: round(x, 9)), st.integers(0, 10**12))


@given(st.dictionaries(st.builds(Scope, st.sampled_from(["batch", "day"]), model_names), spends, max_size=5))
def test_the_spend_per_batch_and_day_reads_back(spend: dict[Scope, Spend]) -> None:
    beat = Beat("w", {}, spend=spend)
    assert decode_beat("w", encode_beat(beat)) == beat
    assert b"spend" in encode_beat(beat) or not spend


def test_a_beat_before_spend_caps_spent_nothing_and_an_old_reader_reads_one_after() -> None:
    assert decode_beat("w", b'{"v":1,"models":{}}').spend == {}
    record = json.loads(encode_beat(Beat("w", {"m": ModelDemand(waiting_calls=1)},
                                         spend={Scope("batch", "b1"): Spend(0.5, 900)})))
    assert record["spend"] == {"batch": {"b1": [0.5, 900]}}
    assert {"v", "models"} <= record.keys() and record["v"] == 1  # fields only added: the version stays


def test_a_later_incompatible_version_wants_everything() -> None:
    beat = decode_beat("w", json.dumps({"v": VERSION + 1, "every_ms": 2000, "shares": "elsewhere"}).encode())
    assert beat.unreadable and beat.every_s == 2.0
    assert beat.demand("any-model").waits


def test_the_beat_interval_is_kept_within_reason() -> None:
    assert decode_beat("w", b'{"v":1,"every_ms":1}').every_s == 0.1
    assert decode_beat("w", b'{"v":1,"every_ms":1e12}').every_s == 60.0
    assert decode_beat("w", b'{"v":1}').every_s == 1.0


@pytest.mark.parametrize("value", [
    b"", b"\xff", b"[]", b'"beat"', b"{}", b'{"v":"1"}', b'{"v":0}', b'{"v":true}', b'{"v":1,"every_ms":"x"}',
    b'{"v":1,"models":[]}', b'{"v":1,"models":{"m":3}}', b'{"v":1,"models":{"m":{"waiting_calls":-1}}}',
    b'{"v":1,"models":{"m":{"sent_rpm":"many"}}}', b'{"v":1,"models":{"m":{"limit_rpm":true}}}',
    b'{"v":1,"models":{"m":{"share":NaN}}}', b'{"v":1,"every_ms":Infinity}', b'{"v":1,"paused":1}',
    b'{"v":1,"generation":-1}', b'{"v":1,"generation":1.5}', b'{"v":1,"spend":[]}', b'{"v":1,"spend":{"batch":1}}',
    b'{"v":1,"spend":{"batch":{"b":[1]}}}', b'{"v":1,"spend":{"batch":{"b":[-1,2]}}}',
    b'{"v":1,"spend":{"day":{"d":["x",2]}}}', b'{"v":1,"out":[]}', b'{"v":1,"out":{"m@2":1}}',
])
def test_anything_that_is_not_a_beat_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError):
        decode_beat("w", value)


def test_the_deployments_out_read_back_bounded() -> None:
    out = {f"m@{n:03}": "circuit breaker open after calls that hang (read_timeout)" + "!" * 3 * n for n in range(100)}
    read = decode_beat("w", encode_beat(Beat("w", out=out))).out
    assert sorted(read) == sorted(out)[:64] and read["m@001"] == out["m@001"] and len(read["m@063"]) == 160
    assert decode_beat("w", encode_beat(Beat("w"))).out == {}
    assert "out" not in json.loads(encode_beat(Beat("w")))  # an older reader never meets it without cause


def test_a_zero_limit_reads_as_unknown() -> None:
    assert decode_beat("w", b'{"v":1,"models":{"m":{"sent_rpm":1,"limit_rpm":0}}}').demand("m").limit_rpm is None


def test_whether_a_limit_was_told_reads_back_and_is_false_when_absent() -> None:
    told = Beat("w", {"m": ModelDemand(waiting_calls=1, limit_rpm=3000, limit_told=True)})
    assert decode_beat("w", encode_beat(told)) == told
    assert b"limit_told" not in encode_beat(Beat("w", {"m": ModelDemand(waiting_calls=1, limit_rpm=3000)}))
    with pytest.raises(ValueError, match="limit_told"):
        decode_beat("w", json.dumps({"v": VERSION, "models": {"m": {"limit_told": 1}}}).encode())
