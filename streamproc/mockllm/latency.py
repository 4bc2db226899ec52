"""Latency distributions: fixed, uniform, or lognormal given by its median and 99th percentile.

A distribution maps a uniform number in [0, 1) to seconds (inverse CDF), so the latency of a request is as
reproducible as its fault: the number comes from the same deterministic draw.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

_Z99 = NormalDist().inv_cdf(0.99)


class LatencyError(ValueError):
    """A latency description that is not one of the three forms."""


@dataclass(frozen=True, slots=True)
class FixedLatency:
    seconds: float = 0.0

    def sample(self, u: float) -> float:
        return self.seconds

    def describe(self) -> str:
        return f"fixed {self.seconds:g}s"


@dataclass(frozen=True, slots=True)
class UniformLatency:
    low: float
    high: float

    def sample(self, u: float) -> float:
        return self.low + (self.high - self.low) * u

    def describe(self) -> str:
        return f"uniform {self.low:g}-{self.high:g}s"


@dataclass(frozen=True, slots=True)
class LognormalLatency:
    """Heavy-tailed like real LLM latency; p50 and p99 are what people know about their provider."""

    p50: float
    p99: float

    def sample(self, u: float) -> float:
        mu = math.log(self.p50)
        sigma = (math.log(self.p99) - mu) / _Z99
        clamped = min(max(u, 1e-12), 1.0 - 1e-12)
        return math.exp(mu + sigma * NormalDist().inv_cdf(clamped))

    def describe(self) -> str:
        return f"lognormal p50={self.p50:g}s p99={self.p99:g}s"


Latency = FixedLatency | UniformLatency | LognormalLatency

NO_LATENCY = FixedLatency(0.0)


def _check(latency: Latency) -> Latency:
    if isinstance(latency, FixedLatency):
        if latency.seconds < 0:
            raise LatencyError("a fixed latency cannot be negative")
    elif isinstance(latency, UniformLatency):
        if not 0 <= latency.low <= latency.high:
            raise LatencyError("a uniform latency needs 0 <= low <= high")
    elif not 0 < latency.p50 <= latency.p99:
        raise LatencyError("a lognormal latency needs 0 < p50 <= p99")
    return latency


def parse_latency_spec(spec: str) -> Latency:
    """Read the command-line form: ``0.2`` (fixed), ``uniform:0.1:0.5`` or ``lognormal:0.4:3``."""
    parts = spec.strip().split(":")
    try:
        if len(parts) == 1:
            return _check(FixedLatency(float(parts[0])))
        kind, *numbers = parts
        values = [float(n) for n in numbers]
    except ValueError:
        raise LatencyError(f"latency {spec!r}: numbers expected") from None
    if kind == "fixed" and len(values) == 1:
        return _check(FixedLatency(values[0]))
    if kind == "uniform" and len(values) == 2:
        return _check(UniformLatency(values[0], values[1]))
    if kind == "lognormal" and len(values) == 2:
        return _check(LognormalLatency(values[0], values[1]))
    raise LatencyError(f"latency {spec!r} is not SECONDS, fixed:S, uniform:LOW:HIGH or lognormal:P50:P99")


def latency_from_config(value: Any) -> Latency:
    """Read the profile-file form: a number of seconds, a spec string, or a mapping with ``kind``."""
    if isinstance(value, bool):
        raise LatencyError("latency must be a number, a string or a mapping")
    if isinstance(value, int | float):
        return _check(FixedLatency(float(value)))
    if isinstance(value, str):
        return parse_latency_spec(value)
    if not isinstance(value, Mapping):
        raise LatencyError("latency must be a number, a string or a mapping")
    fields = dict(value)
    kind = fields.pop("kind", "fixed")
    expected = {"fixed": {"seconds"}, "uniform": {"low", "high"}, "lognormal": {"p50", "p99"}}.get(kind)
    if expected is None:
        raise LatencyError(f"latency kind {kind!r} is not fixed, uniform or lognormal")
    if set(fields) != expected:
        raise LatencyError(f"a {kind} latency takes exactly {sorted(expected)}, got {sorted(fields)}")
    try:
        numbers = {k: float(v) for k, v in fields.items()}
    except (TypeError, ValueError):
        raise LatencyError(f"latency {dict(value)!r}: numbers expected") from None
    if kind == "fixed":
        return _check(FixedLatency(numbers["seconds"]))
    if kind == "uniform":
        return _check(UniformLatency(numbers["low"], numbers["high"]))
    return _check(LognormalLatency(numbers["p50"], numbers["p99"]))
