"""How the mock's provider batches behave: how long each phase lasts, the providers' size limits, and the
two failures a test forces (expiry after a fraction of the lines, a validation failure).

The profile's ``batches`` key sets them for every batch; the ``x-mock-batch`` header of one create call
(``expire=0.5``, ``invalid``, ``seconds=3``, comma-separated) changes them for that batch alone, as
``x-mock-fault`` does for one call. A client that sends no such header (the pipeline's route) is given the same
per batch by number: ``by_number`` maps the Nth OpenAI batch created to those parts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

MB = 1024 * 1024
BATCH_HEADER = "x-mock-batch"


class BatchSettingsError(ValueError):
    """A ``batches`` profile key or an ``x-mock-batch`` header that does not describe batch settings."""


@dataclass(frozen=True)
class BatchSettings:
    validating_seconds: float = 0.0  # OpenAI's validating phase (Anthropic counts it as in_progress)
    in_progress_seconds: float = 1.0  # lines are answered evenly over this time
    finalizing_seconds: float = 0.0
    cancelling_seconds: float = 0.0
    expire_after: float | None = None  # fraction of the lines answered before the batch expires; None: never
    fail_validation: bool = False  # OpenAI: the batch fails validation; Anthropic: the create call gets a 400
    openai_max_requests: int = 50_000
    openai_max_bytes: int = 200 * MB
    anthropic_max_requests: int = 100_000
    anthropic_max_bytes: int = 256 * MB
    by_number: tuple[tuple[int, str], ...] = ()  # (N, x-mock-batch parts): the Nth OpenAI batch, 1-based

    def for_number(self, number: int, header: str | None) -> BatchSettings:
        """The settings of the ``number``th OpenAI batch (1-based), its create call's header applied last. (Not
        Anthropic's: a create it refuses makes no batch, so its retry would have the same number and be refused
        again.)"""
        settings = self
        for n, parts in self.by_number:
            if n == number:
                settings = apply_batch_header(settings, parts)
        return apply_batch_header(settings, header)


_SECONDS = ("validating_seconds", "in_progress_seconds", "finalizing_seconds", "cancelling_seconds")
_COUNTS = ("openai_max_requests", "openai_max_bytes", "anthropic_max_requests", "anthropic_max_bytes")
KEYS = tuple(f.name for f in fields(BatchSettings))


def batch_settings_from_mapping(value: Any, base: BatchSettings = BatchSettings()) -> BatchSettings:
    """The profile file's ``batches`` mapping on top of ``base``; a mistake names its key."""
    if not isinstance(value, Mapping):
        raise BatchSettingsError(f"batches: a mapping with keys {', '.join(KEYS)} expected")
    unknown = set(value) - set(KEYS)
    if unknown:
        raise BatchSettingsError(f"batches: unknown keys {sorted(unknown)}; known: {', '.join(KEYS)}")
    changes: dict[str, Any] = {}
    for key, given in value.items():
        if key in _SECONDS:
            changes[key] = _seconds(given, f"batches.{key}")
        elif key in _COUNTS:
            if isinstance(given, bool) or not isinstance(given, int) or given <= 0:
                raise BatchSettingsError(f"batches.{key}: a positive integer expected, got {given!r}")
            changes[key] = given
        elif key == "by_number":
            changes[key] = batch_faults_by_number(given)
        elif key == "expire_after":
            changes[key] = None if given is None else _fraction(given, "batches.expire_after")
        else:  # fail_validation
            if not isinstance(given, bool):
                raise BatchSettingsError(f"batches.{key}: true or false expected, got {given!r}")
            changes[key] = given
    return replace(base, **changes)


def batch_faults_by_number(value: Any) -> tuple[tuple[int, str], ...]:
    """``{3: "expire=0.5", 5: "invalid"}`` (profile key ``batches.by_number``, or ``--batch-fault N:PARTS``)
    checked: positive batch numbers, each mapped to ``x-mock-batch`` parts."""
    if not isinstance(value, Mapping):
        raise BatchSettingsError("batches.by_number: a mapping of batch number to x-mock-batch parts expected")
    checked: list[tuple[int, str]] = []
    for number, parts in value.items():
        if isinstance(number, bool) or not isinstance(number, int) or number <= 0 or not isinstance(parts, str):
            raise BatchSettingsError(f"batches.by_number: a batch number >= 1 and its parts expected, "
                                     f"got {number!r}: {parts!r}")
        apply_batch_header(BatchSettings(), parts)  # a mistake shows at start, not at the Nth create
        checked.append((number, parts))
    return tuple(sorted(checked))


def apply_batch_header(settings: BatchSettings, header: str | None) -> BatchSettings:
    """``x-mock-batch: expire=0.5,seconds=2`` or ``invalid``: this batch's settings."""
    if header is None or not header.strip():
        return settings
    for part in header.split(","):
        name, _, raw = part.strip().partition("=")
        if name == "invalid" and not raw:
            settings = replace(settings, fail_validation=True)
        elif name == "expire":
            settings = replace(settings, expire_after=_fraction(_float(raw, BATCH_HEADER), f"{BATCH_HEADER} expire"))
        elif name == "seconds":
            settings = replace(settings, in_progress_seconds=_seconds(_float(raw, BATCH_HEADER), BATCH_HEADER))
        else:
            raise BatchSettingsError(
                f"{BATCH_HEADER}: unknown part {part.strip()!r}; expected expire=F (0..1), seconds=S or invalid"
            )
    return settings


def _float(raw: str, where: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise BatchSettingsError(f"{where}: a number expected, got {raw!r}") from None


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise BatchSettingsError(f"{key}: a finite number of seconds >= 0 expected, got {value!r}")
    return float(value)


def _fraction(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise BatchSettingsError(f"{key}: a fraction in [0, 1) of the lines answered before expiry expected, "
                                 f"got {value!r}")
    return float(value)
