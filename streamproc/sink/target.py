"""Which database a ``--to`` URL names: SQLite (a file, nothing to install) or PostgreSQL (shared use).

SQLite URLs follow SQLAlchemy's form, which people already know: ``sqlite:///relative.db`` and
``sqlite:////absolute/path.db``. PostgreSQL URLs go to libpq as they are, so every libpq form works
(``postgresql://user:secret@host:5432/db``, ``postgresql:///db?host=/run/postgresql``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from streamproc.errors import ExitCode, UserFacingError

FORMS = "sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql://user@host:5432/dbname"


class DatabaseUrlError(UserFacingError):
    """A ``--to`` URL that names no database streamproc can write to."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class SqliteTarget:
    path: Path

    def describe(self) -> str:
        return f"sqlite:///{self.path}"


@dataclass(frozen=True)
class PostgresTarget:
    conninfo: str

    def describe(self) -> str:
        """The URL without its password, for log lines and errors."""
        return _without_password(self.conninfo)


Target = SqliteTarget | PostgresTarget


def parse_target(url: str) -> Target:
    """The database ``url`` names, or a :class:`DatabaseUrlError` that shows the accepted forms."""
    shown = repr(_without_password(url))  # an error names the URL the user gave, never its password
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise DatabaseUrlError(f"{shown} is not a database URL: use {FORMS}")
    if scheme == "sqlite":
        host, slash, path = rest.partition("/")
        if host or not slash:
            raise DatabaseUrlError(f"a SQLite URL names a file, not a host ({url!r}): use {FORMS}")
        if not path or path.endswith("/") or "?" in path:
            raise DatabaseUrlError(f"{url!r} names no database file: use {FORMS}")
        return SqliteTarget(Path(path))
    if scheme in ("postgresql", "postgres"):
        return PostgresTarget(url)
    raise DatabaseUrlError(f"unsupported database {scheme!r} in {shown}: use {FORMS}")


def _without_password(url: str) -> str:
    if "://" not in url:  # user:password@host written without a scheme: urllib sees no credentials in it
        return re.sub(r"^[^/@]*@", "***@", url)
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL urllib can split (a bad port): hide everything before a host
        return re.sub(r"//[^/@]*@", "//***@", url)
    if password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{password}@", ":***@", 1)))
