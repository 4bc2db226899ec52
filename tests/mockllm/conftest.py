"""Fixtures of the mock-llm tests: an in-process server on a free loopback port and an HTTP session."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from streamproc.mockllm.runner import MockLLMHandle, running_mock_llm


@pytest.fixture
async def mock() -> AsyncIterator[MockLLMHandle]:
    """The clean profile at zero latency: faults come only when a test forces them."""
    async with running_mock_llm("clean") as handle:
        yield handle


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


class Clock:
    """A monotonic clock a test moves by hand (``clock.now += 5``): provider batches change phase without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()
