"""The LLM client on both HTTP stacks (``STREAMPROC_LLM_HTTP``) against real servers on 127.0.0.1: the same
answers and, for a server that fails, the same failure code, whichever stack carries the call."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal

import pytest

from streamproc.core.events import InferenceRequest
from streamproc.core.outcome import Failure, Success
from streamproc.llm.client import LLMClient
from streamproc.llm.http_stacks import env_proxy
from streamproc.settings import Settings

Stack = Literal["aiohttp", "httpcore"]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

BODY = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = json.dumps({"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """The request's head and body (by its content-length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


def response(status: str, body: bytes, length: int | None = None, extra: bytes = b"") -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: "
            f"{len(body) if length is None else length}\r\n").encode() + extra + b"\r\n" + body


async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:  # keep-alive: every request on the connection gets the completion
        try:
            seen = await read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            break
        assert b"x-client-request-id: r-1" in seen.lower()
        writer.write(response("200 OK", ANSWER, extra=b"x-ratelimit-remaining-requests: 7\r\n"))
        await writer.drain()
    writer.close()


async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.close()


async def cuts_the_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(response("200 OK", ANSWER[:10], length=len(ANSWER)))
    await writer.drain()
    writer.close()


async def speaks_no_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"SPEAKING NONSENSE\r\n\r\n")
    await writer.drain()
    writer.close()


async def answers_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(response("400 Bad Request", b"{}"))  # plain HTTP, whatever comes (a TLS hello here)
    await writer.drain()
    writer.close()


async def lies_about_its_encoding(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(response("200 OK", b"not gzip at all", extra=b"content-encoding: gzip\r\n"))
    await writer.drain()
    writer.close()


async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await asyncio.sleep(30)
    writer.close()


async def overloaded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(response("429 Too Many Requests", b'{"error": {"message": "slow down"}}', extra=b"retry-after: 2\r\n"))
    await writer.drain()
    writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[int]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> int:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        port: int = server.sockets[0].getsockname()[1]
        return port

    yield start
    for server in servers:
        server.close()


async def call(stack: Stack, url: str, timeout_s: float = 10.0) -> Success | Failure:
    client = LLMClient(Settings(llm_base_url=url, llm_http=stack, llm_timeout_s=timeout_s).llm_endpoint,
                       connections=256, hedge_ratio=0)
    try:
        result = await client.call(InferenceRequest("r-1", "{}"), BODY)
    finally:
        await client.aclose()
    assert isinstance(result.outcome, Success | Failure), result.outcome
    if isinstance(result.outcome, Success):
        assert result.response_body == ANSWER
        assert result.headers["x-ratelimit-remaining-requests"] == "7"
    return result.outcome


STACKS: list[Stack] = ["aiohttp", "httpcore"]


@pytest.mark.parametrize("stack", STACKS)
async def test_an_answer_comes_back_with_its_body_and_headers(stack: Stack, serve: Callable[[Handler], Awaitable[int]],
                                                              ) -> None:
    port = await serve(answers)
    client = LLMClient(Settings(llm_base_url=f"http://127.0.0.1:{port}/v1", llm_http=stack).llm_endpoint,
                       connections=4, hedge_ratio=0.03)
    try:  # more calls than connections, on kept-alive connections
        results = await asyncio.gather(*(client.call(InferenceRequest("r-1", "{}"), BODY) for _ in range(12)))
    finally:
        await client.aclose()
    assert all(isinstance(r.outcome, Success) and r.response_body == ANSWER for r in results)


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize(("handler", "code"), [
    (hangs_up, "server_disconnected"),
    (cuts_the_body, "server_disconnected"),
    (speaks_no_http, "protocol_error"),
    (lies_about_its_encoding, "invalid_response_body"),
])
async def test_a_failing_server_gives_the_same_code_on_both_stacks(
        stack: Stack, handler: Handler, code: str, serve: Callable[[Handler], Awaitable[int]]) -> None:
    port = await serve(handler)
    outcome = await call(stack, f"http://127.0.0.1:{port}/v1")
    assert isinstance(outcome, Failure) and outcome.code == code, outcome


@pytest.mark.parametrize("stack", STACKS)
async def test_an_http_error_is_judged_by_its_status(stack: Stack, serve: Callable[[Handler], Awaitable[int]]) -> None:
    port = await serve(overloaded)
    outcome = await call(stack, f"http://127.0.0.1:{port}/v1")
    assert isinstance(outcome, Failure) and (outcome.code, outcome.http_status) == ("rate_limit_exceeded", 429), outcome
    assert outcome.retry_after_ms == 2000


@pytest.mark.parametrize("stack", STACKS)
async def test_a_server_that_never_answers_ends_in_a_read_timeout(
        stack: Stack, serve: Callable[[Handler], Awaitable[int]]) -> None:
    port = await serve(never_answers)
    started = asyncio.get_running_loop().time()
    outcome = await call(stack, f"http://127.0.0.1:{port}/v1", timeout_s=0.3)
    assert isinstance(outcome, Failure) and outcome.code == "read_timeout", outcome
    assert asyncio.get_running_loop().time() - started < 5


@pytest.mark.parametrize("stack", STACKS)
async def test_a_closed_port_is_connection_refused(stack: Stack) -> None:
    with socket.socket() as probe:  # a port nothing listens on once the socket is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcome = await call(stack, f"http://127.0.0.1:{port}/v1")
    assert isinstance(outcome, Failure) and outcome.code == "connection_refused", outcome


@pytest.mark.parametrize("stack", STACKS)
async def test_tls_to_a_plain_http_server_is_a_tls_error(stack: Stack,
                                                         serve: Callable[[Handler], Awaitable[int]]) -> None:
    port = await serve(answers_at_once)
    outcome = await call(stack, f"https://127.0.0.1:{port}/v1")
    assert isinstance(outcome, Failure) and outcome.code == "tls_error", outcome


@pytest.mark.parametrize(("url", "proxy"), [
    ("https://api.example.com/v1", "http://proxy.test:3128"),
    ("http://127.0.0.1:8000/v1", None),  # NO_PROXY
    ("http://llm.internal/v1", None),  # no HTTP_PROXY set
])
def test_the_aiohttp_stack_takes_the_proxy_from_the_environment_as_httpx_does(
        url: str, proxy: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy", "ALL_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.test:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    assert env_proxy(url) == proxy
