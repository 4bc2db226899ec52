"""Each worker's share of every model's rate limits, derived from the fleet's beats (design §5.8).

Limits are per account, and the workers of a deployment share one account. Every worker publishes a beat each
second (``<prefix>.fleet``): per model, the calls and tokens waiting at its pace, what it sent over the last
beat, and the account's limits as it knows them. Every worker reads every beat and derives its own shares with
the same function, so they agree without a coordinator:

* **What a worker wants**, as a fraction of the account's limit, in the unit it is shortest of: what it sent
  (10 % more, room to grow) plus the rate that clears what waits at its pace within a second.
* **Max-min fair split** of the whole limit over those wants: a worker that wants less than an equal part gets
  what it wants, the others split the rest equally. What nobody wants goes to the workers with calls waiting
  (to every worker when none has), so one busy worker among idle ones gets the whole limit, two equally busy
  ones half each, and the shares of a consistent view sum to 1.
* **In reserve.** A worker with nothing waiting keeps at least ``1/n`` of n live workers in its limiter: it
  sends no more than it wants with it, and when calls come, they leave at an ordinary pace at once (a call is
  told its wait when it arrives; a share near zero would schedule the first calls minutes out).
* **Held.** The others leave an idle worker its ``1/n`` from its partitions to its first calls and while a
  rebalance of their generation holds its records, a minute at most, and for three beats after its calls stop
  otherwise: a share given back a moment later is given back late, since the calls a worker already told to
  wait keep their times.
* **Gone**: a worker not heard from for three of its beats (SIGKILLed, cut off); a clean stop says so at once.

The bound. In a view every worker has read, the live workers' shares in use sum to at most 1. Views differ by
what has not been read yet: a worker that starts, or that finds calls waiting after it was idle, uses its
reserve of ``1/n`` (a newcomer: ``1/(known + 1)``) before the others have read its beat and given way, so the
fleet overshoots by at most that worker's ``1/n`` of the limit (one per worker waking at the same moment), for
one beat and the others' reading delay, plus the time the calls the others had already scheduled take to
leave. A worker that dies leaves an undershoot (its share unused) for three beats. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, NamedTuple

from streamproc.core.spend_cap import Scope, Spend

if TYPE_CHECKING:
    from streamproc.core.guards.rate_limits import RateLimits

BEAT_S: Final = 1.0  # how often a worker publishes its beat
STALE_BEATS: Final = 3  # a worker not heard from for this many of its beats is gone
DRAIN_S: Final = 1.0  # what waits at a worker's pace asks for the rate that sends it within this time
HEADROOM: Final = 0.1  # a worker wants this much more than it sent, room to grow before calls wait
MIN_SHARE: Final = 0.001  # a limiter's share must be above 0
MAX_BEAT_MODELS: Final = 64  # models in one beat at most (the ones wanting most): a beat stays small
HOLD_PAUSED_S: Final = 60.0  # a worker starting or paused keeps its part this long at most after its last calls
HOLD_IDLE_S: Final = STALE_BEATS * BEAT_S  # a worker with work of its own keeps its part this long after its calls


@dataclass(frozen=True)
class ModelDemand:
    """One worker's demand on one model's limits, as its beat says."""

    waiting_calls: float = 0.0  # calls reserved at its pace but not yet due
    waiting_tokens: float = 0.0  # their tokens (prompt estimate + completion budget, as providers count)
    sent_rpm: float = 0.0  # calls per minute sent over its last beat
    sent_tpm: float = 0.0  # their tokens per minute
    limit_rpm: float | None = None  # the account's requests/min as this worker knows it (before any share)
    limit_tpm: float | None = None
    share: float | None = None  # the share it paced at (for people reading the topic; not an input)
    # the limits were configured or advertised, not learnt: the others may pace by them
    limit_told: bool = field(default=False, kw_only=True)

    @property
    def waits(self) -> bool:
        return self.waiting_calls > 0 or self.waiting_tokens > 0

    @property
    def active(self) -> bool:
        return self.waits or self.sent_rpm > 0 or self.sent_tpm > 0


IDLE: Final = ModelDemand()
WANTS_ALL: Final = ModelDemand(waiting_calls=math.inf, waiting_tokens=math.inf)


@dataclass(frozen=True)
class Beat:
    """One worker's beat: its demand per model (a model it does not name is idle for it) and its spend on each
    capped scope (core.spend_cap); a beat this reader cannot read wants everything."""

    worker: str
    models: Mapping[str, ModelDemand] = field(default_factory=dict)
    every_s: float = BEAT_S
    paused: bool = False  # its group holds its records (a rebalance, or no input partition): its calls come back
    generation: int = 0  # the consumer group generation it was last given partitions in
    unreadable: bool = False  # a record of a later, incompatible version
    spend: Mapping[Scope, Spend] = field(default_factory=dict)  # per capped batch and day: settled and in flight
    out: Mapping[str, str] = field(default_factory=dict)  # its deployments out of rotation and why (for status)

    def demand(self, model: str) -> ModelDemand:
        return WANTS_ALL if self.unreadable else self.models.get(model, IDLE)

    def busiest(self) -> dict[str, ModelDemand]:
        """The models worth publishing: the active ones, those with most waiting and sent first, at most
        MAX_BEAT_MODELS."""
        active = [(model, demand) for model, demand in self.models.items() if demand.active]
        active.sort(key=lambda item: (-item[1].waiting_calls, -item[1].sent_rpm, -item[1].sent_tpm))
        return dict(active[:MAX_BEAT_MODELS])


class Round(NamedTuple):
    """The consumer group generation a worker was last given partitions in, and when it got there (its clock)."""

    generation: int
    since: float


class FleetView:
    """The latest beat of every other worker, with when it was heard (a clock of the reader's own), when it was
    first heard, and when it last had calls for each model."""

    def __init__(self, me: str) -> None:
        self._me = me
        self._beats: dict[str, tuple[Beat, float]] = {}
        self._first_heard: dict[str, float] = {}
        self._active_at: dict[tuple[str, str], float] = {}  # (worker, model) -> last heard with calls

    def heard(self, beat: Beat, at: float) -> None:
        if beat.worker == self._me:
            return
        self._beats[beat.worker] = (beat, at)
        self._first_heard.setdefault(beat.worker, at)
        for model, demand in beat.models.items():
            if demand.active:
                self._active_at[(beat.worker, model)] = at

    def gone(self, worker: str) -> None:
        """A worker that stopped cleanly (its tombstone)."""
        self._beats.pop(worker, None)
        self._first_heard.pop(worker, None)
        for key in [key for key in self._active_at if key[0] == worker]:
            del self._active_at[key]

    def live(self, now: float) -> list[Beat]:
        """The other workers heard from within three of their beats; the rest are forgotten."""
        for worker, (beat, at) in list(self._beats.items()):
            if now - at > STALE_BEATS * beat.every_s:
                self.gone(worker)
        return [beat for beat, _ in self._beats.values()]

    def holds(self, worker: str, model: str, now: float, mine: Round) -> bool:
        """Whether ``worker`` keeps its part of ``model``'s limit though it asks for nothing now, for a reader in
        the group round ``mine``: its calls are about to come, and the reader's calls scheduled meanwhile at a
        larger share would keep their times. So a worker keeps it once it has its partitions and before its
        first calls (the workers of one rebalance start within moments of each other), while a rebalance of
        the reader's round (or a later one) holds its records after it had calls (every worker resumes at
        once), both for a minute at most, and for three beats after its last calls otherwise (the gap between
        two batches). A worker still joining, or left out of the reader's round (three beats after the reader
        got there: the others' beats say their new generation within moments), keeps nothing: it gets records
        only through a rebalance, which lets every scheduled call leave first."""
        heard = self._beats.get(worker)
        active_at = self._active_at.get((worker, model))
        if heard is None:
            return False
        beat = heard[0]
        if active_at is None:
            return not beat.paused and now - self._first_heard[worker] < HOLD_PAUSED_S
        if beat.paused:
            in_round = beat.generation >= mine.generation or now - mine.since <= HOLD_IDLE_S
            return in_round and now - active_at < HOLD_PAUSED_S
        return now - active_at < HOLD_IDLE_S


@dataclass(frozen=True)
class FleetShares:
    """This worker's share of each of its models' limits, and the one a model it calls later starts with."""

    by_model: Mapping[str, float]
    default: float
    workers: int  # live workers, this one included


def starting_share(known: int) -> float:
    """Before a worker has read any beat: as if ``known`` others (Kafka's group members, or beats read) were
    busy and it were one more."""
    return 1.0 / (max(0, known) + 1)


def shares(mine: Mapping[str, ModelDemand], others: Sequence[Beat],
           holds: Callable[[str, str], bool] = lambda _worker, _model: False) -> FleetShares:
    """This worker's shares, from its own demand now, the live beats of the others, and which of them keep
    their part of which model (:meth:`FleetView.holds`)."""
    reserve = 1.0 / (len(others) + 1)
    by_model = {}
    for model, demand in mine.items():
        mine_first = allocate([demand, *(beat.demand(model) for beat in others)],
                              [False, *(holds(beat.worker, model) for beat in others)])[0]
        share = mine_first if demand.waits else max(mine_first, reserve)
        by_model[model] = min(1.0, max(MIN_SHARE, share))
    return FleetShares(by_model, reserve, len(others) + 1)


def told_limits(beats: Iterable[Beat]) -> dict[str, RateLimits]:
    """Per model, the account's limits the beats say were configured or advertised (the lowest any names): a
    worker that has not met them yet paces by them from its first call, instead of finding them by its 429s.
    (The pacing module is imported here: status decodes the beats and paces nothing.)"""
    from streamproc.core.guards.rate_limits import RateLimits

    told: dict[str, list[ModelDemand]] = {}
    for beat in beats:
        for model, demand in beat.models.items():
            if demand.limit_told and (demand.limit_rpm or demand.limit_tpm):
                told.setdefault(model, []).append(demand)
    return {model: RateLimits(rpm=_lowest(d.limit_rpm for d in demands), tpm=_lowest(d.limit_tpm for d in demands))
            for model, demands in told.items()}


def allocate(demands: Sequence[ModelDemand], holding: Sequence[bool] = ()) -> list[float]:
    """The max-min fair split of one model's limit over the workers' demands (the account's limits: the lowest
    any of them knows); an idle worker ``holding`` its part wants an equal part (one with calls wants what they
    say); what nobody wants goes to those with calls waiting, else to all alike."""
    if not demands:
        return []
    limits = (_lowest(d.limit_rpm for d in demands), _lowest(d.limit_tpm for d in demands))
    equal = 1.0 / len(demands)
    held = [i < len(holding) and holding[i] and not demand.active for i, demand in enumerate(demands)]
    wants = [max(_want(demand, *limits), equal) if held[i] else _want(demand, *limits)
             for i, demand in enumerate(demands)]
    total = math.fsum(wants)
    if total >= 1.0:
        level = _water_level(wants)
        return [min(want, level) for want in wants]
    takers = [i for i, demand in enumerate(demands) if demand.waits] or list(range(len(demands)))
    spare = (1.0 - total) / len(takers)
    return [want + spare if i in takers else want for i, want in enumerate(wants)]


def _lowest(values: Iterable[float | None]) -> float | None:
    known = [value for value in values if value is not None and value > 0 and math.isfinite(value)]
    return min(known) if known else None


def _want(demand: ModelDemand, rpm: float | None, tpm: float | None) -> float:
    """The fraction of the account's limit ``demand`` asks for, in the unit it is shortest of; without a known
    limit, all of it while active and nothing while idle."""
    fractions = [(sent * (1 + HEADROOM) + waiting * 60.0 / DRAIN_S) / limit
                 for sent, waiting, limit in ((demand.sent_rpm, demand.waiting_calls, rpm),
                                              (demand.sent_tpm, demand.waiting_tokens, tpm))
                 if limit is not None]
    if fractions:
        return max(fractions)
    return 1.0 if demand.active else 0.0


def _water_level(wants: Sequence[float]) -> float:
    """The level every want is cut at so that the wants, cut, sum to 1 (their sum is at least 1)."""
    left = 1.0
    ordered = sorted(wants)
    for index, want in enumerate(ordered):
        takers = len(ordered) - index
        if want * takers >= left:
            return left / takers
        left -= want
    return ordered[-1]


class SentCounter:
    """Calls and tokens sent per model since the last reading: a beat's ``sent_rpm`` and ``sent_tpm``."""

    def __init__(self, now: float) -> None:
        self._since = now
        self._counts: dict[str, tuple[int, int]] = {}

    def sent(self, model: str, tokens: int) -> None:
        calls, total = self._counts.get(model, (0, 0))
        self._counts[model] = (calls + 1, total + max(0, tokens))

    def per_minute(self, now: float) -> dict[str, tuple[float, float]]:
        """Calls and tokens per minute of each model sent since the last reading; starts the next one."""
        per_s = 60.0 / max(now - self._since, 1e-3)
        rates = {model: (calls * per_s, tokens * per_s) for model, (calls, tokens) in self._counts.items()}
        self._since, self._counts = now, {}
        return rates
