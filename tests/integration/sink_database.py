"""The sink's database as the integration tests read it, SQLite or a throwaway PostgreSQL."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import psycopg


@dataclass
class Database:
    """The sink's database as the test reads it, whichever it is."""

    url: str

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        if self.url.startswith("sqlite:///"):
            with sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=30) as connection:
                return connection.execute(sql).fetchall()
        with psycopg.connect(self.url) as connection:
            return connection.execute(sql).fetchall()

    def count(self, sql: str) -> int:
        try:
            return int(self.query(sql)[0][0])
        except (sqlite3.OperationalError, psycopg.errors.UndefinedTable):
            return 0  # the sink has not created its tables yet
