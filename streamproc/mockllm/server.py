"""The aiohttp application: OpenAI endpoints, stats, health and control, and the I/O side of faults.

The engine decides; this module only queues for a slot, sleeps, writes bytes, and breaks connections on
purpose (hangs, resets, cut bodies, broken streams). Queueing, latency and hangs end when the client leaves
(handlers are cancelled on disconnect) or when the server shuts down, so stopping the server never waits
for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import socket
import struct
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from streamproc.mockllm import anthropic_batches, openai_batches
from streamproc.mockllm import error_bodies as errors
from streamproc.mockllm.batch_store import BatchStore
from streamproc.mockllm.engine import Completed, Hang, Incoming, MockEngine, Rejected
from streamproc.mockllm.error_bodies import ErrorReply
from streamproc.mockllm.injected_faults import FaultKind
from streamproc.mockllm.responses import completion_json, encode, stream_frames
from streamproc.mockllm.slots import SlotQueue
from streamproc.mockllm.validation import CHAT, COMPLETIONS

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024
JSON_TYPE = "application/json"
HTML_PAGE = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
    b"</center>\r\n<hr><center>mock-proxy</center>\r\n</body>\r\n</html>\r\n"
)


def _json_response(status: int, body: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=encode(body), content_type=JSON_TYPE, headers=headers)


def _error_response(reply: ErrorReply, headers: Mapping[str, str] | None = None) -> web.Response:
    headers = headers if headers is not None else reply.headers
    if not reply.body:
        return web.Response(status=reply.status, headers=headers)
    return _json_response(reply.status, reply.body, headers)


def _hard_reset(request: web.BaseRequest) -> None:
    """Close the connection with a TCP RST (SO_LINGER 0), as a crashed peer or middlebox would."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _close(request: web.BaseRequest) -> None:
    """Close the connection cleanly (FIN) after what was written is flushed."""
    if request.transport is not None:
        request.transport.close()


class MockLLMServer:
    """HTTP front of one engine; ``build_app()`` gives the aiohttp application."""

    def __init__(self, engine: MockEngine, *, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.engine = engine
        self.max_body_bytes = max_body_bytes
        self.in_flight = 0
        self.hanging = 0
        slots = engine.profile.slots
        self.slots = SlotQueue(slots, engine.clock) if slots is not None else None
        self._closing = asyncio.Event()
        self.batches = BatchStore()

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{model}", self.get_model)
        openai_batches.OpenAIBatches(self.engine, self.batches).add_routes(app)
        anthropic_batches.AnthropicBatches(self.engine, self.batches).add_routes(app)
        app.router.add_get("/stats", self.stats)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_post("/control/outage", self.control_outage)
        app.router.add_post("/control/reset", self.control_reset)
        app.router.add_route("*", "/{tail:.*}", self.fallback)
        app.on_shutdown.append(self._on_shutdown)
        app.on_response_prepare.append(_stamp_request_id)
        return app

    async def _on_shutdown(self, app: web.Application) -> None:
        self._closing.set()
        if self.slots is not None:
            self.slots.close()

    def snapshot(self, *, detail: bool = False) -> dict[str, Any]:
        """What ``/stats`` shows: the engine's counters, and what is in flight, hanging and queued now."""
        snapshot = self.engine.snapshot(detail=detail)
        snapshot["in_flight"] = self.in_flight
        snapshot["hanging"] = self.hanging
        snapshot["queue"] = self.slots.describe() if self.slots is not None else None
        snapshot["batches"] = self.batches.describe(
            self.engine.clock(),
            {"openai": openai_batches.BATCH_PREFIX, "anthropic": anthropic_batches.BATCH_PREFIX},
        )
        return snapshot

    def reset(self) -> None:
        self.engine.reset()
        if self.slots is not None:
            self.slots.reset()

    # ---- OpenAI endpoints -----------------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, COMPLETIONS)

    async def _serve(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        self.in_flight += 1
        try:
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                rejected = self.engine.reject_oversized(endpoint, b"", self.max_body_bytes)
                return _error_response(rejected.reply, rejected.headers)
            headers = request.headers
            incoming = Incoming(
                endpoint,
                body,
                headers.get("Authorization"),
                headers.get("x-mock-fault"),
                _client_request_id(headers),
                headers.get("x-request-id"),
            )
            try:
                outcome = self.engine.decide(incoming)
            except Exception:  # a bug must show up in /stats and the log, not as a dropped connection
                log.exception("mock-llm: internal error")
                self.engine.stats.internal_errors += 1
                return _json_response(500, errors.server_error_reply(500, "mock-llm internal error (see its log)").body)
            if isinstance(outcome, Rejected):
                return _error_response(outcome.reply, outcome.headers)  # errors need no slot: answered at once
            if self.slots is None:
                return await self._work(request, outcome)
            if not await self.slots.acquire():
                _hard_reset(request)  # shutting down while queued
                return web.Response(status=204)
            try:
                return await self._work(request, outcome)
            finally:
                self.slots.release()
        finally:
            self.in_flight -= 1

    async def _work(self, request: web.Request, outcome: Completed | Hang) -> web.StreamResponse:
        if isinstance(outcome, Hang):
            return await self._hang(request, outcome)
        return await self._deliver(request, outcome)

    async def _wait(self, seconds: float) -> bool:
        """Sleep (inf: until the server shuts down), but wake up when the server shuts down; True if it does."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(None if math.isinf(seconds) else seconds):
                await self._closing.wait()
        return self._closing.is_set()

    async def _hang(self, request: web.Request, hang: Hang) -> web.StreamResponse:
        self.hanging += 1
        try:
            await self._wait(hang.seconds)
        finally:
            self.hanging -= 1
        _hard_reset(request)
        return web.Response(status=204)  # never reaches the client: the connection is gone

    async def _deliver(self, request: web.Request, done: Completed) -> web.StreamResponse:
        if done.latency > 0 and await self._wait(done.latency):
            _hard_reset(request)  # shutting down: the answer is not coming, as with a real server going away
            return web.Response(status=204)
        parsed = done.parsed
        created = self.engine.created()
        if done.transport is FaultKind.NON_JSON_BODY:
            return web.Response(status=200, body=HTML_PAGE, content_type="text/html", headers=done.headers)
        if parsed.stream:
            frames = stream_frames(
                parsed.endpoint,
                done.response_id,
                created,
                parsed.model,
                done.answers,
                done.prompt_tokens,
                done.completion_tokens,
                parsed.include_usage,
            )
            return await self._stream(request, frames, done)
        payload = completion_json(
            parsed.endpoint,
            done.response_id,
            created,
            parsed.model,
            done.answers,
            done.prompt_tokens,
            done.completion_tokens,
        )
        if done.transport is None:
            return web.Response(status=200, body=payload, content_type=JSON_TYPE, headers=done.headers or None)
        if done.transport is FaultKind.TRUNCATED_BODY:
            return web.Response(
                status=200, body=payload[: len(payload) // 2], content_type=JSON_TYPE, headers=done.headers
            )
        # RESET or STREAM_BREAK on a plain answer: promise the whole body, send half, then drop.
        response = web.StreamResponse(status=200, headers=done.headers)
        response.content_type = JSON_TYPE
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload[: len(payload) // 2])
        self._drop(request, done.transport)
        return response

    async def _stream(self, request: web.Request, frames: list[bytes], done: Completed) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=done.headers)
        response.content_type = "text/event-stream"
        response.headers["Cache-Control"] = "no-cache"
        await response.prepare(request)
        fault = done.transport
        if fault is None:
            await response.write(b"".join(frames))
            await response.write_eof()
            return response
        half = max(1, len(frames) // 2)
        await response.write(b"".join(frames[:half]))
        if fault is FaultKind.TRUNCATED_BODY:
            cut = frames[half]
            await response.write(cut[: len(cut) // 2] + b"\n\n")
            await response.write_eof()
            return response
        self._drop(request, fault)
        return response

    @staticmethod
    def _drop(request: web.Request, fault: FaultKind) -> None:
        if fault is FaultKind.RESET:
            _hard_reset(request)
        else:
            _close(request)

    # ---- the rest -------------------------------------------------------------------------------

    async def list_models(self, request: web.Request) -> web.Response:
        created = 1_700_000_000
        data = [
            {
                "id": m.name,
                "object": "model",
                "created": created,
                "owned_by": "streamproc-mock",
                "context_window": m.context_window,
            }
            for m in self.engine.profile.models
        ]
        return _json_response(200, {"object": "list", "data": data})

    async def get_model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        spec = self.engine.models.get(name)
        if spec is None:
            return _error_response(errors.model_not_found(name))
        return _json_response(
            200,
            {
                "id": spec.name,
                "object": "model",
                "created": 1_700_000_000,
                "owned_by": "streamproc-mock",
                "context_window": spec.context_window,
            },
        )

    async def stats(self, request: web.Request) -> web.Response:
        detail = request.query.get("detail", "").lower() in ("1", "true", "yes")
        return _json_response(200, self.snapshot(detail=detail))

    async def healthz(self, request: web.Request) -> web.Response:
        return _json_response(200, {"status": "ok", "profile": self.engine.profile.name})

    async def control_outage(self, request: web.Request) -> web.Response:
        """``{"seconds": T}`` starts an outage of T seconds now; ``{"on": true}`` one without end;
        ``{"on": false}`` ends it."""
        try:
            body = await request.json()
        except ValueError:
            return _error_response(errors.unparsable_body())
        if not isinstance(body, dict):
            return _error_response(errors.invalid_type("body", "an object", body))
        now = self.engine.clock()
        seconds = body.get("seconds")
        on = body.get("on")
        if seconds is not None:
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
                return _error_response(errors.invalid_value("seconds", "a number >= 0 expected."))
            self.engine.outage.switch_on(now, float(seconds))
        elif isinstance(on, bool):
            if on:
                self.engine.outage.switch_on(now)
            else:
                self.engine.outage.switch_off()
        else:
            return _error_response(errors.missing_parameter("seconds"))
        return _json_response(200, {"outage": self.engine.outage.describe(now)})

    async def control_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return _json_response(200, {"reset": True})

    async def fallback(self, request: web.Request) -> web.Response:
        known = {r.canonical for r in request.app.router.resources()} - {"/{tail}"}
        if request.path in known:
            return _error_response(errors.method_not_allowed(request.method, request.path))
        return _error_response(errors.not_found_route(request.method, request.path))


async def _stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer carries a request id of the server's own in ``x-request-id``, as OpenAI's do (vLLM and
    llama.cpp send none): the id a user quotes to the provider, which the export keeps."""
    response.headers.setdefault("x-request-id", f"req_{secrets.token_hex(16)}")


def _client_request_id(headers: Mapping[str, str]) -> str | None:
    """The caller's correlation id: OpenAI's ``x-client-request-id`` (percent-decoded), else ``x-request-id``."""
    client_id = headers.get("x-client-request-id")
    return unquote(client_id) if client_id is not None else headers.get("x-request-id")
