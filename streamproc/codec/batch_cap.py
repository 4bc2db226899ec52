"""A batch's spend cap (design §5.9), on the manifests topic beside its manifest, and on each of its requests.

``submit --max-cost-usd/--max-tokens`` writes it before the batch's first request, and ``raise-cap`` writes it
again; the topic is compacted, so the latest cap of a batch is the one kept. Its key is ``<batch id>/cap``:
a batch id holds no ``/``, so it never meets a manifest's key, and a manifest reader skips the record (no
``submitted`` field). Each request record also carries the cap it was submitted with (``x-spend-cap``), so a
worker that has not read the record yet still holds the batch to it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

from streamproc.core.identity import SEPARATOR
from streamproc.core.spend_cap import Cap

SPEND_CAP_HEADER: Final = "x-spend-cap"
KIND: Final = "spend_cap"


@dataclass(frozen=True)
class BatchCap:
    batch_id: str
    cap: Cap
    set_ms: int  # when submit or raise-cap wrote it


def cap_key(batch_id: str) -> bytes:
    return f"{batch_id}{SEPARATOR}cap".encode()


def encode_cap(cap: Cap) -> bytes:
    """The cap alone, as the request header carries it."""
    return json.dumps(_cap_fields(cap), separators=(",", ":")).encode()


def decode_cap(data: bytes) -> Cap:
    """Raises ValueError for anything that is not a cap."""
    try:
        fields: Any = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"a spend cap is JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise ValueError("a spend cap is a JSON object")
    cost, tokens = fields.get("max_cost_usd"), fields.get("max_tokens")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float)
                             or not math.isfinite(cost) or cost < 0):
        raise ValueError(f"max_cost_usd must be a number >= 0, got {cost!r}")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
        raise ValueError(f"max_tokens must be an integer >= 0, got {tokens!r}")
    return Cap(None if cost is None else float(cost), tokens)


def encode_batch_cap(batch_cap: BatchCap) -> bytes:
    fields = {"kind": KIND, "batch_id": batch_cap.batch_id, **_cap_fields(batch_cap.cap), "set_ms": batch_cap.set_ms}
    return json.dumps(fields, separators=(",", ":")).encode()


def decode_batch_cap(data: bytes) -> BatchCap:
    """Raises ValueError for any other record of the manifests topic (a manifest, a foreign record)."""
    try:
        fields: Any = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"a batch cap is JSON: {exc}") from None
    if not isinstance(fields, dict) or fields.get("kind") != KIND:
        raise ValueError("not a batch's spend cap")
    set_ms = fields.get("set_ms", 0)
    if isinstance(set_ms, bool) or not isinstance(set_ms, int):
        raise ValueError(f"set_ms must be an integer, got {set_ms!r}")
    return BatchCap(str(fields.get("batch_id", "")), decode_cap(data), set_ms)


def _cap_fields(cap: Cap) -> dict[str, float | int | None]:
    return {"max_cost_usd": cap.max_cost_usd, "max_tokens": cap.max_tokens}
