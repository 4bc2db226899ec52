"""Fault kinds and their deterministic draw from (seed, request content, attempt number).

Pure logic, no I/O. Reproducibility is the point: the same seed and the same request content give the
same fault on the same attempt, so a failing test can be re-run and a retried request can succeed.
Business faults are drawn from the content alone, so an identical retry fails the same way (a real
content-policy refusal does not go away by asking again); every other layer also depends on the attempt.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from streamproc.core.vocabulary import FailureLayer


class FaultKind(StrEnum):
    """Every way the mock can misbehave on purpose; the value is the name used in profiles and headers."""

    # L1 transport
    HANG = "hang"
    RESET = "reset"
    TRUNCATED_BODY = "truncated_body"
    NON_JSON_BODY = "non_json_body"
    STREAM_BREAK = "stream_break"
    # L2 service
    RATE_LIMIT = "rate_limit"
    SERVER_ERROR = "server_error"
    BAD_GATEWAY = "bad_gateway"
    SERVICE_UNAVAILABLE = "service_unavailable"
    GATEWAY_TIMEOUT = "gateway_timeout"
    OVERLOADED = "overloaded"
    # L3 semantic
    EMPTY_CONTENT = "empty_content"
    INVALID_JSON = "invalid_json"
    SCHEMA_MISMATCH = "schema_mismatch"
    LENGTH = "length"
    # L4 business (and the account problem OpenAI reports the same way)
    INVALID_REQUEST = "invalid_request"
    CONTENT_POLICY = "content_policy"
    HUGE_ANSWER = "huge_answer"  # a clean 200 too large for a Kafka record: streamproc's response_too_large
    INSUFFICIENT_QUOTA = "insufficient_quota"

    @property
    def layer(self) -> FailureLayer | None:
        """The failure layer a client should classify this fault into; None for account problems."""
        return _LAYERS[self]

    @property
    def per_content(self) -> bool:
        """True when the draw ignores the attempt number: the same content always gets the same answer."""
        return self in _PER_CONTENT


_LAYERS: dict[FaultKind, FailureLayer | None] = {
    **dict.fromkeys(
        (
            FaultKind.HANG,
            FaultKind.RESET,
            FaultKind.TRUNCATED_BODY,
            FaultKind.NON_JSON_BODY,
            FaultKind.STREAM_BREAK,
        ),
        FailureLayer.TRANSPORT,
    ),
    **dict.fromkeys(
        (
            FaultKind.RATE_LIMIT,
            FaultKind.SERVER_ERROR,
            FaultKind.BAD_GATEWAY,
            FaultKind.SERVICE_UNAVAILABLE,
            FaultKind.GATEWAY_TIMEOUT,
            FaultKind.OVERLOADED,
        ),
        FailureLayer.SERVICE,
    ),
    **dict.fromkeys(
        (FaultKind.EMPTY_CONTENT, FaultKind.INVALID_JSON, FaultKind.SCHEMA_MISMATCH, FaultKind.LENGTH),
        FailureLayer.SEMANTIC,
    ),
    FaultKind.INVALID_REQUEST: FailureLayer.BUSINESS,
    FaultKind.CONTENT_POLICY: FailureLayer.BUSINESS,
    FaultKind.HUGE_ANSWER: FailureLayer.BUSINESS,
    # design §2: quota exhaustion is an account problem that must stop consumption, not a request's layer.
    FaultKind.INSUFFICIENT_QUOTA: None,
}

_PER_CONTENT = frozenset({FaultKind.INVALID_REQUEST, FaultKind.CONTENT_POLICY, FaultKind.HUGE_ANSWER,
                          FaultKind.INSUFFICIENT_QUOTA})


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class RequestTraits:
    """What a request asks for, as far as it decides which faults can show in it."""

    stream: bool = False
    wants_json: bool = False
    has_required_fields: bool = False


def applies(kind: FaultKind, traits: RequestTraits) -> bool:
    """Whether a randomly drawn fault is observable in this request; drawn faults that are not count as clean.

    Invalid JSON in an answer nobody asked to be JSON is no fault, and a broken SSE stream needs a stream.
    """
    if kind is FaultKind.STREAM_BREAK:
        return traits.stream
    if kind is FaultKind.TRUNCATED_BODY:
        return not traits.stream
    if kind is FaultKind.INVALID_JSON:
        return traits.wants_json
    if kind is FaultKind.SCHEMA_MISMATCH:
        return traits.has_required_fields
    return True


@dataclass(slots=True)  # built per request: a frozen dataclass costs ~7x more to construct
class Draws:
    """Uniform numbers in [0, 1) derived from one request; each decision reads its own number."""

    per_content: float
    per_attempt: float
    latency: float


def _seed_bytes(seed: int) -> bytes:
    return seed.to_bytes(16, "big", signed=True)


def draw(seed: int, content_key: bytes, attempt: int) -> Draws:
    """Hash (seed, content, attempt) into the numbers that pick the fault and the latency."""
    base = _seed_bytes(seed) + content_key
    content_digest = hashlib.blake2b(base, digest_size=8).digest()
    attempt_digest = hashlib.blake2b(base + attempt.to_bytes(8, "big"), digest_size=16).digest()
    scale = 2.0**-64
    return Draws(
        per_content=int.from_bytes(content_digest, "big") * scale,
        per_attempt=int.from_bytes(attempt_digest[:8], "big") * scale,
        latency=int.from_bytes(attempt_digest[8:], "big") * scale,
    )


class FaultRatesError(ValueError):
    """Rates that cannot be a probability distribution."""


@dataclass(frozen=True)
class FaultTable:
    """Fault rates turned into cumulative thresholds, built once per profile so a draw is a short scan."""

    per_content: tuple[tuple[float, FaultKind], ...]
    per_attempt: tuple[tuple[float, FaultKind], ...]

    @classmethod
    def from_rates(cls, rates: Mapping[FaultKind, float]) -> FaultTable:
        """Check the rates (each in [0, 1], each group summing to at most 1) and precompute thresholds."""
        for kind, rate in rates.items():
            if not 0.0 <= rate <= 1.0:
                raise FaultRatesError(f"rate of {kind.value} must be within [0, 1], got {rate}")
        content = [(k, r) for k, r in rates.items() if k.per_content and r > 0]
        attempt = [(k, r) for k, r in rates.items() if not k.per_content and r > 0]
        return cls(_cumulative(content, "business"), _cumulative(attempt, "transport/service/semantic"))

    def pick(self, draws: Draws, traits: RequestTraits) -> FaultKind | None:
        """The fault for this request and attempt, or None for a clean answer."""
        kind = _scan(self.per_content, draws.per_content)
        if kind is None:
            kind = _scan(self.per_attempt, draws.per_attempt)
        if kind is None or not applies(kind, traits):
            return None
        return kind

    @property
    def empty(self) -> bool:
        return not self.per_content and not self.per_attempt


def _cumulative(items: Iterable[tuple[FaultKind, float]], group: str) -> tuple[tuple[float, FaultKind], ...]:
    total = 0.0
    out: list[tuple[float, FaultKind]] = []
    for kind, rate in sorted(items, key=lambda item: item[0].value):
        total += rate
        out.append((total, kind))
    if total > 1.0 + 1e-9:
        raise FaultRatesError(f"the {group} fault rates add up to {total:.4f}, more than 1")
    return tuple(out)


def _scan(thresholds: tuple[tuple[float, FaultKind], ...], u: float) -> FaultKind | None:
    for limit, kind in thresholds:
        if u < limit:
            return kind
    return None


# ---- forcing a fault, for exact tests ------------------------------------------------------------------

_DIRECTIVE = re.compile(r"^\s*(?P<kind>[a-z_]+)\s*(?:\*\s*(?P<times>\d+))?\s*$")
_MARKER = re.compile(r"\[mock:(?P<spec>[a-z_]+(?:\*\d+)?)\]")
NO_FAULT = "none"


class ForcedFaultError(ValueError):
    """A fault directive that names no fault kind."""


@dataclass(frozen=True, slots=True)
class ForcedFault:
    """A fault chosen by the client instead of drawn: ``KIND`` (every attempt) or ``KIND*N`` (the first N).

    ``kind`` None (spelled ``none``) forces a clean answer.
    """

    kind: FaultKind | None
    times: int | None = None

    def on_attempt(self, attempt: int) -> FaultKind | None:
        if self.times is not None and attempt >= self.times:
            return None
        return self.kind

    @classmethod
    def parse(cls, spec: str) -> ForcedFault:
        match = _DIRECTIVE.match(spec)
        if match is None:
            raise ForcedFaultError(f"fault directive {spec!r} is not KIND or KIND*N")
        name, times = match["kind"], match["times"]
        if name == NO_FAULT:
            return cls(None)
        try:
            kind = FaultKind(name)
        except ValueError:
            known = ", ".join(k.value for k in FaultKind)
            raise ForcedFaultError(f"unknown fault kind {name!r}; known: {NO_FAULT}, {known}") from None
        return cls(kind, int(times) if times is not None else None)


def find_marker(text: str) -> str | None:
    """The spec of a ``[mock:KIND]`` or ``[mock:KIND*N]`` marker in prompt text, for tests through a pipeline
    that cannot add headers. Returns None when there is none (a substring test first keeps this cheap)."""
    if "[mock:" not in text:
        return None
    match = _MARKER.search(text)
    return match["spec"] if match else None
