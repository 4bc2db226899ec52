"""The stream's counts: the requests that name no batch (design §3, "JSON requests"), folded from the
request-state changelog as a batch's status is, with how many arrived and ended in each of the last hours.

A stream has no manifest and never converges, so what it has instead of ``submitted`` and ``converged`` is
its rate: per clock hour (UTC), how many requests a worker first took and how many ended, by outcome.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from streamproc.core.batch_summary import LatestState
from streamproc.core.events import RequestState
from streamproc.core.vocabulary import FailureLayer, RequestStatus

HOUR_MS: Final = 3_600_000
MAX_HOURS: Final = 7 * 24
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
        if not 1 <= hours <= MAX_HOURS:
            raise ValueError(f"hours must be 1 to {MAX_HOURS}, not {hours}")
        first_ms = (now_ms // HOUR_MS - hours + 1) * HOUR_MS
        by_status: Counter[RequestStatus] = Counter()
        failed = dict.fromkeys((layer.value for layer in FailureLayer), 0)
        codes: Counter[str] = Counter()
        arrived: Counter[int] = Counter()
        succeeded: Counter[int] = Counter()
        failed_in: Counter[int] = Counter()
        last_ended_ms = 0
        for entry in self._latest.values():
            by_status[entry.status] += 1
            if entry.created_ms >= first_ms:
                arrived[_hour(entry.created_ms)] += 1
            if entry.status not in (RequestStatus.SUCCEEDED, RequestStatus.FAILED):
                continue
            last_ended_ms = max(last_ended_ms, entry.updated_ms)
            ended_in = succeeded if entry.status is RequestStatus.SUCCEEDED else failed_in
            if entry.updated_ms >= first_ms:
                ended_in[_hour(entry.updated_ms)] += 1
            if entry.status is RequestStatus.FAILED:
                failed[(entry.layer or FailureLayer.BUSINESS).value] += 1
                codes[entry.code or "unknown"] += 1
        starts = range(first_ms, first_ms + hours * HOUR_MS, HOUR_MS)
        return StreamStatus(
            requests=len(self._latest), succeeded=by_status[RequestStatus.SUCCEEDED], failed=failed,
            failed_codes=_top(codes), retrying=by_status[RequestStatus.RETRYING],
            in_flight=by_status[RequestStatus.IN_FLIGHT], pending=by_status[RequestStatus.PENDING],
            hours=tuple(HourCounts(start, arrived[start], succeeded[start], failed_in[start]) for start in starts),
            last_ended_ms=last_ended_ms,
        )


def _hour(ms: int) -> int:
    return ms // HOUR_MS * HOUR_MS


def _top(codes: Counter[str]) -> dict[str, int]:
    """The ``MAX_CODES`` most frequent codes, and the rest summed as ``other``."""
    top = dict(codes.most_common(MAX_CODES))
    rest = sum(codes.values()) - sum(top.values())
    return top | {"other": rest} if rest else top
