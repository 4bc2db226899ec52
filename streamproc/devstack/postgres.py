"""A throwaway PostgreSQL cluster in a temporary directory, for the sink's tests and benchmark.

It runs the distribution's server binaries (Debian's ``postgresql`` package: ``/usr/lib/postgresql/<v>/bin``)
on 127.0.0.1 and a free port, with trust authentication for the superuser ``streamproc``; everything it
writes is under one temporary directory, removed on stop. PostgreSQL refuses to run as root, so as root the
cluster runs as the package's ``postgres`` user, which then owns the directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from streamproc.devstack.broker import free_port
from streamproc.devstack.throwaway import Throwaway
from streamproc.errors import UserFacingError

SUPERUSER = "streamproc"
UNPRIVILEGED_USER = "postgres"  # created by Debian's postgresql package


def server_bin_dir() -> Path:
    """The newest installed server's bin directory; a :class:`UserFacingError` says what to install."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name)
                   if p.parent.parent.name.isdigit() else 0)
    if not found:
        raise UserFacingError("no PostgreSQL server binaries under /usr/lib/postgresql: apt-get install postgresql")
    return found[-1].parent


class ThrowawayPostgres(Throwaway):
    """``with ThrowawayPostgres() as pg: pg.url`` -- a running cluster until the block ends."""

    def __init__(self) -> None:
        self._bin = server_bin_dir()
        self._root = Path(tempfile.mkdtemp(prefix="streamproc-pg-"))
        self._data = self._root / "data"
        self._run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            self._run_as = {"user": UNPRIVILEGED_USER, "group": UNPRIVILEGED_USER}
            shutil.chown(self._root, UNPRIVILEGED_USER, UNPRIVILEGED_USER)
        self.port = free_port()
        self.url = f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def _pg(self, tool: str, *args: str) -> None:
        result = subprocess.run([str(self._bin / tool), *args], capture_output=True, text=True, check=False,
                                cwd=self._root, **self._run_as)
        if result.returncode != 0:
            raise UserFacingError(f"{tool} failed ({result.returncode}): {(result.stderr or result.stdout)[-2000:]}")

    def start(self) -> ThrowawayPostgres:
        self._pg("initdb", "-D", str(self._data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self._root}"
        self._pg("pg_ctl", "-D", str(self._data), "-o", options, "-l", str(self._root / "server.log"), "-w",
                 "-t", "60", "start")
        return self

    def stop(self) -> None:
        try:
            if (self._data / "postmaster.pid").exists():
                self._pg("pg_ctl", "-D", str(self._data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self._root, ignore_errors=True)
