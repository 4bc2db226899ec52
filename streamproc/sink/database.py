"""The sink's database connection: migrations on open, then one transaction per batch of rows.

Both drivers are DB-API connections, so one class serves both; what differs is a :class:`Dialect`. The
calls block, so the consumer runs them in a thread (``asyncio.to_thread``) and keeps its heartbeats.
A batch the driver refuses for its data (not for the connection) is written again row by row, and the rows
refused alone go to ``rejected_rows``: one row never stops the sink.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from streamproc.errors import UserFacingError
from streamproc.sink import schema
from streamproc.sink.rows import RejectedRow, RowBatch, iso_ms, rejected_row
from streamproc.sink.target import PostgresTarget, SqliteTarget, Target


class Connection(Protocol):
    def cursor(self) -> Any: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class Dialect:
    placeholder: str
    begin: str | None  # None: the driver opens the transaction itself
    lock_migrations: str | None  # serialises two sinks that migrate the same database at once
    # what the driver raises for a row's data (a NUL, a number out of range, a broken constraint), as against
    # the connection or the server: those stop the write and are retried, these set the row aside
    row_errors: tuple[type[Exception], ...] = ()


# errors of the data in Python itself, raised while binding a row, whichever the driver
_DATA_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, OverflowError, RecursionError)
SQLITE = Dialect(placeholder="?", begin="BEGIN IMMEDIATE", lock_migrations=None,  # IMMEDIATE locks already
                 row_errors=(*_DATA_ERRORS, sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError,
                             sqlite3.ProgrammingError))
# any constant works as an advisory lock id; this one is "sink" in ASCII
POSTGRES = Dialect(placeholder="%s", begin=None, lock_migrations="SELECT pg_advisory_xact_lock(1936289643)",
                   row_errors=_DATA_ERRORS)  # psycopg's own are added once it is imported


class DatabaseError(UserFacingError):
    """The database cannot be opened or written."""


class SinkDatabase:
    """Writes :class:`RowBatch` es idempotently: replaying one gives the same rows."""

    def __init__(self, connection: Connection, dialect: Dialect) -> None:
        self._connection = connection
        self._dialect = dialect

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        cursor = self._connection.cursor()
        try:
            if self._dialect.begin is not None:
                cursor.execute(self._dialect.begin)
            yield cursor
            self._connection.commit()
        except BaseException:
            self._connection.rollback()
            raise
        finally:
            cursor.close()

    def _sql(self, statement: str) -> str:
        return schema.placeholders(statement, self._dialect.placeholder)

    def migrate(self) -> int:
        """Bring the schema up to date; the version it is at."""
        with self._transaction() as cursor:
            if self._dialect.lock_migrations is not None:
                cursor.execute(self._dialect.lock_migrations)
            cursor.execute(schema.CREATE_VERSION_TABLE)
            cursor.execute(schema.CURRENT_VERSION)
            version = int(cursor.fetchone()[0])
            for migration in schema.pending(version):
                for statement in migration.statements:
                    cursor.execute(statement)
                cursor.execute(self._sql(schema.RECORD_VERSION),
                               (migration.version, migration.description, iso_ms(int(time.time() * 1000))))
                version = migration.version
        return version

    def write(self, rows: RowBatch) -> list[RejectedRow]:
        """All of ``rows`` in one transaction, committed together or not at all; if the driver refuses a row's
        data, each row alone, and those it refuses are set aside. Gives the rows set aside (the batch's own,
        records that made no row, and those refused here), all written to ``rejected_rows``."""
        try:
            with self._transaction() as cursor:
                self._write_rows(cursor, rows)
                self._write_rejected(cursor, rows.rejected.values())
            return list(rows.rejected.values())
        except self._dialect.row_errors:
            pass  # some row's data: find which, below
        rejected = dict(rows.rejected)
        for origin, request_id, single in rows.singles():
            try:
                with self._transaction() as cursor:
                    self._write_rows(cursor, single)
            except self._dialect.row_errors as exc:
                refused = rejected_row(origin, request_id, f"not written: {type(exc).__name__}: {exc}")
                rejected.setdefault(refused.key, refused)
        with self._transaction() as cursor:
            self._write_rejected(cursor, rejected.values())
        return list(rejected.values())

    def _write_rows(self, cursor: Any, rows: RowBatch) -> None:
        for statement, values in ((schema.INSERT_RESULT, list(rows.results.values())),
                                  (schema.UPSERT_FAILURE, list(rows.failures.values())),
                                  (schema.INSERT_DEAD_LETTER, list(rows.dead_letters.values())),
                                  (schema.RESOLVE, sorted(rows.touched()))):
            if values:
                cursor.executemany(self._sql(statement), values)

    def _write_rejected(self, cursor: Any, rejected: Iterable[RejectedRow]) -> None:
        values = list(rejected)
        if values:
            cursor.executemany(self._sql(schema.INSERT_REJECTED), values)

    def read(self, statement: str, values: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """The rows one query gives (one statement: one snapshot). No write lock is taken, so a sink keeps
        writing meanwhile."""
        cursor = self._connection.cursor()
        try:
            cursor.execute(self._sql(statement), values)
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            cursor.close()
            self._connection.rollback()  # ends the transaction psycopg opens for any statement

    def close(self) -> None:
        self._connection.close()


def open_database(target: Target) -> SinkDatabase:
    """Connect to ``target`` and migrate it; a :class:`DatabaseError` says why not."""
    database = SinkDatabase(*(_sqlite(target) if isinstance(target, SqliteTarget) else _postgres(target)))
    try:
        database.migrate()
    except BaseException:
        database.close()
        raise
    return database


def _sqlite(target: SqliteTarget) -> tuple[Connection, Dialect]:
    if not target.path.parent.is_dir():
        raise DatabaseError(f"cannot create {target.describe()}: no directory {target.path.parent.absolute()} "
                            "(an absolute path takes four slashes: sqlite:////path/to.db)")
    try:
        # autocommit mode: the transactions are the explicit BEGIN IMMEDIATE ... COMMIT above
        connection = sqlite3.connect(target.path, isolation_level=None, timeout=30.0, check_same_thread=False)
        # WAL lets readers query while the sink writes; FULL syncs every commit, so offsets committed after it
        # never point past rows a power loss took back
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
    except sqlite3.Error as exc:
        raise DatabaseError(f"cannot open {target.describe()}: {exc}") from exc
    return connection, SQLITE


def _postgres(target: PostgresTarget) -> tuple[Connection, Dialect]:
    try:
        import psycopg
    except ImportError as exc:
        raise DatabaseError("PostgreSQL needs psycopg 3: pip install 'streamproc[postgres]'") from exc
    try:
        connection = psycopg.connect(target.conninfo, connect_timeout=10)
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot connect to {target.describe()}: {' '.join(str(exc).split())}") from exc
    return connection, dataclasses.replace(POSTGRES, row_errors=(*POSTGRES.row_errors, psycopg.DataError,
                                                                 psycopg.IntegrityError, psycopg.NotSupportedError))
