"""Profiles: the built-ins say what the docs say, files load (or fail with a useful message), overrides apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamproc.core.vocabulary import FailureLayer
from streamproc.mockllm.faults import FaultKind, RequestTraits, draw
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
def test_realistic_is_mostly_clean_on_a_first_pass(traits: RequestTraits) -> None:
    assert 0.92 <= first_pass_clean_share("realistic", traits) <= 0.96


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
