"""What ``streamproc lag`` prints: a table like ``kafka-consumer-groups --describe``, or a JSON document.

Conventions of the table (the same as ``kafka-consumer-groups --describe`` unless said otherwise):

* one row per partition; a partition without a committed offset shows ``-`` as its current offset (its lag
  counts from the log start offset: :mod:`streamproc.core.lag`);
* faust's internal topics are marked with ``*`` and left out of the group totals;
* rates and drain estimates show ``-`` where unknown; one summary line per group follows the rows.
"""

from __future__ import annotations

import json
from typing import Any

from streamproc.core.durations import format_duration
from streamproc.core.lag import GroupLag, LagReport

COLUMNS = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "RATE/s", "ETA")


def _format_rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.1f}"


def format_table(report: LagReport) -> str:
    """Aligned columns like ``kafka-consumer-groups --describe``, then one summary line per group.

    Internal (faust) topics are marked with ``*`` and left out of the totals.
    """
    rows: list[tuple[str, ...]] = [COLUMNS]
    for group in report.groups:
        for p in group.partitions:
            rows.append((group.group, p.topic + ("*" if p.internal else ""), str(p.partition),
                         "-" if p.committed is None else str(p.committed), str(p.end), str(p.lag),
                         _format_rate(p.rate), format_duration(p.eta_seconds)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.append("")
    for group in report.groups:
        lines.append(summary_line(group, report.interval_s))
    if any(p.internal for g in report.groups for p in g.partitions):
        lines.append("* faust's internal topic (table changelog, leader or reply topic): not counted in the lag")
    return "\n".join(lines)


def summary_line(group: GroupLag, interval_s: float | None) -> str:
    """``streamproc: lag 420, consuming 12.5 records/s, drained in ~34s (Stable, 2 members)``."""
    text = f"{group.group}: lag {group.lag}"
    if interval_s is not None:
        text += f", consuming {_format_rate(group.rate)} records/s"
        if group.lag == 0:
            text += ", nothing to drain"
        elif group.eta_seconds is None:
            text += ", not draining (no progress, or records arrive as fast as they are consumed)"
        else:
            text += f", drained in ~{format_duration(group.eta_seconds)}"
    if group.state is not None:
        members = f", {group.members} member{'' if group.members == 1 else 's'}" if group.members is not None else ""
        text += f" ({group.state}{members})"
    if not group.partitions:
        text += "; no committed offsets"
    return text


def _number(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def to_json(report: LagReport, max_lag: int | None = None) -> dict[str, Any]:
    """The stable JSON document of ``streamproc lag --json`` (keys documented in docs/cli.md)."""
    return {
        "taken_at": round(report.taken_at, 3),
        "interval_s": _number(report.interval_s),
        "max_lag": max_lag,
        "over_max_lag": [g.group for g in report.over(max_lag)] if max_lag is not None else [],
        "groups": [{
            "group": g.group,
            "state": g.state,
            "members": g.members,
            "lag": g.lag,
            "rate": _number(g.rate),
            "eta_seconds": _number(g.eta_seconds),
            "partitions": [{
                "topic": p.topic,
                "partition": p.partition,
                "internal": p.internal,
                "committed": p.committed,
                "end": p.end,
                "start": p.start,
                "lag": p.lag,
                "rate": _number(p.rate),
                "eta_seconds": _number(p.eta_seconds),
            } for p in g.partitions],
        } for g in report.groups],
    }


def dumps(report: LagReport, max_lag: int | None = None) -> str:
    return json.dumps(to_json(report, max_lag), indent=2)
