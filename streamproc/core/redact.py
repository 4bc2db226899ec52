"""Credentials taken out of text before it is logged or written to a record, an export or the database.

A provider's error body can echo the request's ``Authorization`` header, an exception can name a URL with a
password in it, and either ends up in a failure event's message or body: everything that carries such text
goes through :func:`redact` first. It over-redacts rather than under-redacts: a header value is replaced up to
the end of its line or JSON string.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

REDACTED: Final = "[REDACTED]"
MIN_SECRET_CHARS: Final = 4  # a shorter configured secret would redact ordinary words and numbers

_URL_CREDENTIALS: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@\"'<>]+@")
# header-like names followed by ':' or '=' (also as JSON or Python dict keys), then the value up to the end of
# its string or line
_HEADER_VALUE: Final = re.compile(
    r"""(?ix)
    ( \b(?:proxy-)?authorization | \b(?:x-)?api[-_]key )
    ( ["']? \s* [:=] \s* ["']? )
    ( [^"'\r\n,}]+ )
    """
)
_BEARER: Final = re.compile(r"(?i)\b(bearer)\s+(?!\[REDACTED\])[^\s\"',;}]+")
_SK_KEY: Final = re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{8,}")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with the configured ``secrets``, ``Bearer`` tokens, ``sk-`` keys, ``Authorization`` /
    ``api-key`` header values and the credentials of URLs replaced by ``[REDACTED]``."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _URL_CREDENTIALS.sub(rf"\1{REDACTED}@", text)
    text = _BEARER.sub(rf"\1 {REDACTED}", text)
    text = _SK_KEY.sub(REDACTED, text)
    return _HEADER_VALUE.sub(rf"\1\2{REDACTED}", text)


def redact_bytes(body: bytes, secrets: Iterable[str] = ()) -> bytes:
    """:func:`redact` of a body; the body itself when nothing in it needed redacting (bytes not UTF-8 kept)."""
    text = body.decode("utf-8", "surrogateescape")
    redacted = redact(text, secrets)
    return body if redacted == text else redacted.encode("utf-8", "surrogateescape")
