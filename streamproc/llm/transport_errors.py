"""Exceptions raised while calling the LLM, classified: always transport, since nothing came back to judge.

The client runs on aiohttp or on httpx (``STREAMPROC_LLM_HTTP``): the same failure gets the same code from
either. An aiohttp exception anywhere in the chain decides (libraries that wrap aiohttp in httpx's types, as
httpx-aiohttp does, wrap some wrongly: a refused connection as ``ConnectTimeout``).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterable, Iterator

import aiohttp
import httpx

from streamproc.core.outcome import Failure, truncate
from streamproc.core.redact import redact
from streamproc.core.vocabulary import FailureLayer


def classify_exception(exc: BaseException, secrets: Iterable[str] = ()) -> Failure:
    """Classify an exception raised while calling the LLM; always transport (nothing came back to judge). Its
    text is redacted (core.redact): an exception can name the URL, with its credentials, or a header."""
    text = redact(str(exc), secrets)
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return Failure(FailureLayer.TRANSPORT, _exception_code(exc), truncate(message))


def _exception_code(exc: BaseException) -> str:
    chain = list(_causes(exc))
    from_aiohttp = next((e for e in chain if isinstance(e, aiohttp.ClientError)), None)
    if from_aiohttp is not None:
        return _aiohttp_code(from_aiohttp)
    timeouts: tuple[tuple[type[BaseException], str], ...] = (
        (httpx.ConnectTimeout, "connect_timeout"),
        (httpx.ReadTimeout, "read_timeout"),
        (httpx.WriteTimeout, "write_timeout"),
        (httpx.PoolTimeout, "pool_timeout"),
        (httpx.TimeoutException, "timeout"),
        (TimeoutError, "timeout"),
    )
    for exc_type, code in timeouts:
        if isinstance(exc, exc_type):
            return code
    if any(isinstance(e, ssl.SSLError) for e in chain):
        return "tls_error"
    if isinstance(exc, httpx.ConnectError):
        return _connect_code(chain)
    if isinstance(exc, httpx.RemoteProtocolError):
        lowered = str(exc).lower()
        return "server_disconnected" if "disconnected" in lowered or "closed" in lowered else "protocol_error"
    by_type: tuple[tuple[type[BaseException], str], ...] = (
        (httpx.ProtocolError, "protocol_error"),
        (httpx.NetworkError, "connection_reset"),
        (ConnectionError, "connection_reset"),
        (httpx.ProxyError, "proxy_error"),
        (httpx.UnsupportedProtocol, "unsupported_protocol"),
        (httpx.DecodingError, "invalid_response_body"),
        (httpx.TooManyRedirects, "too_many_redirects"),
        (httpx.TransportError, "transport_error"),
        (OSError, "transport_error"),
    )
    for exc_type, code in by_type:
        if isinstance(exc, exc_type):
            return code
    return "unexpected_error"


def _connect_code(chain: list[BaseException]) -> str:
    """A connection that could not be made: the OS error in the chain says why."""
    if any(isinstance(e, socket.gaierror) for e in chain):
        return "dns_error"
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return "connection_refused"
    return "connect_error"


def _aiohttp_code(exc: aiohttp.ClientError) -> str:
    """The code httpx's own transport gives the same failure (subclasses before their bases)."""
    if isinstance(exc, aiohttp.ClientConnectorError) and not isinstance(exc, aiohttp.ClientProxyConnectionError):
        chain = [*_causes(exc), exc.os_error]
        return "tls_error" if isinstance(exc, aiohttp.ClientSSLError) else _connect_code(chain)
    if isinstance(exc, aiohttp.ClientPayloadError):
        text = str(exc)
        if "content-encoding" in text:
            return "invalid_response_body"
        return "server_disconnected" if "not completed" in text else "protocol_error"  # ended early or malformed
    by_type: tuple[tuple[type[BaseException], str], ...] = (
        (aiohttp.ConnectionTimeoutError, "connect_timeout"),
        (aiohttp.SocketTimeoutError, "read_timeout"),
        (aiohttp.ServerTimeoutError, "timeout"),
        (aiohttp.ClientProxyConnectionError, "proxy_error"),
        (aiohttp.ClientHttpProxyError, "proxy_error"),
        (aiohttp.ServerDisconnectedError, "server_disconnected"),
        (aiohttp.ClientOSError, "connection_reset"),
        (aiohttp.ClientResponseError, "protocol_error"),  # a response aiohttp's parser refused
        (aiohttp.InvalidURL, "unsupported_protocol"),
        (aiohttp.NonHttpUrlClientError, "unsupported_protocol"),
    )
    return next((code for exc_type, code in by_type if isinstance(exc, exc_type)), "transport_error")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it wraps: httpx → httpcore → the OS error that says DNS, refused or TLS."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
