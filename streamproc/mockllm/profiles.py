"""Profiles: how often each fault happens, which models exist, latency, rate limits, outage windows, and the
quirks of particular servers (rate-limit headers only on 429s, 429s that name no bucket, long hangs, one
request at a time).

A profile is plain typed data, built in (``clean``, ``flaky``, ``realistic``, ``outage``, ``strict``,
``strict-v1``, ``strict-unlimited``) or read from a YAML/JSON file that may start from a built-in (``base:``)
and override parts of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar, get_args

import yaml

from streamproc.mockllm.batch_settings import (
    BatchSettings,
    BatchSettingsError,
    batch_faults_by_number,
    batch_settings_from_mapping,
)
from streamproc.mockllm.injected_faults import FaultKind, FaultRatesError, FaultTable
from streamproc.mockllm.latency import (
    NO_LATENCY,
    Latency,
    LatencyError,
    LognormalLatency,
    latency_from_config,
)


class ProfileError(ValueError):
    """A profile name that is not built in, or a profile file that does not describe a profile."""


@dataclass(frozen=True)
class ModelSpec:
    """A model the mock serves; the context window makes ``context_length_exceeded`` a real check."""

    name: str
    context_window: int
    latency: Latency | None = None  # None: the profile's latency


@dataclass(frozen=True)
class ServerLimits:
    """Requests-per-minute and tokens-per-minute limits over all clients; None means unlimited.

    ``burst_seconds`` is the bucket size in seconds of the per-minute rate: providers enforce a minute
    limit over short windows (60,000 RPM as 1,000 per second), so a fresh client cannot burst a minute's
    worth at once.
    """

    rpm: int | None = None
    tpm: int | None = None
    burst_seconds: float = 0.25


@dataclass(frozen=True)
class OutageWindow:
    """All chat/completion calls answer 503 from ``start`` seconds after server start, for ``seconds``."""

    seconds: float
    start: float = 0.0


# When answers carry ``x-ratelimit-*``: on every answer (OpenAI), or only on 429s (servers and proxies that
# say nothing about their limits until one is hit, so a client cannot pace itself from 200s).
LimitHeaders = Literal["always", "on_429"]
LIMIT_HEADERS: tuple[LimitHeaders, ...] = get_args(LimitHeaders)

# What an injected 429 (the ``rate_limit`` fault) carries: the limiter's ``x-ratelimit-*`` (which then say its
# buckets have room: one request refused) with ``retry-after(-ms)``, or only ``retry-after`` (a 429 the server
# sends for reasons of its own, such as a busy shard, that names no bucket).
Injected429 = Literal["limiter_headers", "retry_after_only"]
INJECTED_429: tuple[Injected429, ...] = get_args(Injected429)
Choice = TypeVar("Choice", bound=str)

DEFAULT_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("mock-small", 4096),
    ModelSpec("mock-large", 32768),
)


@dataclass(frozen=True)
class Profile:
    name: str
    faults: Mapping[FaultKind, float] = field(default_factory=lambda: MappingProxyType({}))
    models: tuple[ModelSpec, ...] = DEFAULT_MODELS
    latency: Latency = NO_LATENCY
    rate_limits: ServerLimits = ServerLimits()
    outage: OutageWindow | None = None
    default_max_tokens: int = 256  # reserved for the answer when a request gives no max_tokens
    hang_seconds: float = 300.0  # how long a hang lasts when the client does not give up first; inf: forever
    retry_after_seconds: float = 1.0  # the hint carried by an injected 429 rate_limit fault
    limit_headers: LimitHeaders = "always"
    injected_429: Injected429 = "limiter_headers"
    slots: int | None = None  # requests worked on at once, the rest queue (llama.cpp's slots); None: unlimited
    # llama-cpp-python's server (starlette-context's RequestIdPlugin) answers a non-UUID x-request-id with an
    # empty 400, before anything else; a client that sends its own ids there fails every call.
    strict_request_id: bool = False
    huge_answer_bytes: int = 2 * 1024 * 1024  # the content of a huge_answer: twice a Kafka record's default limit
    batches: BatchSettings = field(default_factory=BatchSettings)  # provider batches: phases, limits, failures

    def fault_table(self) -> FaultTable:
        return FaultTable.from_rates(self.faults)

    def model(self, name: str) -> ModelSpec | None:
        for spec in self.models:
            if spec.name == name:
                return spec
        return None

    def with_faults(self, overrides: Mapping[FaultKind, float]) -> Profile:
        merged = {**self.faults, **overrides}
        FaultTable.from_rates(merged)
        return replace(self, faults=MappingProxyType(merged))

    def with_models(self, models: Mapping[str, ModelSpec]) -> Profile:
        merged = {m.name: m for m in self.models}
        merged.update(models)
        return replace(self, models=tuple(merged.values()))


def _rates(**rates: float) -> Mapping[FaultKind, float]:
    return MappingProxyType({FaultKind(name): rate for name, rate in rates.items()})


STRICT = Profile(
    "strict",
    faults=_rates(
        hang=0.010,
        reset=0.008,
        truncated_body=0.006,
        non_json_body=0.006,
        rate_limit=0.010,
        server_error=0.012,
        bad_gateway=0.009,
        service_unavailable=0.009,
        empty_content=0.008,
        invalid_json=0.008,
        schema_mismatch=0.007,
        length=0.007,
        invalid_request=0.008,
        content_policy=0.012,
    ),
    latency=LognormalLatency(p50=0.4, p99=3.0),
    rate_limits=ServerLimits(rpm=3000, burst_seconds=1.0),
    hang_seconds=90.0,
    limit_headers="on_429",
    injected_429="retry_after_only",
    strict_request_id=True,
)

BUILTIN_PROFILES: Mapping[str, Profile] = MappingProxyType(
    {
        "clean": Profile("clean"),
        # A few % of each transport and service fault: a hard workout for retries and the breaker.
        "flaky": Profile(
            "flaky",
            faults=_rates(
                hang=0.01,
                reset=0.02,
                truncated_body=0.02,
                non_json_body=0.02,
                stream_break=0.03,
                rate_limit=0.03,
                server_error=0.02,
                bad_gateway=0.02,
                service_unavailable=0.02,
                gateway_timeout=0.02,
                overloaded=0.02,
            ),
        ),
        # About 94-95 % clean on a first pass, failures spread over all four layers, like a real batch.
        "realistic": Profile(
            "realistic",
            faults=_rates(
                hang=0.002,
                reset=0.003,
                truncated_body=0.002,
                non_json_body=0.002,
                stream_break=0.003,
                rate_limit=0.010,
                server_error=0.005,
                bad_gateway=0.003,
                service_unavailable=0.004,
                gateway_timeout=0.002,
                overloaded=0.002,
                empty_content=0.004,
                invalid_json=0.006,
                schema_mismatch=0.006,
                length=0.004,
                invalid_request=0.003,
                content_policy=0.005,
            ),
            latency=LognormalLatency(p50=0.4, p99=3.0),
            rate_limits=ServerLimits(rpm=6000, tpm=2_000_000),
        ),
        # Every call answers 503 for the first 30 s, then the server is clean: breaker and recovery drills.
        "outage": Profile("outage", outage=OutageWindow(seconds=30.0)),
        # A rate-limited server with the quirks that broke clients tuned against the others: a one-second
        # bucket (a burst of 50 at 3,000 RPM), x-ratelimit-* only on its limiter's 429s (with remaining 0),
        # 1 % of calls refused with a 429 that says only "retry-after: 1" whatever the rate, hangs of 90 s,
        # and an empty 400 for a non-UUID x-request-id. About 88 % clean on a first pass.
        "strict": STRICT,
        # strict as it was first built: its injected 429s (2 %) carry the limiter's headers, which say its
        # buckets have room, and its hangs never end.
        "strict-v1": replace(
            STRICT,
            name="strict-v1",
            faults=MappingProxyType({**STRICT.faults, FaultKind.RATE_LIMIT: 0.020}),
            hang_seconds=math.inf,
            injected_429="limiter_headers",
        ),
        # strict's faults, 429s and hangs on a server with no rate limit at all.
        "strict-unlimited": replace(STRICT, name="strict-unlimited", rate_limits=ServerLimits()),
    }
)


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, else a YAML or JSON profile file."""
    builtin = BUILTIN_PROFILES.get(name_or_path)
    if builtin is not None:
        return builtin
    path = Path(name_or_path)
    if not path.is_file():
        names = ", ".join(BUILTIN_PROFILES)
        raise ProfileError(f"{name_or_path!r} is neither a built-in profile ({names}) nor a file")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ProfileError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    return profile_from_mapping(data, default_name=path.stem, where=str(path))


_KEYS = {
    "name",
    "base",
    "faults",
    "models",
    "latency",
    "rate_limits",
    "outage",
    "default_max_tokens",
    "hang_seconds",
    "retry_after_seconds",
    "limit_headers",
    "injected_429",
    "slots",
    "strict_request_id",
    "huge_answer_bytes",
    "batches",
}


def profile_from_mapping(data: Any, *, default_name: str = "custom", where: str = "profile") -> Profile:
    """Build a profile from parsed YAML/JSON; every mistake is a ProfileError that names the key."""
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where}: a profile is a mapping of keys, got {type(data).__name__}")
    unknown = set(data) - _KEYS
    if unknown:
        raise ProfileError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(_KEYS)}")
    base_name = data.get("base", "clean")
    if base_name not in BUILTIN_PROFILES:
        raise ProfileError(f"{where}: base {base_name!r} is not one of {', '.join(BUILTIN_PROFILES)}")
    profile = replace(BUILTIN_PROFILES[base_name], name=str(data.get("name", default_name)))
    try:
        if "faults" in data:
            profile = profile.with_faults(_fault_rates(data["faults"]))
        if "models" in data:
            profile = profile.with_models(_models(data["models"]))
        if "latency" in data:
            profile = replace(profile, latency=latency_from_config(data["latency"]))
        if "rate_limits" in data:
            profile = replace(profile, rate_limits=_rate_limits(data["rate_limits"]))
        if "outage" in data:
            profile = replace(profile, outage=_outage(data["outage"]))
        if "default_max_tokens" in data:
            profile = replace(
                profile, default_max_tokens=_positive_int(data["default_max_tokens"], "default_max_tokens")
            )
        if "hang_seconds" in data:
            profile = replace(profile, hang_seconds=_hang_seconds(data["hang_seconds"]))
        if "retry_after_seconds" in data:
            profile = replace(
                profile, retry_after_seconds=_non_negative(data["retry_after_seconds"], "retry_after_seconds")
            )
        if "limit_headers" in data:
            profile = replace(profile, limit_headers=_one_of(data["limit_headers"], LIMIT_HEADERS, "limit_headers"))
        if "injected_429" in data:
            profile = replace(profile, injected_429=_one_of(data["injected_429"], INJECTED_429, "injected_429"))
        if "slots" in data:
            slots = data["slots"]
            profile = replace(profile, slots=None if slots is None else _positive_int(slots, "slots"))
        if "strict_request_id" in data:
            profile = replace(profile, strict_request_id=_flag(data["strict_request_id"], "strict_request_id"))
        if "huge_answer_bytes" in data:
            profile = replace(
                profile, huge_answer_bytes=_positive_int(data["huge_answer_bytes"], "huge_answer_bytes")
            )
        if "batches" in data:
            profile = replace(profile, batches=batch_settings_from_mapping(data["batches"], profile.batches))
    except (FaultRatesError, LatencyError, ProfileError, BatchSettingsError) as exc:
        raise ProfileError(f"{where}: {exc}") from None
    return profile


def _fault_rates(value: Any) -> dict[FaultKind, float]:
    if not isinstance(value, Mapping):
        raise ProfileError("faults: a mapping of fault kind to rate expected")
    rates: dict[FaultKind, float] = {}
    for name, rate in value.items():
        try:
            kind = FaultKind(name)
        except ValueError:
            known = ", ".join(k.value for k in FaultKind)
            raise ProfileError(f"faults: unknown fault kind {name!r}; known: {known}") from None
        rates[kind] = _rate(rate, f"faults.{name}")
    return rates


def _models(value: Any) -> dict[str, ModelSpec]:
    if not isinstance(value, Mapping):
        raise ProfileError("models: a mapping of model name to {context_window, latency} expected")
    models: dict[str, ModelSpec] = {}
    for name, spec in value.items():
        if not isinstance(spec, Mapping) or not set(spec) <= {"context_window", "latency"}:
            raise ProfileError(f"models.{name}: keys context_window and latency (optional) expected")
        window = _positive_int(spec.get("context_window", 4096), f"models.{name}.context_window")
        latency = latency_from_config(spec["latency"]) if "latency" in spec else None
        models[str(name)] = ModelSpec(str(name), window, latency)
    return models


def _rate_limits(value: Any) -> ServerLimits:
    if value is None:
        return ServerLimits()
    if not isinstance(value, Mapping) or not set(value) <= {"rpm", "tpm", "burst_seconds"}:
        raise ProfileError("rate_limits: keys rpm, tpm, burst_seconds expected")
    rpm = value.get("rpm")
    tpm = value.get("tpm")
    return ServerLimits(
        rpm=None if rpm is None else _positive_int(rpm, "rate_limits.rpm"),
        tpm=None if tpm is None else _positive_int(tpm, "rate_limits.tpm"),
        burst_seconds=_positive(value.get("burst_seconds", ServerLimits.burst_seconds), "burst_seconds"),
    )


def _outage(value: Any) -> OutageWindow | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not set(value) <= {"start", "seconds"} or "seconds" not in value:
        raise ProfileError("outage: keys seconds and start (optional) expected")
    return OutageWindow(
        seconds=_non_negative(value["seconds"], "outage.seconds"),
        start=_non_negative(value.get("start", 0.0), "outage.start"),
    )


def _hang_seconds(value: Any) -> float:
    """A number >= 0; null (or YAML's ``.inf``) is a hang that lasts until the client gives up."""
    return math.inf if value is None else _non_negative(value, "hang_seconds")


def _one_of(value: Any, allowed: tuple[Choice, ...], key: str) -> Choice:
    for choice in allowed:
        if value == choice:
            return choice
    raise ProfileError(f"{key}: one of {', '.join(allowed)} expected, got {value!r}")


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"{key}: true or false expected, got {value!r}")
    return value


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"{key}: a number expected, got {value!r}")
    return float(value)


def _rate(value: Any, key: str) -> float:
    rate = _number(value, key)
    if not 0.0 <= rate <= 1.0:
        raise ProfileError(f"{key}: a rate within [0, 1] expected, got {value!r}")
    return rate


def _positive(value: Any, key: str) -> float:
    number = _number(value, key)
    if number <= 0:
        raise ProfileError(f"{key}: a positive number expected, got {value!r}")
    return number


def _non_negative(value: Any, key: str) -> float:
    number = _number(value, key)
    if number < 0:
        raise ProfileError(f"{key}: a number >= 0 expected, got {value!r}")
    return number


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ProfileError(f"{key}: a positive integer expected, got {value!r}")
    return value


@dataclass(frozen=True)
class Overrides:
    """Command-line style adjustments on top of a profile; None leaves the profile's value."""

    rpm: int | None = None
    tpm: int | None = None
    burst_seconds: float | None = None
    latency: Latency | None = None  # replaces the profile's and every model's latency
    models: Mapping[str, int] = field(default_factory=dict)  # name -> context window, added or replaced
    faults: Mapping[FaultKind, float] = field(default_factory=dict)
    outage_seconds: float | None = None  # an outage from server start, for this many seconds
    hang_seconds: float | None = None  # inf: hangs last until the client gives up
    slots: int | None = None
    batch_seconds: float | None = None  # how long a provider batch stays in_progress
    batch_faults: Mapping[int, str] = field(default_factory=dict)  # the Nth OpenAI batch -> x-mock-batch parts


def customize(profile: Profile, overrides: Overrides) -> Profile:
    """The profile with the overrides applied (checked like a profile file)."""
    limits = profile.rate_limits
    limits = replace(
        limits,
        rpm=overrides.rpm if overrides.rpm is not None else limits.rpm,
        tpm=overrides.tpm if overrides.tpm is not None else limits.tpm,
        burst_seconds=overrides.burst_seconds if overrides.burst_seconds is not None else limits.burst_seconds,
    )
    profile = replace(profile, rate_limits=limits)
    if overrides.faults:
        try:
            profile = profile.with_faults(overrides.faults)
        except FaultRatesError as exc:
            raise ProfileError(str(exc)) from None
    if overrides.models:
        profile = profile.with_models(
            {
                name: ModelSpec(name, window, (profile.model(name) or ModelSpec(name, window)).latency)
                for name, window in overrides.models.items()
            }
        )
    if overrides.latency is not None:
        profile = replace(
            profile,
            latency=overrides.latency,
            models=tuple(replace(m, latency=None) for m in profile.models),
        )
    if overrides.outage_seconds is not None:
        profile = replace(profile, outage=OutageWindow(seconds=overrides.outage_seconds))
    if overrides.hang_seconds is not None:
        profile = replace(profile, hang_seconds=overrides.hang_seconds)
    if overrides.slots is not None:
        profile = replace(profile, slots=overrides.slots)
    if overrides.batch_seconds is not None:
        profile = replace(profile, batches=replace(profile.batches, in_progress_seconds=overrides.batch_seconds))
    if overrides.batch_faults:
        try:
            by_number = dict(profile.batches.by_number) | dict(batch_faults_by_number(overrides.batch_faults))
        except BatchSettingsError as exc:
            raise ProfileError(str(exc)) from None
        profile = replace(profile, batches=replace(profile.batches, by_number=tuple(sorted(by_number.items()))))
    return profile
