"""Profiles: the built-ins say what the docs say, files load (or fail with a useful message), overrides apply."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from streamproc.core.vocabulary import FailureLayer
from streamproc.mockllm.injected_faults import FaultKind, RequestTraits, draw
from streamproc.mockllm.latency import (
    FixedLatency,
    LatencyError,
    LognormalLatency,
    UniformLatency,
    latency_from_config,
    parse_latency_spec,
)
from streamproc.mockllm.profiles import (
    BUILTIN_PROFILES,
    OutageWindow,
    Overrides,
    ProfileError,
    ServerLimits,
    customize,
    load_profile,
    profile_from_mapping,
)


def first_pass_clean_share(name: str, traits: RequestTraits, count: int = 20_000) -> float:
    table = BUILTIN_PROFILES[name].fault_table()
    clean = sum(table.pick(draw(0, i.to_bytes(8, "big"), 0), traits) is None for i in range(count))
    return clean / count


def test_clean_has_no_faults_no_limits_no_latency() -> None:
    clean = load_profile("clean")
    assert clean.fault_table().empty
    assert clean.rate_limits.rpm is None and clean.rate_limits.tpm is None
    assert clean.latency == FixedLatency(0.0)
    assert {m.name: m.context_window for m in clean.models} == {"mock-small": 4096, "mock-large": 32768}


@pytest.mark.parametrize(
    "traits",
    [RequestTraits(), RequestTraits(wants_json=True, has_required_fields=True), RequestTraits(stream=True)],
)
@pytest.mark.parametrize(("name", "low", "high"),
                         [("realistic", 0.92, 0.96), ("strict", 0.86, 0.92), ("strict-v1", 0.85, 0.91)])
def test_first_pass_clean_share_is_as_documented(name: str, low: float, high: float, traits: RequestTraits) -> None:
    """realistic: 94-95 %; strict: 88-90 %; strict-v1: 87-89 % (faults that cannot show in a request count as
    clean)."""
    assert low <= first_pass_clean_share(name, traits) <= high


def test_realistic_spans_all_four_layers() -> None:
    layers = {kind.layer for kind, rate in BUILTIN_PROFILES["realistic"].faults.items() if rate > 0}
    assert layers == set(FailureLayer)


def test_flaky_has_a_few_percent_of_each_transport_and_service_fault() -> None:
    faults = BUILTIN_PROFILES["flaky"].faults
    for kind in FaultKind:
        if kind.layer in (FailureLayer.TRANSPORT, FailureLayer.SERVICE):
            assert 0.01 <= faults.get(kind, 0) <= 0.05, kind
        else:
            assert faults.get(kind, 0) == 0, kind


def test_outage_profile_opens_with_an_outage() -> None:
    assert BUILTIN_PROFILES["outage"].outage == OutageWindow(seconds=30.0, start=0.0)


def layer_share(name: str, layer: FailureLayer) -> float:
    return sum(rate for kind, rate in BUILTIN_PROFILES[name].faults.items() if kind.layer is layer)


def test_strict_is_a_rate_limited_server_with_the_quirks_of_real_ones() -> None:
    strict = load_profile("strict")
    assert strict.rate_limits == ServerLimits(rpm=3000, tpm=None, burst_seconds=1.0)  # a burst of 50, no more
    assert strict.limit_headers == "on_429"  # the other profiles send them on every answer
    assert strict.hang_seconds == 90.0  # a hang lasts until the client gives up, or 90 s
    assert strict.injected_429 == "retry_after_only"  # 1 % of 429s name no bucket, whatever the rate
    assert strict.faults[FaultKind.RATE_LIMIT] == 0.010
    assert strict.strict_request_id  # llama-cpp-python's empty 400 for a non-UUID x-request-id
    assert strict.slots is None  # one slot is --slots 1 on top, not part of the profile
    assert strict.latency == BUILTIN_PROFILES["realistic"].latency == LognormalLatency(p50=0.4, p99=3.0)
    assert [BUILTIN_PROFILES[name].limit_headers for name in ("clean", "flaky", "realistic", "outage")] == [
        "always"
    ] * 4


def test_strict_v1_and_strict_unlimited_are_strict_with_one_difference_each() -> None:
    strict, v1, unlimited = (load_profile(name) for name in ("strict", "strict-v1", "strict-unlimited"))
    assert (v1.injected_429, v1.hang_seconds, v1.faults[FaultKind.RATE_LIMIT]) == ("limiter_headers", math.inf, 0.020)
    assert {k: r for k, r in v1.faults.items() if k is not FaultKind.RATE_LIMIT} == {
        k: r for k, r in strict.faults.items() if k is not FaultKind.RATE_LIMIT}
    assert unlimited.rate_limits == ServerLimits(rpm=None, tpm=None)
    assert replace(unlimited, name="strict", rate_limits=strict.rate_limits) == strict


@pytest.mark.parametrize(("name", "service"), [("strict", 0.04), ("strict-v1", 0.05)])
def test_strict_fails_on_every_layer_in_the_documented_shares(name: str, service: float) -> None:
    shares = {layer: layer_share(name, layer) for layer in FailureLayer}
    expected = {
        FailureLayer.TRANSPORT: 0.03,
        FailureLayer.SERVICE: service,
        FailureLayer.SEMANTIC: 0.03,
        FailureLayer.BUSINESS: 0.02,
    }
    assert shares == pytest.approx(expected)
    faults = BUILTIN_PROFILES[name].faults
    assert 0 < faults[FaultKind.HANG] < shares[FailureLayer.TRANSPORT]  # a share of transport faults hang
    assert {kind for kind, rate in faults.items() if kind.layer is FailureLayer.SERVICE and rate > 0} == {
        FaultKind.RATE_LIMIT,
        FaultKind.SERVER_ERROR,
        FaultKind.BAD_GATEWAY,
        FaultKind.SERVICE_UNAVAILABLE,
    }


def test_yaml_file_based_on_a_builtin(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        """
base: realistic
faults:
  server_error: 0.2
  content_policy: 0
models:
  gpt-4o-mini: {context_window: 128000, latency: 0.05}
latency: {kind: uniform, low: 0.01, high: 0.02}
rate_limits: {rpm: 100, tpm: 5000, burst_seconds: 1}
outage: {start: 5, seconds: 10}
default_max_tokens: 128
hang_seconds: 2
retry_after_seconds: 0.5
""",
        encoding="utf-8",
    )
    profile = load_profile(str(path))
    assert profile.name == "mine"
    assert profile.faults[FaultKind.SERVER_ERROR] == 0.2
    assert profile.faults[FaultKind.CONTENT_POLICY] == 0
    assert profile.faults[FaultKind.RESET] == BUILTIN_PROFILES["realistic"].faults[FaultKind.RESET]
    large = profile.model("gpt-4o-mini")
    assert large is not None and large.context_window == 128000 and large.latency == FixedLatency(0.05)
    assert profile.model("mock-small") is not None
    assert profile.latency == UniformLatency(0.01, 0.02)
    assert (profile.rate_limits.rpm, profile.rate_limits.tpm, profile.rate_limits.burst_seconds) == (100, 5000, 1.0)
    assert profile.outage == OutageWindow(seconds=10.0, start=5.0)
    assert (profile.default_max_tokens, profile.hang_seconds, profile.retry_after_seconds) == (128, 2.0, 0.5)


def test_the_quirks_can_be_set_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "llama.yaml"
    path.write_text("limit_headers: on_429\nslots: 1\nstrict_request_id: true\nhang_seconds: null\n", encoding="utf-8")
    profile = load_profile(str(path))
    assert (profile.limit_headers, profile.slots, profile.strict_request_id) == ("on_429", 1, True)
    assert profile.hang_seconds == math.inf
    assert profile_from_mapping({"hang_seconds": float("inf")}).hang_seconds == math.inf  # YAML's .inf
    relaxed = profile_from_mapping({"base": "strict", "limit_headers": "always", "slots": None})
    assert (relaxed.limit_headers, relaxed.slots, relaxed.rate_limits.rpm) == ("always", None, 3000)
    assert profile_from_mapping({"huge_answer_bytes": 5_000_000}).huge_answer_bytes == 5_000_000
    assert BUILTIN_PROFILES["clean"].huge_answer_bytes == 2 * 1024 * 1024


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"name": "j", "faults": {"reset": 1.0}}), encoding="utf-8")
    profile = load_profile(str(path))
    assert profile.name == "j"
    assert dict(profile.faults) == {FaultKind.RESET: 1.0}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "mapping"),
        ({"fautls": {}}, "unknown keys"),
        ({"base": "nope"}, "base"),
        ({"faults": {"explode": 0.1}}, "unknown fault kind 'explode'"),
        ({"faults": {"reset": 2}}, r"faults.reset"),
        ({"faults": {"reset": "often"}}, "number"),
        ({"faults": {"reset": 0.7, "hang": 0.7}}, "add up"),
        ({"models": {"m": {"context_window": 0}}}, "context_window"),
        ({"models": {"m": {"window": 10}}}, "models.m"),
        ({"latency": {"kind": "gamma"}}, "gamma"),
        ({"latency": {"kind": "lognormal", "p50": 2, "p99": 1}}, "p50 <= p99"),
        ({"rate_limits": {"rpm": -1}}, "rpm"),
        ({"outage": {"start": 1}}, "seconds"),
        ({"default_max_tokens": 1.5}, "default_max_tokens"),
        ({"hang_seconds": -1}, "hang_seconds"),
        ({"limit_headers": "sometimes"}, "limit_headers: one of always, on_429"),
        ({"slots": 0}, "slots"),
        ({"slots": 1.5}, "slots"),
        ({"strict_request_id": "yes"}, "strict_request_id: true or false"),
        ({"huge_answer_bytes": 0}, "huge_answer_bytes"),
    ],
)
def test_bad_profiles_say_what_is_wrong(data: object, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        profile_from_mapping(data)


def test_unknown_name_and_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="neither a built-in"):
        load_profile("no-such-profile")
    broken = tmp_path / "broken.yaml"
    broken.write_text("faults: [unclosed", encoding="utf-8")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(str(broken))


def test_overrides() -> None:
    profile = customize(
        load_profile("realistic"),
        Overrides(
            rpm=60,
            tpm=None,
            latency=FixedLatency(0.0),
            models={"gpt-4o-mini": 128000, "mock-small": 1000},
            faults={FaultKind.RESET: 0.5},
            outage_seconds=3.0,
            hang_seconds=1.0,
            slots=2,
        ),
    )
    assert profile.rate_limits.rpm == 60
    assert profile.rate_limits.tpm == BUILTIN_PROFILES["realistic"].rate_limits.tpm
    assert profile.latency == FixedLatency(0.0)
    assert all(m.latency is None for m in profile.models)
    small = profile.model("mock-small")
    assert small is not None and small.context_window == 1000
    assert profile.model("gpt-4o-mini") is not None
    assert profile.faults[FaultKind.RESET] == 0.5
    assert profile.outage == OutageWindow(seconds=3.0)
    assert profile.hang_seconds == 1.0
    assert profile.slots == 2
    with pytest.raises(ProfileError, match="add up"):
        customize(load_profile("clean"), Overrides(faults={FaultKind.RESET: 0.8, FaultKind.HANG: 0.8}))


@pytest.mark.parametrize(
    ("spec", "latency"),
    [
        ("0.25", FixedLatency(0.25)),
        ("fixed:1", FixedLatency(1.0)),
        ("uniform:0.1:0.5", UniformLatency(0.1, 0.5)),
        ("lognormal:0.4:3", LognormalLatency(0.4, 3.0)),
    ],
)
def test_latency_specs(spec: str, latency: object) -> None:
    assert parse_latency_spec(spec) == latency


@pytest.mark.parametrize("spec", ["fast", "-1", "uniform:2:1", "lognormal:0:1", "uniform:1", "gamma:1:2"])
def test_bad_latency_specs(spec: str) -> None:
    with pytest.raises(LatencyError):
        parse_latency_spec(spec)


def test_latency_distributions() -> None:
    lognormal = LognormalLatency(p50=0.5, p99=4.0)
    assert lognormal.sample(0.5) == pytest.approx(0.5)
    assert lognormal.sample(0.99) == pytest.approx(4.0)
    assert lognormal.sample(0.0) > 0
    assert UniformLatency(1.0, 3.0).sample(0.25) == 1.5
    assert latency_from_config(2) == FixedLatency(2.0)
    assert latency_from_config({"kind": "lognormal", "p50": 1, "p99": 2}) == LognormalLatency(1.0, 2.0)
    with pytest.raises(LatencyError):
        latency_from_config(True)
