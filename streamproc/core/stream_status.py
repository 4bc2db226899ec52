"""The stream's counts: the requests that name no batch (design §3, "JSON requests"), from the workers' summary of
them (core.batch_summary, the batch ``None``) or folded from the request-state changelog (``--verify``), with how
many arrived and ended in each of the last hours. Both go through :func:`stream_status`, so they agree.

A stream has no manifest and never converges, so what it has instead of ``submitted`` and ``converged`` is
its rate: per clock hour (UTC), how many requests a worker first took and how many ended, by outcome.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from streamproc.core.batch_summary import BatchCounts, LatestState
from streamproc.core.durations import HOUR_MS, HOURS_KEPT
from streamproc.core.events import RequestState
from streamproc.core.vocabulary import FailureLayer, RequestStatus

__all__ = ["HOUR_MS", "MAX_CODES", "MAX_HOURS", "HourCounts", "StreamFold", "StreamStatus", "stream_status"]

MAX_HOURS: Final = HOURS_KEPT
"""The most hours one view shows: a week, so the output stays a screenful of rows and a small JSON document."""
MAX_CODES: Final = 10
"""The failure codes a view names, the most frequent first; the rest are summed under ``other``."""


@dataclass(frozen=True)
class HourCounts:
    """One clock hour of the stream: requests a worker first took in it, and requests that ended in it."""

    start_ms: int
    arrived: int = 0
    succeeded: int = 0
    failed: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"hour": _utc(self.start_ms), "start_ms": self.start_ms, "arrived": self.arrived,
                "succeeded": self.succeeded, "failed": self.failed}


@dataclass(frozen=True)
class StreamStatus:
    """The document ``status --stream --json`` prints (its keys are an interface: docs/cli.md documents them)."""

    requests: int
    succeeded: int
    failed: dict[str, int]
    """Terminal failures by layer."""
    failed_codes: dict[str, int]
    """Terminal failures by code, the ``MAX_CODES`` most frequent, the rest under ``other``."""
    retrying: int
    in_flight: int
    pending: int
    """Written pending and not taken yet; the counts add up to ``requests``."""
    hours: tuple[HourCounts, ...]
    """The last hours, oldest first; the last one is the current hour, so far."""
    last_ended_ms: int = 0
    """When a stream request last ended (0: none has)."""

    @property
    def terminal_failures(self) -> int:
        return sum(self.failed.values())

    def as_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "succeeded": self.succeeded, "failed": dict(self.failed),
                "failed_codes": dict(self.failed_codes), "retrying": self.retrying, "in_flight": self.in_flight,
                "pending": self.pending, "last_ended_ms": self.last_ended_ms or None,
                "hours": [hour.as_json() for hour in self.hours]}

    def format(self) -> str:
        """A few aligned lines and one row per hour for people; ``--json`` is the form for scripts."""
        return _format(self)


def _format(status: StreamStatus) -> str:
    failed = ", ".join(f"{layer} {count}" for layer, count in status.failed.items())
    codes = ", ".join(f"{code} {count}" for code, count in status.failed_codes.items())
    ended = sum(hour.succeeded + hour.failed for hour in status.hours)
    rows = [
        ("stream", "requests without a batch"),
        ("requests", str(status.requests)),
        ("succeeded", str(status.succeeded)),
        ("failed", f"{status.terminal_failures} ({failed})" + (f"; {codes}" if codes else "")),
        ("retrying", str(status.retrying)),
        ("in flight", str(status.in_flight)),
        ("pending", str(status.pending)),
        ("last ended", f"{_utc(status.last_ended_ms)} UTC" if status.last_ended_ms else "never"),
        (f"last {len(status.hours)}h", f"{ended} ended, {ended / max(len(status.hours), 1):.1f}/h"),
    ]
    lines = [f"{name:<10} {value}" for name, value in rows]
    lines.append(f"{'hour (UTC)':<17} {'arrived':>8} {'succeeded':>10} {'failed':>7}")
    lines += [f"{_utc(hour.start_ms):<17} {hour.arrived:>8} {hour.succeeded:>10} {hour.failed:>7}"
              for hour in status.hours]
    return "\n".join(lines)


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


@dataclass
class StreamFold:
    """The latest status per stream request id; ``apply`` takes changelog values in log order."""

    _latest: dict[str, LatestState] = field(default_factory=dict)

    def apply(self, states: Iterable[RequestState]) -> None:
        for state in states:
            if state.batch_id is None:
                self._latest[state.request_id] = LatestState.of(state)

    def status(self, now_ms: int, hours: int) -> StreamStatus:
        """The counts, and the ``hours`` clock hours up to the one ``now_ms`` falls in (1 to ``MAX_HOURS``)."""
        return stream_status(BatchCounts.of(self._latest.values()), now_ms, hours)


def stream_status(counts: BatchCounts, now_ms: int, hours: int) -> StreamStatus:
    """The stream's status from its counts, and the ``hours`` clock hours up to the one ``now_ms`` falls in (1 to
    ``MAX_HOURS``)."""
    if not 1 <= hours <= MAX_HOURS:
        raise ValueError(f"hours must be 1 to {MAX_HOURS}, not {hours}")
    first_ms = (now_ms // HOUR_MS - hours + 1) * HOUR_MS
    count = counts.by_status
    starts = range(first_ms, first_ms + hours * HOUR_MS, HOUR_MS)
    return StreamStatus(
        requests=sum(count.values()), succeeded=count[RequestStatus.SUCCEEDED.value],
        failed={layer.value: counts.failed[layer.value] for layer in FailureLayer},
        failed_codes=_top(Counter({code: n for code, n in counts.codes.items() if n})),
        retrying=count[RequestStatus.RETRYING.value], in_flight=count[RequestStatus.IN_FLIGHT.value],
        pending=count[RequestStatus.PENDING.value],
        hours=tuple(HourCounts(start, counts.arrived[start], counts.succeeded_in[start], counts.failed_in[start])
                    for start in starts),
        last_ended_ms=counts.last_ended_ms,
    )


def _top(codes: Counter[str]) -> dict[str, int]:
    """The ``MAX_CODES`` most frequent codes, and the rest summed as ``other``."""
    top = dict(codes.most_common(MAX_CODES))
    rest = sum(codes.values()) - sum(top.values())
    return top | {"other": rest} if rest else top
