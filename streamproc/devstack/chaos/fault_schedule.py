"""The fault schedule: which fault fires when, as a pure plan.

Faults fire at fractions of the batch's progress (requests ended / submitted), not at fixed times: a slow
machine and a fast one both see every fault land while requests are moving. A fault whose fraction is not
reached within ``max_gap_s`` of the previous one fires anyway, so a batch that stopped moving still gets
the rest of its chaos (and the report shows where it stood).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    KILL_WORKER = "kill worker"
    RESTART_BROKER = "restart broker"
    LLM_OUTAGE = "LLM outage"
    POISON_WAVE = "poison wave"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    at_fraction: float
    worker: int | None = None  # KILL_WORKER: which one
    seconds: float = 0.0  # LLM_OUTAGE: how long; RESTART_BROKER: how long it stays down; KILL_WORKER: the pause
    wave: int = 0  # POISON_WAVE: its number (the first wave goes in with the batch, before the schedule)

    def describe(self) -> str:
        if self.kind is FaultKind.KILL_WORKER:
            return f"SIGKILL worker {self.worker}, restart after {self.seconds:g}s"
        if self.kind is FaultKind.RESTART_BROKER:
            return f"stop the broker, start it after {self.seconds:g}s"
        if self.kind is FaultKind.LLM_OUTAGE:
            return f"LLM outage of {self.seconds:g}s"
        return f"poison wave {self.wave}"


# the window of progress the faults are spread over: late enough that work is in flight, early enough that
# the last fault still meets a backlog even when a broker restart before it holds the schedule up
FIRST_FRACTION = 0.05
LAST_FRACTION = 0.7


def spread(count: int, low: float = FIRST_FRACTION, high: float = LAST_FRACTION) -> list[float]:
    """``count`` fractions evenly over [low, high] (one in the middle)."""
    if count <= 0:
        return []
    if count == 1:
        return [round((low + high) / 2, 4)]
    return [round(low + (high - low) * i / (count - 1), 4) for i in range(count)]


def plan_faults(*, workers: int, kills: int, kill_pause_s: float, broker_restarts: int, broker_down_s: float,
                outage_s: float, poison_waves: int = 1) -> list[Fault]:
    """Kills spread over the window and alternating between workers; each broker restart halfway between
    the two kills around its place in the middle third, so that it never coincides with a kill; the outage
    a third in (so the retries it causes meet later kills); further poison waves after the middle."""
    kill_at = spread(kills)
    faults = [Fault(FaultKind.KILL_WORKER, at, worker=i % workers, seconds=kill_pause_s)
              for i, at in enumerate(kill_at)]
    faults += [Fault(FaultKind.RESTART_BROKER, between_kills(at, kill_at), seconds=broker_down_s)
               for at in spread(broker_restarts, 0.35, 0.55)]
    if outage_s > 0:
        faults.append(Fault(FaultKind.LLM_OUTAGE, 0.3, seconds=outage_s))
    faults += [Fault(FaultKind.POISON_WAVE, at, wave=wave)
               for wave, at in enumerate(spread(poison_waves, 0.55, LAST_FRACTION - 0.05), start=2)]
    order = list(FaultKind)
    return sorted(faults, key=lambda f: (f.at_fraction, order.index(f.kind)))


def between_kills(at: float, kill_at: list[float]) -> float:
    """The midpoint of the two kills around ``at`` (``at`` itself when no kill is on both sides)."""
    before = [k for k in kill_at if k <= at]
    after = [k for k in kill_at if k > at]
    return round((before[-1] + after[0]) / 2, 4) if before and after else at


def due(fault: Fault, progress: float, since_previous_s: float, max_gap_s: float) -> bool:
    """Whether ``fault`` fires now: its progress fraction is reached, or the schedule waited long enough."""
    return progress >= fault.at_fraction or since_previous_s >= max_gap_s


@dataclass(frozen=True)
class FiredFault:
    """What happened when a fault fired (times in seconds since the run started)."""

    fault: Fault
    at_s: float
    progress: float
    took_s: float
    in_flight_gauge: float | None = None  # KILL_WORKER: the killed worker's streamproc_in_flight just before
    note: str = ""
