"""The adaptive timeout reaches calls already running: an early hang costs seconds, not the ceiling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import httpx

from streamproc.core.events import InferenceRequest
from streamproc.core.guards.long_requests import LongRequests, timing_key
from streamproc.core.guards.timeouts import AdaptiveTimeout
from streamproc.core.outcome import Failure, Success
from streamproc.llm.client import LLMClient, hedge_permit
from streamproc.settings import Settings

ENDPOINT = Settings(llm_base_url="http://llm.test/v1", llm_timeout_s=60).llm_endpoint
BODY = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                     "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


async def answer(request: httpx.Request) -> httpx.Response:
    if b"hang" in request.content:
        await asyncio.sleep(3600)  # a server that never answers this one
    return httpx.Response(200, json=ANSWER)


async def test_a_hang_that_started_before_the_timeout_was_learnt_is_cut_once_it_is() -> None:
    client = LLMClient(ENDPOINT, connections=256, hedge_ratio=0.03,
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

    client = LLMClient(ENDPOINT, connections=256, hedge_ratio=0.03,
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

    client = LLMClient(ENDPOINT, connections=256, hedge_ratio=0,
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


def one_slot(seconds: float) -> Callable[[httpx.Request], Coroutine[Any, Any, httpx.Response]]:
    """A server that works on one call at a time, first come first served (llama.cpp with one slot)."""
    slot = asyncio.Lock()

    async def serve(request: httpx.Request) -> httpx.Response:
        async with slot:
            await asyncio.sleep(seconds)
        return httpx.Response(200, json=ANSWER)
    return serve


async def test_calls_queued_behind_the_clients_own_are_not_cut_while_the_server_answers_them() -> None:
    """Six calls at once to one slot, 0.3 s each, timeout 0.9 s: the last waits 1.5 s for the server, which
    is busy with the calls sent before it, not hung (a real llama.cpp server lost 16 of 100 calls so)."""
    client = LLMClient(ENDPOINT, connections=256, hedge_ratio=0.03,
                       transport=httpx.MockTransport(one_slot(0.3)))
    client.timeouts = AdaptiveTimeout(60, floor_s=0.9, quantile=0.5, min_samples=1)
    for _ in range(200):  # what it learnt before: 0.3 s a call (the queue's longer answers do not move it)
        client.timeouts.observe("m", 0.3)
    try:
        results = await asyncio.gather(*(client.call(InferenceRequest(f"r{i}", "{}"), BODY) for i in range(6)))
    finally:
        await client.aclose()
    assert [type(result.outcome) for result in results] == [Success] * 6, [r.outcome for r in results]
    assert max(result.latency_ms for result in results) > 1500  # the last one did wait behind the others


async def test_calls_behind_others_at_a_silent_server_are_cut_after_one_timeout_not_more() -> None:
    """A hung server answers none of them: the call behind is not waiting for a busy server."""
    client = LLMClient(ENDPOINT, connections=256, hedge_ratio=0.03,
                       transport=httpx.MockTransport(answer))
    client.timeouts = AdaptiveTimeout(60, floor_s=0.5, min_samples=1)
    client.timeouts.observe("m", 0.1)
    hang = {**BODY, "messages": [{"role": "user", "content": "hang"}]}
    started = time.monotonic()
    try:
        results = await asyncio.wait_for(asyncio.gather(
            *(client.call(InferenceRequest(f"h{i}", "{}"), hang) for i in range(3))), 5)
    finally:
        await client.aclose()
    for result in results:
        assert isinstance(result.outcome, Failure) and result.outcome.code == "read_timeout", result.outcome
    last = results[2].outcome
    assert isinstance(last, Failure) and "behind 2" in last.message
    assert time.monotonic() - started < 1.5  # one timeout (0.5 s) and a check, side by side


async def hedges_of(client: LLMClient, permit: bool | None) -> list[bool]:
    """One slow call (hedged once 5 instant ones taught its tail), with the pacing layer's permit saying
    ``permit`` (None: no pacing layer); returns what the permit was asked."""
    asked: list[bool] = []

    def ask() -> bool:
        assert permit is not None
        asked.append(permit)
        return permit

    for i in range(5):
        await client.call(InferenceRequest(f"r{i}", "{}"), BODY)
    token = hedge_permit.set(ask if permit is not None else None)
    try:
        await asyncio.wait_for(client.call(InferenceRequest("h", "{}"), {**BODY, "messages": [
            {"role": "user", "content": "once"}]}), 5)
    finally:
        hedge_permit.reset(token)
    return asked


async def test_a_hedge_goes_only_when_the_rate_limiter_lets_it() -> None:
    for permit, hedged in ((True, 1), (False, 0), (None, 1)):
        client = LLMClient(ENDPOINT, connections=256, hedge_ratio=0.03, transport=httpx.MockTransport(
            first_copy_hangs_for(1.2)))
        client.timeouts = AdaptiveTimeout(60, floor_s=30, min_samples=5)
        try:
            asked = await hedges_of(client, permit)
        finally:
            await client.aclose()
        assert client.hedged == hedged, permit
        assert asked == ([] if permit is None else [permit])  # asked once, when the call was late


def first_copy_hangs_for(seconds: float) -> Callable[[httpx.Request], Coroutine[Any, Any, httpx.Response]]:
    seen: dict[bytes, int] = {}

    async def serve(request: httpx.Request) -> httpx.Response:
        seen[request.content] = seen.get(request.content, 0) + 1
        if b"once" in request.content and seen[request.content] == 1:
            await asyncio.sleep(seconds)
        return httpx.Response(200, json=ANSWER)
    return serve


async def test_a_call_behind_the_clients_own_earlier_calls_is_not_hedged() -> None:
    """Three calls at once to one slot: the first takes 2.2 s, the others 0.05 s once they have the slot. Past
    their tail (1 s, the floor), the two behind are late only because the first holds the slot, and a copy
    would queue behind it too: only the first is hedged (timed from the send alone, all three were)."""
    slot = asyncio.Lock()

    async def serve(request: httpx.Request) -> httpx.Response:
        async with slot:
            await asyncio.sleep(2.2 if b"slow" in request.content else 0.05)
        return httpx.Response(200, json=ANSWER)

    client = LLMClient(ENDPOINT, connections=256, hedge_ratio=1.0, transport=httpx.MockTransport(serve))
    client.timeouts = AdaptiveTimeout(60, floor_s=30, quantile=0.5, min_samples=1)
    client.timeouts.observe("m", 0.3)
    bodies = [{**BODY, "messages": [{"role": "user", "content": "slow"}]}, BODY, BODY]
    try:
        results = await asyncio.gather(*(client.call(InferenceRequest(f"r{i}", "{}"), body)
                                         for i, body in enumerate(bodies)))
    finally:
        await client.aclose()
    assert [type(result.outcome) for result in results] == [Success] * 3
    assert client.hedged == 1


async def test_a_long_call_is_not_cut_by_the_timeout_short_calls_taught() -> None:
    """Short answers teach a 0.5 s timeout; a long request (here a long context, the same completion budget) is
    timed against long calls (the ceiling until they taught one), so it is not cut as hung."""

    async def long_takes_a_while(request: httpx.Request) -> httpx.Response:
        if len(request.content) > 4000:
            await asyncio.sleep(1.0)  # a long prompt, far past the short calls' timeout
        return httpx.Response(200, json=ANSWER)

    client = LLMClient(ENDPOINT, connections=256, hedge_ratio=0, transport=httpx.MockTransport(long_takes_a_while),
                       long_requests=LongRequests(threshold_tokens=1000, share=0.25))
    client.timeouts = AdaptiveTimeout(60, floor_s=0.5, min_samples=5)
    try:
        for i in range(5):
            assert isinstance((await client.call(InferenceRequest(f"r{i}", "{}"), BODY)).outcome, Success)
        assert client.timeouts.timeout_s("m", 8) == 0.5
        result = await client.call(InferenceRequest("long", "{}"), {**BODY, "messages": [
            {"role": "user", "content": "x" * 8000}]})
    finally:
        await client.aclose()
    assert isinstance(result.outcome, Success), result.outcome
    assert client.timeouts.tail_s(timing_key("m", long=True)) is None  # one long sample so far, its own
