"""What the soak run reads of its processes: a worker's memory, open files and CPU time from ``/proc``, the
state changelog's bytes on the broker's disk, and how long each restart took to restore its table."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_RECOVERED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] .*\[\^---Recovery\]: Recovery complete")


@dataclass(frozen=True)
class ProcessReading:
    rss_mb: float
    open_files: int
    cpu_s: float  # user + system since the process started


def read_process(pid: int) -> ProcessReading | None:
    """None when the process is gone (killed between the check and the read)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        open_files = len(os.listdir(f"/proc/{pid}/fd"))
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    cpu_ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return ProcessReading(rss_kb / 1024, open_files, cpu_ticks / _CLOCK_TICKS)


def open_file_kind(target: str) -> str:
    """What an open file descriptor is, from its ``/proc/PID/fd`` link: RocksDB's table files are told apart
    from its other files (write-ahead logs, manifests, info logs), sockets, pipes and the rest, so that a
    growing count says what grows."""
    if target.startswith("socket:"):
        return "sockets"
    if target.startswith("pipe:"):
        return "pipes"
    if target.startswith("anon_inode:"):
        return "event fds"  # epoll, eventfd, timerfd
    if target.endswith(".sst"):
        return "rocksdb tables"
    name = target.rsplit("/", 1)[-1]
    if name.endswith(".log") or name.startswith(("MANIFEST-", "LOG", "LOCK", "OPTIONS-", "CURRENT")):
        return "rocksdb other"
    return "other files"


def open_files_by_kind(pid: int) -> dict[str, int]:
    """The process's open file descriptors counted by :func:`open_file_kind`; empty when the process is gone."""
    kinds: dict[str, int] = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return kinds
    for name in names:
        try:
            kind = open_file_kind(os.readlink(f"/proc/{pid}/fd/{name}"))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # closed between the listing and the read
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def changelog_bytes(broker_data: Path, changelog_topic: str) -> int:
    """Bytes of the changelog's log segments on the broker's disk (not its indexes, which the broker allocates
    at full size up front)."""
    total = 0
    for directory in broker_data.rglob(f"{changelog_topic}-*"):
        if directory.is_dir() and directory.name.rsplit("-", 1)[1].isdigit():
            total += sum(f.stat().st_size for f in directory.glob("*.log"))
    return total


def recovered_at(log_text_after_start: str) -> datetime | None:
    """When the first recovery after a start completed (faust's ``Recovery complete`` line), as logged."""
    for line in log_text_after_start.splitlines():
        match = _RECOVERED.match(line)
        if match is not None:
            return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return None
