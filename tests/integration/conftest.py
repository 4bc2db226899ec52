"""Fixtures shared by the integration tests (the broker is the session one, from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streamproc.devstack.apicurio import ThrowawaySchemaRegistry
from streamproc.devstack.postgres import ThrowawayPostgres
from streamproc.settings import Settings
from tests.integration.pipeline import MockServer, start_mock
from tests.integration.sink_database import Database


@pytest.fixture
def clean_mock() -> Iterator[MockServer]:
    """A mock LLM server with no faults, as a child process."""
    server = start_mock("clean")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """The sink's database, once on SQLite and once on a throwaway PostgreSQL."""
    if request.param == "sqlite":
        yield Database(f"sqlite:///{tmp_path / 'sink.db'}")
        return
    with ThrowawayPostgres() as server:
        yield Database(server.url)


@pytest.fixture
def schema_registry() -> Iterator[ThrowawaySchemaRegistry]:
    """An empty Apicurio Registry (Confluent API at ``.confluent_url``), built once into the cache directory."""
    with ThrowawaySchemaRegistry(Settings().cache_dir) as registry:
        yield registry


@pytest.fixture
def schema_registry_with_auth() -> Iterator[ThrowawaySchemaRegistry]:
    """The same registry asking for HTTP basic auth on every path (user and password in ``.credentials``)."""
    with ThrowawaySchemaRegistry(Settings().cache_dir, credentials=("streamproc", "registry-pw-7Qx")) as registry:
        yield registry
