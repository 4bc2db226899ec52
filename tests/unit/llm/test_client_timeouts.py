"""The adaptive timeout reaches calls already running: an early hang costs seconds, not the ceiling."""

from __future__ import annotations

import asyncio
import time

import httpx

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.timeouts import AdaptiveTimeout
from streamproc.core.outcome import Failure, Success
from streamproc.llm.client import LLMClient
from streamproc.settings import Settings

BODY = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                     "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


async def answer(request: httpx.Request) -> httpx.Response:
    if b"hang" in request.content:
        await asyncio.sleep(3600)  # a server that never answers this one
    return httpx.Response(200, json=ANSWER)


async def test_a_hang_that_started_before_the_timeout_was_learnt_is_cut_once_it_is() -> None:
    client = LLMClient(Settings(llm_base_url="http://llm.test/v1", llm_timeout_s=60),
                       transport=httpx.MockTransport(answer))
    client.timeouts = AdaptiveTimeout(60, floor_s=0.5, min_samples=5)
    try:
        started = time.monotonic()
        hanging = asyncio.create_task(client.call(InferenceRequest("h", "{}"), {**BODY, "messages": [
            {"role": "user", "content": "hang"}]}))
        await asyncio.sleep(0.1)
        for i in range(5):  # the model answers others quickly: its timeout drops from 60 s to the 0.5 s floor
            assert isinstance((await client.call(InferenceRequest(f"r{i}", "{}"), BODY)).outcome, Success)
        result = await asyncio.wait_for(hanging, 5)
    finally:
        await client.aclose()
    assert isinstance(result.outcome, Failure) and result.outcome.code == "read_timeout", result.outcome
    assert "adaptive timeout of 0.5 s" in result.outcome.message
    assert time.monotonic() - started < 2  # not the 60 s ceiling it started with


async def test_a_call_slower_than_the_tail_is_hedged_and_the_first_answer_wins() -> None:
    seen: dict[bytes, int] = {}

    async def first_copy_hangs(request: httpx.Request) -> httpx.Response:
        seen[request.content] = seen.get(request.content, 0) + 1
        if b"once" in request.content and seen[request.content] == 1:
            await asyncio.sleep(3600)  # this copy never answers; the hedge does
        return httpx.Response(200, json=ANSWER)

    client = LLMClient(Settings(llm_base_url="http://llm.test/v1", llm_timeout_s=60),
                       transport=httpx.MockTransport(first_copy_hangs))
    client.timeouts = AdaptiveTimeout(60, floor_s=30, min_samples=5)  # the timeout stays 30 s: only a hedge helps
    try:
        for i in range(5):
            assert isinstance((await client.call(InferenceRequest(f"r{i}", "{}"), BODY)).outcome, Success)
        started = time.monotonic()
        result = await asyncio.wait_for(client.call(InferenceRequest("h", "{}"), {**BODY, "messages": [
            {"role": "user", "content": "once"}]}), 5)
    finally:
        await client.aclose()
    assert isinstance(result.outcome, Success), result.outcome
    assert time.monotonic() - started < 2  # the tail of instant answers is the 0.5 s floor, then one check
    assert client.hedged == 1
    tail = client.timeouts.tail_s("m")
    assert tail is not None and tail < 0.3  # the hedge's own latency was learnt, not the hang's wait before it


async def test_hedges_are_rationed_and_off_at_ratio_zero() -> None:
    async def always_hangs_once(request: httpx.Request) -> httpx.Response:
        if b"hang" in request.content:
            await asyncio.sleep(3600)
        return httpx.Response(200, json=ANSWER)

    client = LLMClient(Settings(llm_base_url="http://llm.test/v1", llm_timeout_s=60, llm_hedge_ratio=0),
                       transport=httpx.MockTransport(always_hangs_once))
    client.timeouts = AdaptiveTimeout(60, floor_s=1.5, min_samples=5)
    try:
        for i in range(5):
            await client.call(InferenceRequest(f"r{i}", "{}"), BODY)
        result = await asyncio.wait_for(client.call(InferenceRequest("h", "{}"), {**BODY, "messages": [
            {"role": "user", "content": "hang"}]}), 5)
    finally:
        await client.aclose()
    assert isinstance(result.outcome, Failure) and result.outcome.code == "read_timeout"
    assert client.hedged == 0
