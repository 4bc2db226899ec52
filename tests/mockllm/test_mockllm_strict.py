"""The ``strict`` profile over HTTP: the small ways real servers differ from the other profiles, each of
which broke a client that was tuned against them."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from typing import Any

import aiohttp
import openai
import pytest
from multidict import CIMultiDict

from streamproc.mockllm.latency import NO_LATENCY
from streamproc.mockllm.profiles import BUILTIN_PROFILES, Overrides, Profile, ServerLimits
from streamproc.mockllm.runner import MockLLMHandle, running_mock_llm

CHAT: dict[str, Any] = {"model": "mock-small", "messages": [{"role": "user", "content": "Is this spam?"}]}


def strict(**changes: Any) -> Profile:
    """strict without random faults or latency, so a test sees only the quirk it is about."""
    return replace(BUILTIN_PROFILES["strict"], faults={}, latency=NO_LATENCY, **changes)


async def post(http: aiohttp.ClientSession, mock: MockLLMHandle, **headers: str) -> tuple[int, CIMultiDict[str], bytes]:
    async with http.post(f"{mock.url}/chat/completions", json=CHAT, headers=headers) as response:
        return response.status, CIMultiDict(response.headers), await response.read()


def limit_headers(headers: CIMultiDict[str]) -> set[str]:
    return {name.lower() for name in headers if name.lower().startswith("x-ratelimit-")}


async def test_rate_limit_headers_come_only_with_a_429(http: aiohttp.ClientSession) -> None:
    """A client cannot pace itself from the 200s: it learns the limit only by hitting it."""
    async with running_mock_llm(strict(rate_limits=ServerLimits(rpm=60, burst_seconds=1.0))) as mock:
        status, headers, _ = await post(http, mock)
        assert status == 200 and limit_headers(headers) == set()
        status, headers, _ = await post(http, mock)
        assert status == 429
        assert limit_headers(headers) == {
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        }
        assert headers["x-ratelimit-limit-requests"] == "60"
        assert headers["retry-after"] == "1"
    async with running_mock_llm(strict(), overrides=Overrides(rpm=6000)) as mock:
        status, headers, _ = await post(http, mock, **{"x-mock-fault": "bad_gateway"})
        assert status == 502 and limit_headers(headers) == set()
        status, headers, _ = await post(http, mock, **{"x-mock-fault": "rate_limit"})
        assert status == 429 and limit_headers(headers) == set()  # a 429 of the server's own names no bucket
        assert headers["retry-after"] == "1" and "retry-after-ms" not in headers


async def test_a_bounded_hang_ends_with_a_dropped_connection(http: aiohttp.ClientSession) -> None:
    async with running_mock_llm("clean", overrides=Overrides(hang_seconds=0.2)) as mock:
        with pytest.raises(aiohttp.ClientError):
            await post(http, mock, **{"x-mock-fault": "hang"})


async def test_a_strict_hang_lasts_until_the_client_gives_up(http: aiohttp.ClientSession) -> None:
    async with running_mock_llm(strict()) as mock:
        call = asyncio.create_task(
            http.post(
                f"{mock.url}/chat/completions",
                json=CHAT,
                headers={"x-mock-fault": "hang"},
                timeout=aiohttp.ClientTimeout(total=1.0),
            )
        )
        await asyncio.sleep(0.8)
        assert mock.stats()["hanging"] == 1  # long past any bounded hang of the tests above
        with pytest.raises(asyncio.TimeoutError):
            await call
        for _ in range(100):
            if mock.stats()["hanging"] == 0:
                break
            await asyncio.sleep(0.01)
        assert mock.stats()["hanging"] == 0
        assert mock.stats()["by_status"] == {"none": 1}


async def test_a_non_uuid_x_request_id_gets_an_empty_400(http: aiohttp.ClientSession) -> None:
    """llama-cpp-python's server (starlette-context's RequestIdPlugin) answers so before anything else; the
    client's correlation id belongs in x-client-request-id, which takes any text."""
    async with running_mock_llm(strict()) as mock:
        status, headers, body = await post(http, mock, **{"x-request-id": "batch-1:row-7"})
        assert (status, body) == (400, b"")
        assert "Content-Type" not in headers
        status, _, _ = await post(http, mock, **{"x-request-id": str(uuid.uuid4())})
        assert status == 200
        status, _, _ = await post(http, mock, **{"x-client-request-id": "batch-1%3Arow-7"})
        assert status == 200
        stats = mock.stats(detail=True)
    assert stats["by_outcome"] == {"invalid_request_id": 1, "ok": 2}
    assert stats["per_request_id"]["batch-1:row-7"] == {"calls": 2, "outcomes": ["invalid_request_id", "ok"]}


async def test_what_the_openai_client_sees() -> None:
    """The official client sends no x-request-id of its own, so it passes; one passed by the caller that
    is not a UUID is a BadRequestError without a body, which a classifier must not read as the request's fault."""
    async with (
        running_mock_llm(strict()) as mock,
        openai.AsyncOpenAI(base_url=mock.url, api_key="k", max_retries=0) as client,
    ):
        completion = await client.chat.completions.create(model="mock-small", messages=CHAT["messages"])
        assert completion.choices[0].finish_reason == "stop"
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="mock-small", messages=CHAT["messages"], extra_headers={"x-request-id": "row-7"}
            )
    assert caught.value.status_code == 400
    assert not caught.value.body and caught.value.code is None


async def test_the_strict_profile_as_it_is(http: aiohttp.ClientSession) -> None:
    """With its faults and latency, 60 calls at once: the bucket admits 50 (its clock stands still here, so it
    does not refill), and some of those fail on their own."""
    async with running_mock_llm("strict", seed=5, clock=lambda: 1000.0) as mock:

        async def one(i: int) -> int | None:
            body = json.dumps({**CHAT, "messages": [{"role": "user", "content": f"item {i}"}]})
            try:
                async with http.post(
                    f"{mock.url}/chat/completions", data=body, timeout=aiohttp.ClientTimeout(total=2.5)
                ) as response:
                    await response.read()
                    return response.status
            except (TimeoutError, aiohttp.ClientError):
                return None

        statuses = await asyncio.gather(*(one(i) for i in range(60)))
        stats = mock.stats()
    assert stats["calls"] == 60
    assert stats["by_outcome"]["rate_limited"] == 10
    assert 40 <= statuses.count(200) < 50
    assert statuses.count(429) >= 10
