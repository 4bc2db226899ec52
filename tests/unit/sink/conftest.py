"""A fresh SQLite sink database per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streamproc.sink.database import SinkDatabase, open_database
from streamproc.sink.target import SqliteTarget


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "sink.db"


@pytest.fixture
def database(path: Path) -> Iterator[SinkDatabase]:
    opened = open_database(SqliteTarget(path))
    yield opened
    opened.close()
