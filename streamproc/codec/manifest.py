"""Batch manifests: how many requests a batch submitted, kept on a compacted topic keyed by batch id.

``status`` needs the submitted count to say whether a batch converged; the request state only knows the
requests a worker has seen. The manifest is written once the whole file has been sent, so a batch whose
manifest exists was submitted completely. It is small JSON (not Avro) because it is an operations record
that no pipeline component decodes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from streamproc.core.retention import Forgotten
from streamproc.core.tenancy import DEFAULT_PRIORITY, DEFAULT_TENANT, tenancy_of


@dataclass(frozen=True)
class BatchManifest:
    batch_id: str
    submitted: int
    created_ms: int
    source: str  # the input file, for people reading the topic
    invalid_skipped: int = 0
    cancelled_ms: int | None = None  # set by ``streamproc cancel``: requests not called yet end batch_cancelled
    expires_ms: int | None = None  # ``submit --completion-window``: what is not called by then ends batch_expired
    reuse_results: bool = False  # ``submit --reuse-results``: answer inputs that succeeded before from their result
    forgotten: Forgotten | None = None  # ``streamproc forget``: its states are gone, a request of it is refused
    tenant: str = DEFAULT_TENANT  # ``submit --tenant``: of every line that names none (status counts its pending)
    priority: str = DEFAULT_PRIORITY  # ``submit --priority``
    deadline_ms: int | None = None  # ``submit --deadline``: past it a routed model's request goes by a call


def encode_manifest(manifest: BatchManifest) -> bytes:
    return json.dumps(asdict(manifest), separators=(",", ":")).encode()


def decode_manifest(data: bytes) -> BatchManifest:
    """Raises ValueError for anything that is not a manifest (a foreign record on the topic)."""
    fields: Any = json.loads(data)
    if not isinstance(fields, dict):
        raise ValueError("a batch manifest is a JSON object")
    try:
        tenancy = tenancy_of(fields.get("tenant"), fields.get("priority"))  # a manifest before tenants: the default
        return BatchManifest(batch_id=str(fields["batch_id"]), submitted=int(fields["submitted"]),
                             created_ms=int(fields["created_ms"]), source=str(fields.get("source", "")),
                             invalid_skipped=int(fields.get("invalid_skipped", 0)),
                             cancelled_ms=_optional_int(fields.get("cancelled_ms")),
                             expires_ms=_optional_int(fields.get("expires_ms")),
                             reuse_results=fields.get("reuse_results") is True,
                             forgotten=_forgotten(fields.get("forgotten")), tenant=tenancy.tenant,
                             priority=tenancy.priority, deadline_ms=_optional_int(fields.get("deadline_ms")))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a batch manifest: {exc}") from None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _forgotten(value: Any) -> Forgotten | None:
    if value is None:
        return None
    return Forgotten(at_ms=int(value["at_ms"]), finished_ms=int(value["finished_ms"]),
                     succeeded=int(value["succeeded"]),
                     failed={str(layer): int(count) for layer, count in value.get("failed", {}).items()},
                     usage=_usage(value.get("usage", {})), batched_usage=_usage(value.get("batched_usage", {})))


def _usage(value: Any) -> dict[str, tuple[int, int]]:
    return {str(model): (int(prompt), int(completion)) for model, (prompt, completion) in value.items()}
