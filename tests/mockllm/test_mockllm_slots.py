"""Slots over HTTP: with N slots the server works on N requests at a time and the others queue, first come
first served, before their own latency starts (llama.cpp's server with ``--parallel N``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from streamproc.mockllm.latency import FixedLatency
from streamproc.mockllm.profiles import Overrides
from streamproc.mockllm.runner import MockLLMHandle, running_mock_llm

LATENCY = 0.4


def chat(content: str) -> dict[str, Any]:
    return {"model": "mock-small", "messages": [{"role": "user", "content": content}]}


def slotted(slots: int, latency: float = LATENCY) -> Overrides:
    return Overrides(slots=slots, latency=FixedLatency(latency))


async def timed_post(
    http: aiohttp.ClientSession, mock: MockLLMHandle, content: str, started: float, **headers: str
) -> tuple[str, int, float]:
    """The content, the status, and when the answer came (seconds since ``started``)."""
    async with http.post(f"{mock.url}/chat/completions", json=chat(content), headers=headers) as response:
        await response.read()
        return content, response.status, time.monotonic() - started


async def in_order(http: aiohttp.ClientSession, mock: MockLLMHandle, count: int) -> list[tuple[str, int, float]]:
    """``count`` concurrent requests that arrive in the order of their names, each sent once the one before it
    is in (a fixed gap between sends let a loaded machine end the first before the last arrived)."""
    started = time.monotonic()
    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(timed_post(http, mock, f"request {i}", started)))
        await wait_for(mock, "arrived", i + 1)
    return await asyncio.gather(*tasks)


async def wait_for(mock: MockLLMHandle, key: str, value: int) -> None:
    for _ in range(300):
        if mock.stats()["queue"][key] == value:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"queue {key} never reached {value}: {mock.stats()['queue']}")


async def test_one_slot_answers_one_request_after_the_other(http: aiohttp.ClientSession) -> None:
    async with running_mock_llm("clean", overrides=slotted(1)) as mock:
        answers = await in_order(http, mock, 5)
        queue = mock.stats()["queue"]
    assert [status for _, status, _ in answers] == [200] * 5
    finished = [at for _, _, at in answers]
    assert finished == sorted(finished)  # first come, first served
    for i, at in enumerate(finished):  # each one's latency starts when the one before it is done
        assert at >= (i + 1) * LATENCY, finished
    assert finished[-1] < 5 * LATENCY + 0.5
    assert queue["slots"] == 1 and (queue["busy"], queue["queued"]) == (0, 0)
    assert (queue["max_queued"], queue["waited"], queue["abandoned"]) == (4, 4, 0)
    # they waited about 1 + 2 + 3 + 4 latencies (they arrived within milliseconds of each other)
    assert 10 * LATENCY - 0.5 <= queue["queued_s_total"] <= 10 * LATENCY + 0.5


async def test_two_slots_work_on_two_at_a_time(http: aiohttp.ClientSession) -> None:
    async with running_mock_llm("clean", overrides=slotted(2)) as mock:
        answers = await in_order(http, mock, 4)
        queue = mock.stats()["queue"]
    finished = [at for _, _, at in answers]
    assert max(finished[:2]) < 2 * LATENCY <= min(finished[2:])
    assert max(finished) < 2 * LATENCY + 0.5
    assert (queue["max_queued"], queue["waited"]) == (2, 2)


async def test_a_client_that_gives_up_leaves_the_queue(http: aiohttp.ClientSession) -> None:
    async with running_mock_llm("clean", overrides=slotted(1, latency=0.5)) as mock:
        started = time.monotonic()
        first = asyncio.create_task(timed_post(http, mock, "first", started))
        await wait_for(mock, "busy", 1)
        with pytest.raises(asyncio.TimeoutError):  # queued behind "first", gives up after 0.1 s
            async with http.post(
                f"{mock.url}/chat/completions", json=chat("impatient"), timeout=aiohttp.ClientTimeout(total=0.1)
            ):
                pass
        await wait_for(mock, "abandoned", 1)
        assert mock.stats()["queue"]["queued"] == 0
        _, _, second_at = await timed_post(http, mock, "second", started)
        _, _, first_at = await first
        assert 0.5 <= first_at < 0.8
        assert 1.0 <= second_at < 1.4  # right after "first": the one that left took no turn (that ends >= 1.5)
        queue = mock.stats()["queue"]
    assert (queue["waited"], queue["abandoned"], queue["queued"], queue["busy"]) == (2, 1, 0, 0)


async def test_error_answers_do_not_wait_for_a_slot(http: aiohttp.ClientSession) -> None:
    """What the server refuses (bad requests, 429s, error faults) it refuses at once, as llama.cpp does."""
    async with running_mock_llm("clean", overrides=slotted(1, latency=0.5)) as mock:
        started = time.monotonic()
        busy = asyncio.create_task(timed_post(http, mock, "busy", started))
        await wait_for(mock, "busy", 1)
        _, status, at = await timed_post(http, mock, "fails", started, **{"x-mock-fault": "server_error"})
        assert status == 500 and at < 0.3
        await busy
        assert mock.stats()["queue"]["waited"] == 0


async def test_stopping_the_server_does_not_wait_for_the_queue() -> None:
    async with aiohttp.ClientSession() as http:
        async with running_mock_llm("clean", overrides=slotted(1, latency=30.0)) as mock:
            started = time.monotonic()
            calls = [asyncio.create_task(timed_post(http, mock, str(i), started)) for i in range(3)]
            await wait_for(mock, "queued", 2)
            stopping = time.monotonic()
        assert time.monotonic() - stopping < 1.5
        for call in calls:
            with pytest.raises(aiohttp.ClientError):
                await call
        assert mock.stats()["queue"]["busy"] == 0
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert leftover == []


async def test_without_slots_there_is_no_queue(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{mock.root}/stats") as response:
        assert (await response.json())["queue"] is None


async def test_reset_forgets_the_queue_history(http: aiohttp.ClientSession) -> None:
    async with running_mock_llm("clean", overrides=slotted(1, latency=0.05)) as mock:
        await in_order(http, mock, 3)
        assert mock.stats()["queue"]["waited"] == 2
        async with http.post(f"{mock.root}/control/reset", json={}) as response:
            assert response.status == 200
        queue = mock.stats()["queue"]
    assert (queue["arrived"], queue["max_queued"], queue["waited"], queue["abandoned"], queue["queued_s_total"]) == (
        0, 0, 0, 0, 0)
