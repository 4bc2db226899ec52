"""Records whose url names another path or host, written straight onto ``llm.requests`` (the topic is an
interface: anyone who can write it is untrusted): a real worker, on each HTTP stack, ends each of them as a
business failure ``unsupported_url`` with the reason, and neither the provider nor a trap server on another
port sees a call for them; a good record beside them is answered."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web

from streamproc.core.vocabulary import FailureLayer
from streamproc.settings import Settings
from tests.integration.pipeline import OutcomeReader, WorkerProcess, chat_request, produce_requests, worker_env

pytestmark = pytest.mark.integration

ANSWER = json.dumps({"model": "mock-small", "choices": [{"index": 0, "finish_reason": "stop",
                                                         "message": {"role": "assistant", "content": "ok"}}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()


class Recorder:
    """A real HTTP server on 127.0.0.1 that answers every request with a completion and records it."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> Recorder:
        async def handle(request: web.Request) -> web.Response:
            self.seen.append(f"{request.method} {request.raw_path} authorization={'authorization' in request.headers}")
            await request.read()
            return web.Response(body=ANSWER, content_type="application/json")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def servers() -> AsyncIterator[tuple[Recorder, Recorder]]:
    provider, trap = await Recorder().start(), await Recorder().start()
    yield provider, trap
    await provider.stop()
    await trap.stop()


def hostile_urls(trap_port: int) -> dict[str, str]:
    return {
        "absolute": f"http://127.0.0.1:{trap_port}/v1/chat/completions",
        "protocol-relative": f"//127.0.0.1:{trap_port}/v1/chat/completions",
        "dot-dot": "/../../admin/keys",
        "dot-dot-after": "/v1/chat/completions/../files",
        "files": "/v1/files",
        "encoded-dots": "/v1/%2e%2e/files",
        "encoded-slash": "/v1/chat%2Fcompletions",
        "backslash": "\\v1\\chat\\completions",
        "query": "/v1/chat/completions?x=1",
        "fragment": "#frag",
        "nul": "/v1/chat/completions\x00",
        "header-split": "/v1/chat/completions\r\nHost: evil.example",
        "lookalike": "/v1\u2215chat\u2215completions",
    }


@pytest.mark.parametrize("stack", ["aiohttp", "httpcore"])
async def test_a_record_with_a_hostile_url_is_refused_unsent(stack: str, settings: Settings, tmp_path: Path,
                                                             servers: tuple[Recorder, Recorder]) -> None:
    provider, trap = servers
    assert settings.kafka_bootstrap is not None
    hostile = hostile_urls(trap.port)
    requests = [replace(chat_request(f"bad-{name}", i), url=url) for i, (name, url) in enumerate(hostile.items())]
    requests.append(chat_request("good", 99))
    await produce_requests(settings.kafka_bootstrap, settings, requests)
    env = worker_env(settings, f"http://127.0.0.1:{provider.port}/v1", tmp_path / "w1", llm_http=stack,
                     llm_api_key="sk-test-secret")
    worker = WorkerProcess(env, tmp_path / "worker.log")
    worker.start()
    try:
        async with OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            outcomes = await reader.wait_until_ended([r.request_id for r in requests], 90, worker)
    finally:
        worker.stop()
    assert outcomes.results["good"], worker.log_tail()
    for name, url in hostile.items():
        ended = outcomes.terminal(f"bad-{name}")
        assert len(ended) == 1 and not outcomes.results.get(f"bad-{name}"), (name, worker.log_tail())
        event = ended[0]
        assert (event.layer, event.error_code, event.http_status) == (FailureLayer.BUSINESS, "unsupported_url", None)
        assert f"unsupported url {url!r}: " in event.message and "not called" in event.message, event.message
        assert event.response_body is None
    assert trap.seen == []
    assert provider.seen == ["POST /v1/chat/completions authorization=True"]  # the good record's call only
