"""How the mock's provider batches behave: how long each phase lasts, the providers' size limits, and the
two failures a test forces (expiry after a fraction of the lines, a validation failure).

The profile's ``batches`` key sets them for every batch; the ``x-mock-batch`` header of one create call
(``expire=0.5``, ``invalid``, ``seconds=3``, comma-separated) changes them for that batch alone, as
``x-mock-fault`` does for one call.
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
        elif key == "expire_after":
            changes[key] = None if given is None else _fraction(given, "batches.expire_after")
        else:  # fail_validation
            if not isinstance(given, bool):
                raise BatchSettingsError(f"batches.{key}: true or false expected, got {given!r}")
            changes[key] = given
    return replace(base, **changes)


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
