"""What a failure event keeps of the provider's answer: its body as received (bounded) and its request id.

The export writes an HTTP failure as the provider answered it (status, body, its request id) and keeps a
rejected 200 answer (refusal, cut or off-schema output: it was paid for), so both travel on the failure event.
The body is bounded so the event stays under the producer's record limit beside the request it carries
(:data:`streamproc.core.record_size.CARRIED_BYTES` + :data:`KEPT_BODY_BYTES` + the event's own fields stay
below 1,000,000 bytes). A chat completion over the bound keeps its JSON shape, its text cut: its id, model,
finish reasons and usage (what it cost) stay whole, so the export still shows the provider's answer.
Credentials in the body (an error that echoes the ``Authorization`` header) are redacted
(:mod:`streamproc.core.redact`); the client has already taken out the configured key itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from streamproc.core.redact import redact

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
    """The body as UTF-8 text, whole up to :data:`KEPT_BODY_BYTES`. A longer chat completion keeps its JSON with
    its texts cut (:func:`_cut_completion`); any other longer body is cut as text there. Each cut says its size."""
    text = redact(body.decode("utf-8", "replace"))  # a stray byte becomes U+FFFD: 3 bytes, so measure the text
    encoded = text.encode("utf-8")
    if len(encoded) <= KEPT_BODY_BYTES:
        return text
    completion = _cut_completion(text)
    if completion is not None:
        return completion
    return _cut_text(text, KEPT_BODY_BYTES, len(body))


def _cut_text(text: str, limit: int, size: int) -> str:
    """``text`` cut to ``limit`` bytes of UTF-8 with a note of its full ``size``."""
    note = _note(size)
    encoded = text.encode("utf-8", "replace")
    head = encoded[: max(0, limit - len(note.encode()))].decode("utf-8", "ignore")  # no half character at the cut
    return head + note


def _note(size: int) -> str:
    return f"\u2026 [cut: {size} bytes in all]"


def _cut_completion(text: str) -> str | None:
    """A chat completion within :data:`KEPT_BODY_BYTES`: the string fields of every choice's message share the
    room the rest leaves (the shorter ones whole), ``logprobs`` left out; None for a body that is not a chat
    completion, or whose other parts alone pass the bound (thousands of choices, huge tool calls)."""
    try:
        doc: Any = json.loads(text)
    except (ValueError, RecursionError):
        return None
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        return None
    texts: list[tuple[dict[str, Any], str, str]] = []  # (message, key, its text)
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("logprobs") is not None:
            choice["logprobs"] = None  # many times the size of the text it describes; the text matters more
        message = choice.get("message")
        if isinstance(message, dict):
            texts += [(message, key, value) for key, value in message.items() if isinstance(value, str)]
    for message, key, _ in texts:
        message[key] = ""  # measured without them first
    room = KEPT_BODY_BYTES - _size(_dump(doc))
    if room < 0:
        return None
    texts.sort(key=lambda entry: len(entry[2]))
    for left, (message, key, value) in zip(range(len(texts), 0, -1), texts, strict=True):
        kept = _fitted(value, room // left)
        message[key] = kept
        room -= _json_size(kept)  # its "" was counted already
    return _dump(doc).encode("utf-8", "replace").decode("utf-8")  # a lone surrogate (an escape) as "?"


def _fitted(text: str, room: int) -> str:
    """``text`` whole when its JSON string takes at most ``room`` bytes, else its longest head that does with the
    note of its size (escapes make the JSON longer than the text, so the cut is searched, not computed)."""
    if len(text) <= room and _json_size(text) <= room:  # a character takes a byte at least
        return text
    note = _note(_size(text))
    low, high = 0, min(len(text), room)
    while low < high:
        mid = (low + high + 1) // 2
        if _json_size(text[:mid] + note) <= room:
            low = mid
        else:
            high = mid - 1
    kept = text[:low] + note
    return kept if _json_size(kept) <= room else ""


def _json_size(text: str) -> int:
    """The bytes ``text`` takes as a JSON string, without its quotes."""
    return _size(_dump(text)) - 2


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _size(text: str) -> int:
    return len(text.encode("utf-8", "replace"))
