"""Exceptions raised by httpx while calling the LLM: always transport, each with its own code."""

from __future__ import annotations

import socket
import ssl

import httpx
import pytest

from streamproc.core.retry_hints import retry_after_ms
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.transport_errors import classify_exception

T = FailureLayer.TRANSPORT


def test_retry_after_ms_reads_httpx_headers() -> None:
    assert retry_after_ms(httpx.Headers({"Retry-After-Ms": "75"})) == 75



# --- exceptions ------------------------------------------------------------------------------------------


def chained(exc: BaseException, *causes: BaseException) -> BaseException:
    """``exc`` raised from ``causes[0]``, itself raised from ``causes[1]``..., as httpx → httpcore → OS does."""
    current = exc
    for cause in causes:
        current.__cause__ = cause
        current = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (httpx.ConnectTimeout("timed out"), "connect_timeout"),
        (httpx.ReadTimeout("timed out"), "read_timeout"),
        (httpx.WriteTimeout("timed out"), "write_timeout"),
        (httpx.PoolTimeout("no connection"), "pool_timeout"),
        (TimeoutError(), "timeout"),
        (
            chained(
                httpx.ConnectError("[Errno -2] Name or service not known"),
                OSError("httpcore"),
                socket.gaierror(-2, "Name or service not known"),
            ),
            "dns_error",
        ),
        (
            chained(httpx.ConnectError("[Errno 111] Connection refused"), ConnectionRefusedError(111, "refused")),
            "connection_refused",
        ),
        (chained(httpx.ConnectError("handshake"), ssl.SSLCertVerificationError("bad cert")), "tls_error"),
        (chained(httpx.ReadError("tls"), ssl.SSLError("decryption failed")), "tls_error"),
        (httpx.ConnectError("no route"), "connect_error"),
        (chained(httpx.ReadError("reset"), ConnectionResetError(104, "reset by peer")), "connection_reset"),
        (httpx.WriteError("broken pipe"), "connection_reset"),
        (ConnectionResetError(104, "Connection reset by peer"), "connection_reset"),
        (httpx.RemoteProtocolError("Server disconnected without sending a response."), "server_disconnected"),
        (
            httpx.RemoteProtocolError("peer closed connection without sending complete message body"),
            "server_disconnected",
        ),
        (httpx.RemoteProtocolError("illegal header line"), "protocol_error"),
        (httpx.LocalProtocolError("bad request line"), "protocol_error"),
        (httpx.ProxyError("proxy said no"), "proxy_error"),
        (
            httpx.UnsupportedProtocol("Request URL is missing an 'http://' or 'https://' protocol."),
            "unsupported_protocol",
        ),
        (httpx.DecodingError("gzip"), "invalid_response_body"),
        (httpx.TooManyRedirects("loop"), "too_many_redirects"),
        (OSError("network is unreachable"), "transport_error"),
        (RuntimeError("bug"), "unexpected_error"),
    ],
    ids=lambda value: value if isinstance(value, str) else type(value).__name__,
)
def test_exceptions_are_transport_with_distinct_codes(exc: BaseException, code: str) -> None:
    failure = classify_exception(exc)
    assert (failure.layer, failure.code, failure.http_status) == (T, code, None)
    assert failure.message.startswith(type(exc).__name__)


def test_real_httpx_dns_failure() -> None:
    def resolve_nothing(request: httpx.Request) -> httpx.Response:
        raise chained(
            httpx.ConnectError("[Errno -2] Name or service not known", request=request),
            socket.gaierror(-2, "Name or service not known"),
        )

    client = httpx.Client(transport=httpx.MockTransport(resolve_nothing))
    with client, pytest.raises(httpx.ConnectError) as caught:
        client.post("http://llm.invalid/v1/chat/completions", json={"model": "m", "messages": []})
    assert classify_exception(caught.value).code == "dns_error"
