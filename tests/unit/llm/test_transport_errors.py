"""Exceptions raised by httpx (and aiohttp under it) while calling the LLM: always transport, each with its own code."""

from __future__ import annotations

import socket
import ssl

import aiohttp
import httpx
import pytest
from aiohttp.client_reqrep import ConnectionKey
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

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


# --- aiohttp's exceptions (STREAMPROC_LLM_HTTP=aiohttp) -------------------------------------------------------------

_KEY = ConnectionKey("llm.test", 443, True, True, None, None, None, None)
_URL = URL("https://llm.test/v1/chat/completions")
_INFO = aiohttp.RequestInfo(_URL, "POST", CIMultiDictProxy(CIMultiDict()), _URL)


def from_aiohttp(wrapper: type[httpx.HTTPError], exc: BaseException) -> BaseException:
    """httpx-aiohttp's ``raise mapped(str(exc)) from exc``, which maps some wrongly (a hung-up server or a
    refused connection become ConnectTimeout): aiohttp's exception in the chain decides."""
    return chained(wrapper(str(exc)), exc)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (from_aiohttp(httpx.ConnectTimeout, aiohttp.ServerDisconnectedError()), "server_disconnected"),
        (from_aiohttp(httpx.ConnectTimeout, aiohttp.ClientConnectorError(_KEY, ConnectionRefusedError(111, "refused"))),
         "connection_refused"),
        (aiohttp.ClientConnectorError(_KEY, socket.gaierror(-2, "Name or service not known")), "dns_error"),
        (aiohttp.ClientConnectorError(_KEY, OSError(113, "no route")), "connect_error"),
        (aiohttp.ClientConnectorCertificateError(_KEY, ssl.SSLCertVerificationError("bad cert")), "tls_error"),
        (aiohttp.ClientConnectorSSLError(_KEY, ssl.SSLError("wrong version")), "tls_error"),
        (aiohttp.ConnectionTimeoutError("Connection timeout to host"), "connect_timeout"),
        (aiohttp.SocketTimeoutError("Timeout on reading data from socket"), "read_timeout"),
        (aiohttp.ServerTimeoutError("timeout"), "timeout"),
        (aiohttp.ClientPayloadError("Response payload is not completed"), "server_disconnected"),
        (aiohttp.ClientPayloadError("invalid chunk size"), "protocol_error"),
        (aiohttp.ClientPayloadError("400, message:\n  Can not decode content-encoding: gzip"), "invalid_response_body"),
        (aiohttp.ClientResponseError(_INFO, (), status=400, message="Invalid status line"), "protocol_error"),
        (aiohttp.ClientProxyConnectionError(_KEY, OSError(111, "refused")), "proxy_error"),
        (aiohttp.ClientHttpProxyError(_INFO, (), status=407), "proxy_error"),
        (aiohttp.ClientOSError(104, "Connection reset by peer"), "connection_reset"),
        (aiohttp.NonHttpUrlClientError("ftp://llm.test"), "unsupported_protocol"),
        (aiohttp.ClientError("something else"), "transport_error"),
    ],
    ids=lambda value: value if isinstance(value, str) else type(value.__cause__ or value).__name__,
)
def test_aiohttp_exceptions_get_the_codes_httpx_gives_the_same_failure(exc: BaseException, code: str) -> None:
    failure = classify_exception(exc)
    assert (failure.layer, failure.code, failure.http_status) == (T, code, None)
