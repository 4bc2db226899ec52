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
