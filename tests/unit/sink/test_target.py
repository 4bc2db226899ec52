"""``--to`` URLs: the two databases, and a clear refusal of anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamproc.sink.target import DatabaseUrlError, PostgresTarget, SqliteTarget, parse_target


def test_sqlite_paths_follow_sqlalchemy() -> None:
    assert parse_target("sqlite:///out.db") == SqliteTarget(Path("out.db"))
    assert parse_target("sqlite:///data/out.db") == SqliteTarget(Path("data/out.db"))
    assert parse_target("sqlite:////var/lib/out.db") == SqliteTarget(Path("/var/lib/out.db"))
    assert parse_target("SQLITE:///out.db") == SqliteTarget(Path("out.db"))


def test_postgres_urls_go_to_libpq_as_given() -> None:
    for url in ("postgresql://u@h:5432/db", "postgres://u:p@h/db", "postgresql:///db?host=/run/postgresql"):
        assert parse_target(url) == PostgresTarget(url)


def test_the_password_never_shows() -> None:
    assert parse_target("postgresql://u:s3cret@h:5432/db").describe() == "postgresql://u:***@h:5432/db"
    assert parse_target("postgresql://u@h/db").describe() == "postgresql://u@h/db"


@pytest.mark.parametrize("url, says", [
    ("out.db", "is not a database URL"),
    ("sqlite://host/out.db", "names a file, not a host"),
    ("sqlite://", "names a file, not a host"),
    ("sqlite:///", "names no database file"),
    ("sqlite:///dir/", "names no database file"),
    ("mysql://u@h/db", "unsupported database 'mysql'"),
])
def test_bad_urls_say_what_is_accepted(url: str, says: str) -> None:
    with pytest.raises(DatabaseUrlError, match=says) as raised:
        parse_target(url)
    assert "sqlite:///relative/path.db" in str(raised.value) and "postgresql://" in str(raised.value)


@pytest.mark.parametrize("url", ["mysql://u:s3cret@h/db", "mysql://u:s3cret@h:notaport/db", "u:s3cret@h/db"])
def test_a_refused_url_is_shown_without_its_password(url: str) -> None:
    with pytest.raises(DatabaseUrlError) as refused:
        parse_target(url)
    assert "s3cret" not in str(refused.value) and "h" in str(refused.value)
