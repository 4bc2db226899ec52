"""What the client will not do, on both HTTP stacks against real servers on 127.0.0.1: call a url outside the
endpoint table (a trap server on another port and the provider both see nothing), or read an answer past
``STREAMPROC_LLM_MAX_RESPONSE_BYTES`` decoded (a gzip bomb stays compressed past the cap)."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import pytest
from aiohttp import web

from streamproc.core.events import InferenceRequest
from streamproc.core.outcome import Failure, Success
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.client import LLMClient
from streamproc.settings import Settings

Stack = Literal["aiohttp", "httpcore"]
STACKS: list[Stack] = ["aiohttp", "httpcore"]
BODY = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = json.dumps({"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
CAP = 1024 * 1024
BOMB_BYTES = 100 * 1024 * 1024


@dataclass
class Server:
    """A real HTTP server that records every request it sees."""

    port: int
    seen: list[str] = field(default_factory=list)

    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


Reply = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Reply], Awaitable[Server]]]:
    runners: list[web.AppRunner] = []

    async def start(reply: Reply) -> Server:
        server = Server(0)

        async def handle(request: web.Request) -> web.StreamResponse:
            server.seen.append(f"{request.method} {request.raw_path}")
            return await reply(request)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        server.port = runner.addresses[0][1]
        return server

    yield start
    for runner in runners:
        await runner.cleanup()


async def answers(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


def client(stack: Stack, base: str) -> LLMClient:
    return LLMClient(Settings(llm_base_url=base, llm_http=stack, llm_timeout_s=20, llm_max_response_bytes=CAP,
                              llm_api_key="sk-secret").llm_endpoint, connections=256, hedge_ratio=0)


# -- the endpoint allow-list ------------------------------------------------------------------------------------

def hostile_urls(trap: Server) -> list[str]:
    return [
        f"http://127.0.0.1:{trap.port}/v1/chat/completions",
        f"//127.0.0.1:{trap.port}/v1/chat/completions",
        f"http://127.0.0.1:{trap.port}",
        "/../../admin/keys",
        "/v1/chat/completions/../files",
        "/v1/files",
        "/v1/%2e%2e/files",
        "/v1/chat%2Fcompletions",
        "\\\\v1\\\\chat\\\\completions",
        "/v1/chat/completions?x=1",
        "#frag",
        "/v1/chat/completions\x00",
        "/v1/chat/completions\r\nHost: evil.example",
        "/v1\u2215chat\u2215completions",
    ]


@pytest.mark.parametrize("stack", STACKS)
async def test_a_hostile_url_is_never_called(stack: Stack, serve: Callable[[Reply], Awaitable[Server]]) -> None:
    provider, trap = await serve(answers), await serve(answers)
    llm = client(stack, provider.base())
    try:
        for url in hostile_urls(trap):
            result = await llm.call(InferenceRequest("r-1", "{}", url=url), BODY)
            assert isinstance(result.outcome, Failure), (url, result.outcome)
            assert (result.outcome.layer, result.outcome.code) == (FailureLayer.BUSINESS, "unsupported_url"), url
            assert f"unsupported url {url!r}" in result.outcome.message
        assert trap.seen == [] and provider.seen == []
        good = await llm.call(InferenceRequest("r-1", "{}"), BODY)
    finally:
        await llm.aclose()
    assert isinstance(good.outcome, Success)
    assert provider.seen == ["POST /v1/chat/completions"] and trap.seen == []


# -- bounded answers --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bomb() -> bytes:
    """100 MB of zeros, gzip-compressed (about 100 KB), made without holding the 100 MB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    zeros = bytes(1024 * 1024)
    parts = [packer.compress(zeros) for _ in range(BOMB_BYTES // len(zeros))]
    return b"".join(parts) + packer.flush()


def sends(body: bytes, status: int = 200, encoding: str | None = None) -> Reply:
    async def reply(request: web.Request) -> web.Response:
        await request.read()
        headers = {"content-encoding": encoding} if encoding else {}
        return web.Response(body=body, status=status, content_type="application/json", headers=headers)
    return reply


def streams(total: int, status: int = 200) -> Reply:
    """A body of ``total`` bytes sent in 64 KiB writes, so the server never holds it whole."""
    async def reply(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=status, headers={"content-type": "application/json"})
        response.content_length = total
        await response.prepare(request)
        chunk = b"x" * 65536
        try:
            for _ in range(total // len(chunk)):
                await response.write(chunk)
        except (ConnectionError, RuntimeError):  # the client stopped reading and closed: what it should do
            pass
        return response
    return reply


async def call_measured(stack: Stack, server: Server) -> tuple[Success | Failure, int]:
    """The outcome and the peak of Python memory allocated during the call (tracemalloc)."""
    llm = client(stack, server.base())
    tracemalloc.start()
    try:
        result = await llm.call(InferenceRequest("r-1", "{}"), BODY)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await llm.aclose()
    assert isinstance(result.outcome, Success | Failure), result.outcome
    return result.outcome, peak


def is_too_large(outcome: Success | Failure) -> bool:
    return (isinstance(outcome, Failure) and (outcome.layer, outcome.code, outcome.http_status)
            == (FailureLayer.BUSINESS, "response_too_large", 200) and f"{CAP:,} bytes decoded" in outcome.message)


@pytest.mark.parametrize("stack", STACKS)
async def test_a_gzip_bomb_is_not_expanded_past_the_cap(stack: Stack, bomb: bytes,
                                                         serve: Callable[[Reply], Awaitable[Server]]) -> None:
    assert len(bomb) < BOMB_BYTES // 500
    server = await serve(sends(bomb, encoding="gzip"))
    outcome, peak = await call_measured(stack, server)
    assert is_too_large(outcome), outcome
    assert peak < 8 * CAP, f"{peak:,} bytes at the peak"  # the bomb is 100 MiB; unbounded, one 64 KiB read is 64 MiB


@pytest.mark.parametrize("stack", STACKS)
async def test_an_oversized_answer_is_not_read_past_the_cap(stack: Stack,
                                                            serve: Callable[[Reply], Awaitable[Server]]) -> None:
    server = await serve(streams(32 * CAP))
    outcome, peak = await call_measured(stack, server)
    assert is_too_large(outcome), outcome
    assert peak < 8 * CAP, f"{peak:,} bytes at the peak"


@pytest.mark.parametrize("stack", STACKS)
async def test_an_oversized_error_page_is_classified_by_its_status(stack: Stack,
                                                                   serve: Callable[[Reply], Awaitable[Server]],
                                                                   ) -> None:
    """A gateway's huge 502 page is a service failure (retried), judged by its first ``cap`` bytes."""
    server = await serve(streams(4 * CAP, status=502))
    outcome, _ = await call_measured(stack, server)
    assert isinstance(outcome, Failure) and (outcome.layer, outcome.code) == (FailureLayer.SERVICE, "http_502")


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize(("encoding", "encode"), [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),  # zlib-wrapped, as the RFC says
    ("deflate", lambda data: zlib.compress(data, wbits=-zlib.MAX_WBITS)),  # raw, as some servers send it
    (None, lambda data: data),
])
async def test_an_answer_under_the_cap_is_read_whatever_its_encoding(
        stack: Stack, encoding: str | None, encode: Callable[[bytes], bytes],
        serve: Callable[[Reply], Awaitable[Server]]) -> None:
    server = await serve(sends(encode(ANSWER), encoding=encoding))
    llm = client(stack, server.base())
    try:
        result = await llm.call(InferenceRequest("r-1", "{}"), BODY)
    finally:
        await llm.aclose()
    assert isinstance(result.outcome, Success) and result.response_body == ANSWER


@pytest.mark.parametrize("stack", STACKS)
async def test_an_answer_of_exactly_the_cap_is_read(stack: Stack, serve: Callable[[Reply], Awaitable[Server]]) -> None:
    padded = ANSWER[:-1] + b" " * (CAP - len(ANSWER)) + ANSWER[-1:]
    server = await serve(sends(gzip.compress(padded), encoding="gzip"))
    llm = client(stack, server.base())
    try:
        result = await llm.call(InferenceRequest("r-1", "{}"), BODY)
    finally:
        await llm.aclose()
    assert isinstance(result.outcome, Success) and len(result.response_body) == CAP
