"""Fixtures shared by the integration tests (the broker is the session one, from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.pipeline import MockServer, start_mock


@pytest.fixture
def clean_mock() -> Iterator[MockServer]:
    """A mock LLM server with no faults, as a child process."""
    server = start_mock("clean")
    yield server
    server.stop()
