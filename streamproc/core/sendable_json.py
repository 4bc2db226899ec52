"""JSON as it can go on the wire: what ``json.loads`` accepts but no JSON sender writes is refused.

Python's parser reads ``NaN``/``Infinity`` and turns ``1e400`` into infinity; httpx then refuses to send such
a body, so a request holding one could never be called. Submit (at the line) and the worker (before a call)
read bodies with the same rules here.
"""

from __future__ import annotations

import json
import math
from typing import Any


class NotSendable(ValueError):
    """Valid to Python's parser, but not JSON a sender could write (or nested deeper than it follows)."""


def loads_sendable(text: str) -> Any:
    """``json.loads``, refusing non-finite numbers and nesting too deep with :class:`NotSendable`; malformed
    text raises ``json.JSONDecodeError`` as usual."""
    if text.startswith("\ufeff"):  # as json.loads says it
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise NotSendable("nested too deeply") from None


def _not_json(name: str) -> Any:
    raise NotSendable(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotSendable(f"the number {text[:40]} is too large for a float")
    return value


# built once: json.loads with hooks builds a decoder per call, which costs more than the parse itself
_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)
