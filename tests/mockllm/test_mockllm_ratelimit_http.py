"""The rate limiter in real time: a flood over 10 s at RPM 600 gets 100 +- 5 answers, the rest 429s."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from streamproc.mockllm.profiles import Overrides
from streamproc.mockllm.runner import running_mock_llm

WINDOW_S = 10.0
CLIENTS = 8


async def test_rpm_600_admits_about_100_in_10_seconds() -> None:
    statuses: list[int] = []
    hints_ms: list[int] = []
    async with (
        running_mock_llm("clean", overrides=Overrides(rpm=600)) as mock,
        aiohttp.ClientSession() as http,
    ):
        url = f"{mock.url}/chat/completions"
        deadline = time.monotonic() + WINDOW_S

        async def flood(client: int) -> None:
            i = 0
            while time.monotonic() < deadline:
                body = {"model": "mock-small", "messages": [{"role": "user", "content": f"{client}-{i}"}]}
                async with http.post(url, json=body) as response:
                    statuses.append(response.status)
                    if response.status == 429:
                        hints_ms.append(int(response.headers["retry-after-ms"]))
                i += 1
                await asyncio.sleep(0.002)  # a flood still (hundreds per second), without burning both cores

        await asyncio.gather(*(flood(c) for c in range(CLIENTS)))
        stats = mock.stats()

    admitted = statuses.count(200)
    assert 95 <= admitted <= 105, admitted
    assert set(statuses) == {200, 429}
    assert statuses.count(429) > 3 * admitted  # it was really a flood
    assert max(hints_ms) <= 100  # one request every 100 ms: never a longer wait than that
    assert stats["by_outcome"] == {"ok": admitted, "rate_limited": statuses.count(429)}
