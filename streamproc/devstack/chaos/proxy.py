"""A pass-through proxy in front of the mock LLM server that answers marked requests with 10,000-deep JSON.

The mock cannot nest an answer that deep (its schema filler stops at depth 12), and the workers know one
base URL, so every call goes through this proxy. A request whose text carries :data:`DEEP_BODY_MARKER` gets
a 200 whose body nests ``depth`` arrays deep; one with :data:`DEEP_CONTENT_MARKER` gets a normal completion
whose *content* is such a value. Everything else is forwarded byte for byte, and a connection the mock cuts
(its reset and stream-break faults) is cut towards the worker too, so the faults keep their layer.

Since every call passes here, the proxy also notes each call the client gave up on and when: a SIGKILLed
worker drops all its open calls at once, which is how the run counts the calls a kill cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

DEEP_BODY_MARKER = "[chaos:deep-body]"
DEEP_CONTENT_MARKER = "[chaos:deep-content]"
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade",
                         "proxy-connection", "te", "trailer"})
_MAX_BODY_BYTES = 64 * 1024 * 1024  # the mock takes 32 MiB; the proxy must not be the one that refuses


def deep_json(depth: int) -> str:
    """A JSON value nested ``depth`` arrays deep: valid, and beyond every recursive parser's limit."""
    return "[" * depth + "]" * depth


def deep_body_answer(depth: int) -> bytes:
    """A 200 chat completion that is fine except for one field nested ``depth`` deep."""
    return (b'{"id":"chatcmpl-chaos-deep-body","object":"chat.completion","created":0,"model":"mock-small",'
            b'"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
            b'"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11},"deep":'
            + deep_json(depth).encode() + b"}")


def deep_content_answer(depth: int) -> bytes:
    """A well-formed 200 chat completion whose content is a JSON value nested ``depth`` deep."""
    return (b'{"id":"chatcmpl-chaos-deep-content","object":"chat.completion","created":0,"model":"mock-small",'
            b'"choices":[{"index":0,"message":{"role":"assistant","content":"' + deep_json(depth).encode()
            + b'"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}')


@dataclass
class ProxyLedger:
    """What passed through: calls, deep answers per request id, and calls the client dropped (monotonic s)."""

    calls: int = 0
    deep_answers: dict[str, int] = field(default_factory=dict)
    drops: list[float] = field(default_factory=list)
    upstream_cuts: int = 0


class LLMProxy:
    """The proxy in a thread with its own event loop, so that the orchestrator's blocking moments (a broker
    stop, a CLI call) never hold an LLM answer up."""

    def __init__(self, upstream_root: str, depth: int) -> None:
        self._upstream = upstream_root.rstrip("/")
        self._deep_body = deep_body_answer(depth)
        self._deep_content = deep_content_answer(depth)
        self._ledger = ProxyLedger()
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._session: aiohttp.ClientSession | None = None
        self._error: BaseException | None = None
        self.url = ""

    def start(self, timeout_s: float = 15.0) -> LLMProxy:
        self._thread = threading.Thread(target=self._run, name="chaos-llm-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"the LLM proxy did not start: {self._error!r}")
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._stopping is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout_s)

    def ledger(self) -> ProxyLedger:
        """A copy, safe to read from any thread."""
        with self._lock:
            return ProxyLedger(self._ledger.calls, dict(self._ledger.deep_answers), list(self._ledger.drops),
                               self._ledger.upstream_cuts)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start(); a thread has nowhere else to raise
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        app = web.Application(client_max_size=_MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                         timeout=aiohttp.ClientTimeout(total=None)) as session:
            self._session = session
            try:
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                host, port = runner.addresses[0][:2]
                self.url = f"http://{host}:{port}/v1"
                self._ready.set()
                await self._stopping.wait()
            finally:
                await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        with self._lock:
            self._ledger.calls += 1
        try:
            canned = self._canned(body, request.headers.get("x-client-request-id") or "")
            if canned is not None:
                return web.Response(status=200, body=canned, content_type="application/json")
            return await self._forward(request, body)
        except asyncio.CancelledError:  # the client went away (a timeout, or a killed worker)
            with self._lock:
                self._ledger.drops.append(time.monotonic())
            raise

    def _canned(self, body: bytes, request_id: str) -> bytes | None:
        if DEEP_BODY_MARKER.encode() in body:
            answer = self._deep_body
        elif DEEP_CONTENT_MARKER.encode() in body:
            answer = self._deep_content
        else:
            return None
        with self._lock:
            self._ledger.deep_answers[request_id] = self._ledger.deep_answers.get(request_id, 0) + 1
        return answer

    async def _forward(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        try:
            async with self._session.request(request.method, self._upstream + request.path_qs, data=body,
                                             headers=headers, allow_redirects=False) as upstream:
                payload = await upstream.read()
                answer = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
                return web.Response(status=upstream.status, body=payload, headers=answer)
        except (aiohttp.ClientError, ConnectionError):
            # the mock cut the answer (reset, stream break): the worker must see a cut connection too
            with self._lock:
                self._ledger.upstream_cuts += 1
            _reset(request)
            return web.Response(status=204)


def _reset(request: web.BaseRequest) -> None:
    """Drop the client's connection with a TCP RST, as the mock dropped ours."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:  # asyncio's TransportSocket
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
