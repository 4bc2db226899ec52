"""Durations as providers and settings write them: Go durations (``6m0s``), suffixed (``500ms``) or bare seconds."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Final

HOUR_MS: Final = 3_600_000
HOURS_KEPT: Final = 7 * 24
"""The clock hours a count of arrivals and ends per hour keeps (``status --stream --hours`` shows at most these);
here, not beside the counts in core.batch_summary, so that the CLI checks ``--hours`` without loading them."""

GO_UNITS: Final = "ms|us|\u00b5s|ns|h|m|s"  # alternation order matters: "ms" before "m" and "s"
_GO_DURATION: Final = re.compile(rf"(\d+(?:\.\d+)?)({GO_UNITS})")
_UNIT_MS: Final[Mapping[str, float]] = {
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
    "ms": 1,
    "us": 1e-3,
    "\u00b5s": 1e-3,
    "ns": 1e-6,
}

def parse_duration_ms(text: str) -> int | None:
    """Parse ``1s``, ``6m0s``, ``20ms``, ``1.5s``, ``1h2m3s`` (Go durations) or bare seconds; else None."""
    text = text.strip()
    seconds = parse_seconds(text)
    if seconds is not None:
        return ceil_ms(seconds * 1000)
    total, end = 0.0, 0
    for match in _GO_DURATION.finditer(text):
        if match.start() != end:
            return None
        total += float(match.group(1)) * _UNIT_MS[match.group(2)]
        end = match.end()
    return ceil_ms(total) if end and end == len(text) else None

def format_duration(seconds: float | None) -> str:
    """For people: ``-`` (unknown), ``0s``, ``42s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    if seconds is None or math.isnan(seconds):
        return "-"
    total = math.ceil(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h{total % 3600 // 60:02d}m"
    return f"{total // 86400}d{total % 86400 // 3600:02d}h"


def parse_number(value: str | None) -> float | None:
    """A finite number written as text (a header value), or None for anything else."""
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def parse_seconds(value: str | None) -> float | None:
    """A finite, non-negative number of seconds, or None."""
    number = parse_number(value)
    return number if number is not None and number >= 0 else None


_LONGEST_MS = 10**15  # about 31,700 years: any longer hint (up to infinity after scaling) is this long


def ceil_ms(ms: float) -> int:
    """Round up (a hint is a "not before"), but 1.1 s is 1100 ms, not 1101 ms through float noise; a hint
    too long to be meant (``retry-after: 1e306`` overflows to infinity in milliseconds) is capped."""
    return math.ceil(min(ms, _LONGEST_MS) - 1e-6)
