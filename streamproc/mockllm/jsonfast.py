"""The standard library's C JSON encoder and scanner, set up once instead of on every call.

``json.loads`` / ``json.dumps`` rebuild their C helpers and run regexes per call, which is a measurable
share of the mock's per-request cost; the results here are byte-for-byte those of ``json``.
"""

from __future__ import annotations

import json
from json.encoder import c_make_encoder, encode_basestring, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

_scan_once = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner, set up once


def _unserializable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


if c_make_encoder is not None:
    # (markers, default, string encoder, indent, key separator, item separator, sort_keys, skipkeys, allow_nan)
    _canonical = c_make_encoder(None, _unserializable, encode_basestring_ascii, None, ":", ",", True, False, True)
    _compact = c_make_encoder(None, _unserializable, encode_basestring, None, ":", ",", False, False, True)
else:  # an interpreter without the C accelerator: same output, slower
    _canonical_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
    _compact_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

    def _canonical(value: Any, level: int) -> list[str]:
        return [_canonical_encoder.encode(value)]

    def _compact(value: Any, level: int) -> list[str]:
        return [_compact_encoder.encode(value)]


def loads(text: str) -> Any:
    """``json.loads`` of a str; any malformed input raises ValueError."""
    start = 0
    if text[:1].isspace():
        start = len(text) - len(text.lstrip())
    try:
        value, end = _scan_once(text, start)
    except StopIteration:
        raise ValueError("expecting a JSON value") from None
    if end != len(text) and not text[end:].isspace():
        raise ValueError(f"extra data after the JSON value at char {end}")
    return value


def dumps_canonical(value: Any) -> str:
    """Sorted keys, no spaces, ASCII only: equal JSON values give equal text."""
    return "".join(_canonical(value, 0))


def dumps_compact(value: Any) -> str:
    """No spaces, UTF-8 kept as is: the form answers are sent in."""
    return "".join(_compact(value, 0))
