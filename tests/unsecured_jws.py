"""Unsigned JWS tokens (``alg: none``), as Kafka's unsecured OAUTHBEARER validator accepts them: a local
stand-in for an identity provider's tokens in the tests."""

from __future__ import annotations

import base64
import json
import time


def unsecured_jws(subject: str, lifetime_s: int = 3600, exp: float | None = None) -> str:
    """A token for ``subject`` that expires ``lifetime_s`` from now (or at ``exp``, epoch seconds)."""
    def part(claims: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()

    now = int(time.time())
    expires = exp if exp is not None else now + lifetime_s
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': now, 'exp': expires})}."
