"""The identity of a request's content: the key that counts attempts, keys the stats, and seeds the answer.

Two requests are "the same" when their JSON bodies are equal as JSON (key order and whitespace do not
matter), so a client that retries with a re-serialised body is still seen retrying.
"""

from __future__ import annotations

import hashlib
from typing import Any

from streamproc.mockllm.jsonfast import dumps_canonical

KEY_BYTES = 16
FINGERPRINT_CHARS = 12


def request_key(body: Any) -> bytes:
    """The content key of a parsed JSON body."""
    canonical = dumps_canonical(body)  # ASCII: non-ASCII and lone surrogates come out as \u escapes
    return hashlib.blake2b(canonical.encode(), digest_size=KEY_BYTES).digest()


def raw_key(body: bytes) -> bytes:
    """The content key of a body that is not JSON: its bytes."""
    return hashlib.blake2b(body, digest_size=KEY_BYTES).digest()


def fingerprint(key: bytes) -> str:
    """The short hex form shown in answers and ids, so a result can be matched to its request."""
    return key.hex()[:FINGERPRINT_CHARS]


def request_fingerprint(body: Any) -> str:
    """What a test computes from the body it sent to check that an answer belongs to it."""
    return fingerprint(request_key(body))
