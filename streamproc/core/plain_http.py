"""Whether a base URL would carry the LLM key in clear text over a network: plain ``http://`` to a host that is
not this machine. Loopback (127.0.0.0/8, ::1, ``localhost``) stays allowed: the local stack, the mock LLM and
the tests call 127.0.0.1."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (an IPv4-mapped IPv6 one included)."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def plain_http_host(base_url: str) -> str | None:
    """The host a plain ``http://`` base URL would send the key to in clear text; None for ``https://``, for
    loopback, and for what is not an http URL at all (the client refuses those itself)."""
    parts = urlsplit(base_url.strip())
    if parts.scheme.lower() != "http":
        return None
    try:
        host = parts.hostname or ""
    except ValueError:
        return None
    return None if is_loopback_host(host) else host
