"""Reading a worker's log by faust's timestamps (the state benchmarks time faust's recovery from it)."""

from __future__ import annotations

import re
from datetime import datetime

# faust's recovery logs the changelog's highwaters once it knows them (the reading begins: the bulk read of
# app/bulk_restore.py, then faust's own), and says when it is done, both at INFO
RECOVERY_STARTS = "Highwater for active changelog partitions"
RECOVERY_ENDS = "Recovery complete"
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def timed_lines(log_text: str) -> list[tuple[float, str]]:
    """The log's lines that start with a timestamp, with it (epoch seconds)."""
    lines = []
    for line in log_text.splitlines():
        stamp = _LOG_TIME.match(line)
        if stamp is not None:
            lines.append((datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), line))
    return lines


def recovery_span_s(log_text: str, starts: str = RECOVERY_STARTS, ends: str = RECOVERY_ENDS) -> float | None:
    """Seconds between the first log line containing ``starts`` and the first after it containing ``ends``."""
    began = None
    for when, line in timed_lines(log_text):
        if began is None and starts in line:
            began = when
        elif began is not None and ends in line:
            return when - began
    return None
