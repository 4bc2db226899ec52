"""What a failure event keeps of the provider's answer: its body as received (bounded) and its request id.

The export writes an HTTP failure as the provider answered it (status, body, its request id) and keeps a
rejected 200 answer (refusal, cut or off-schema output: it was paid for), so both travel on the failure event.
The body is bounded so the event stays under the producer's record limit beside the request it carries
(:data:`streamproc.core.record_size.CARRIED_BYTES` + :data:`KEPT_BODY_BYTES` + the event's own fields stay
below 1,000,000 bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

KEPT_BODY_BYTES: Final = 131_072
# OpenAI (and vLLM, Azure, most gateways) name their id for a call x-request-id; Anthropic names it request-id
REQUEST_ID_HEADERS: Final = ("x-request-id", "request-id")


def provider_request_id(headers: Mapping[str, str]) -> str | None:
    """The provider's own id for the call, from its response headers; None when it sent none (never made up)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    for name in REQUEST_ID_HEADERS:
        value = lowered.get(name, "").strip()
        if value:
            return value
    return None


def kept_body(body: bytes) -> str:
    """The body as UTF-8 text, whole up to :data:`KEPT_BODY_BYTES`; a longer one is cut there and says so."""
    text = body.decode("utf-8", "replace")  # a stray byte becomes U+FFFD: 3 bytes, so measure the text
    encoded = text.encode("utf-8")
    if len(encoded) <= KEPT_BODY_BYTES:
        return text
    note = f"\u2026 [cut: {len(body)} bytes in all]"
    head = encoded[: KEPT_BODY_BYTES - len(note.encode())].decode("utf-8", "ignore")  # no half character at the cut
    return head + note
