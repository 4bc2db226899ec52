"""A provider that echoes the request's Authorization header (or the key) in its error answer: on both HTTP
stacks, against a real server on 127.0.0.1, the failure's message and body the client hands on hold
``[REDACTED]``, never the key; exceptions naming credentials are redacted too."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal

import httpx
import pytest
from aiohttp import web

from streamproc.core.events import InferenceRequest
from streamproc.core.outcome import ConfigurationProblem, Failure
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.client import LLMClient
from streamproc.llm.provider_answer import kept_body
from streamproc.llm.transport_errors import classify_exception
from streamproc.settings import Settings

Stack = Literal["aiohttp", "httpcore"]
KEY = "k3y-that-must-not-leak-0123"
BODY = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def echoing(status: int) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def reply(request: web.Request) -> web.Response:
        await request.read()
        authorization = request.headers.get("authorization", "")
        key = authorization.removeprefix("Bearer ")
        message = f"invalid request; you sent Authorization: {authorization} (key {key})"
        body = {"error": {"message": message, "type": "invalid_request_error", "code": None},
                "headers": {"authorization": authorization}}
        return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")
    return reply


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[int], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(status: int) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", echoing(status))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

    yield start
    for runner in runners:
        await runner.cleanup()


async def call(stack: Stack, base: str) -> tuple[Failure | ConfigurationProblem, bytes]:
    llm = LLMClient(Settings(llm_base_url=base, llm_http=stack, llm_timeout_s=10, llm_api_key=KEY).llm_endpoint,
                    connections=256, hedge_ratio=0)
    try:
        result = await llm.call(InferenceRequest("r-1", "{}"), BODY)
    finally:
        await llm.aclose()
    assert isinstance(result.outcome, Failure | ConfigurationProblem)
    return result.outcome, result.response_body


@pytest.mark.parametrize("stack", ["aiohttp", "httpcore"])
async def test_an_error_answer_echoing_the_key_is_redacted(stack: Stack,
                                                           serve: Callable[[int], Awaitable[str]]) -> None:
    outcome, body = await call(stack, await serve(400))
    assert isinstance(outcome, Failure) and (outcome.layer, outcome.http_status) == (FailureLayer.BUSINESS, 400)
    for text in (outcome.message, body.decode(), kept_body(body)):
        assert KEY not in text and "[REDACTED]" in text, text
    assert json.loads(body)["headers"] == {"authorization": "[REDACTED]"}  # still JSON for the export


@pytest.mark.parametrize("stack", ["aiohttp", "httpcore"])
async def test_a_refused_key_echoed_back_is_redacted_from_what_the_worker_logs(
        stack: Stack, serve: Callable[[int], Awaitable[str]]) -> None:
    outcome, body = await call(stack, await serve(401))
    assert isinstance(outcome, ConfigurationProblem) and outcome.code == "invalid_api_key"
    assert KEY not in outcome.message and KEY not in body.decode()


def test_an_exception_naming_credentials_is_redacted() -> None:
    exc = httpx.ConnectError(f"cannot reach https://svc:pa55w0rd@llm.example/v1 with Bearer {KEY}")
    failure = classify_exception(exc, [KEY])
    assert "pa55w0rd" not in failure.message and KEY not in failure.message
    assert failure.message == "ConnectError: cannot reach https://[REDACTED]@llm.example/v1 with Bearer [REDACTED]"


def test_the_kept_body_is_redacted_without_knowing_the_key() -> None:
    body = b'{"error": {"message": "Bearer sk-proj-abcdefghijkl was refused", "authorization": "Basic eHl6"}}'
    kept = kept_body(body)
    assert "abcdefghijkl" not in kept and "eHl6" not in kept
    assert json.loads(kept)["error"] == {"message": "Bearer [REDACTED] was refused", "authorization": "[REDACTED]"}
