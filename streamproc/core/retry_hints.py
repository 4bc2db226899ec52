"""The server's "not before" hint for a retry, from headers or message text (see :mod:`streamproc.core.verdict`)."""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from typing import Final

from streamproc.core.durations import GO_UNITS, ceil_ms, parse_duration_ms, parse_seconds

_WORD_UNIT_MS: Final[Mapping[str, float]] = {
    "millisecond": 1,
    "milliseconds": 1,
    "second": 1_000,
    "seconds": 1_000,
    "sec": 1_000,
    "secs": 1_000,
    "minute": 60_000,
    "minutes": 60_000,
    "min": 60_000,
    "mins": 60_000,
}
_HINT_TEXT: Final = re.compile(
    rf"(?:try again|retry)\s+(?:in|after)\s+"
    rf"(?P<duration>\d+(?:\.\d+)?(?:(?:{GO_UNITS})(?:\d+(?:\.\d+)?(?:{GO_UNITS}))*)?)"
    r"(?:\s*(?P<word>milliseconds?|seconds?|secs?|minutes?|mins?)\b)?",
    re.IGNORECASE,
)


def retry_after_ms(headers: Mapping[str, str], message: str = "") -> int | None:
    """The server's "not before" hint in ms, or None; the first present wins (see the module docstring)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    explicit = parse_seconds(lowered.get("retry-after-ms"))
    if explicit is not None:
        return ceil_ms(explicit)
    retry_after = lowered.get("retry-after")
    if retry_after is not None:
        seconds = parse_seconds(retry_after)
        if seconds is not None:
            return ceil_ms(seconds * 1000)
        dated = _http_date_delta_ms(retry_after, lowered.get("date"))
        if dated is not None:
            return dated
    from_text = _hint_from_text(message)
    if from_text is not None:
        return from_text
    resets = [
        parse_duration_ms(reset)
        for limit in ("requests", "tokens")
        if (reset := lowered.get(f"x-ratelimit-reset-{limit}")) is not None
        and lowered.get(f"x-ratelimit-remaining-{limit}", "").strip() == "0"
    ]
    known = [r for r in resets if r is not None]
    return max(known) if known else None

def _hint_from_text(message: str) -> int | None:
    match = _HINT_TEXT.search(message)
    if match is None:
        return None
    word = match.group("word")
    duration = match.group("duration")
    if word is not None and parse_seconds(duration) is not None:
        return ceil_ms(float(duration) * _WORD_UNIT_MS[word.lower()])
    return parse_duration_ms(duration)


def _http_date_delta_ms(value: str, date_header: str | None) -> int | None:
    if date_header is None:
        return None
    try:
        target = email.utils.parsedate_to_datetime(value)
        now = email.utils.parsedate_to_datetime(date_header)
    except (TypeError, ValueError):
        return None
    return max(0, ceil_ms((target - now).total_seconds() * 1000))
