"""What the workers' ``/metrics`` say during a run: in flight, stalled partitions, reconciler re-drives.

A worker's counters start again at zero when it restarts, so readings are kept per incarnation (each
start of a worker process) and the re-drive total sums the last reading of every incarnation. Every
reading that reports a stalled partition is kept with its time: a stall that cleared itself was still a
stall, and the verdict needs to know whether the broker was down in the window the stall looked back on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

IN_FLIGHT = "streamproc_in_flight"
STALLED = "streamproc_partition_stalled"
REDRIVEN = "streamproc_requests_redriven"  # counters: their samples are named ..._total
HEDGED = "streamproc_hedged_calls"
RESULTS = "streamproc_results"  # what the soak run divides CPU time by
COUNTERS = (REDRIVEN, HEDGED, RESULTS)


@dataclass(frozen=True)
class WorkerReading:
    in_flight: float | None
    stalled: frozenset[tuple[str, int]]
    counters: dict[str, float]  # of COUNTERS, the ones this worker exports (summed over labels)

    @property
    def redriven(self) -> float | None:
        return self.counters.get(REDRIVEN)


def parse_metrics(text: str) -> WorkerReading:
    """The series the run reads, from a Prometheus text exposition."""
    in_flight: float | None = None
    stalled: set[tuple[str, int]] = set()
    counters: dict[str, float] = {}
    wanted = {f"{name}_total": name for name in COUNTERS}
    for family in text_string_to_metric_families(text):
        if (exported := wanted.get(family.name) or (family.name if family.name in COUNTERS else None)) is not None:
            counters.setdefault(exported, 0.0)  # a labelled counter shows no sample before its first increment
        for sample in family.samples:
            if sample.name == IN_FLIGHT:
                in_flight = float(sample.value)
            elif sample.name == STALLED and sample.value >= 1:
                stalled.add((sample.labels.get("topic", "?"), int(sample.labels.get("partition", "-1"))))
            elif (name := wanted.get(sample.name)) is not None:  # the family is named with or without _total
                counters[name] = counters.get(name, 0.0) + float(sample.value)
    return WorkerReading(in_flight, frozenset(stalled), counters)


async def scrape(client: httpx.AsyncClient, port: int) -> WorkerReading | None:
    """One reading of ``127.0.0.1:port/metrics``; None while nothing answers there (starting, or dead)."""
    try:
        response = await client.get(f"http://127.0.0.1:{port}/metrics", timeout=3.0)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_metrics(response.text)


@dataclass(frozen=True)
class StallReading:
    """One reading in which a worker reported a partition stalled (seconds since the run started)."""

    at_s: float
    worker: int
    topic: str
    partition: int


@dataclass
class MetricsLedger:
    """Every reading of every worker incarnation, folded into what the report needs."""

    stalls: list[StallReading] = field(default_factory=list)
    stalled_now: dict[int, frozenset[tuple[str, int]]] = field(default_factory=dict)
    counters: dict[tuple[str, int, int], float] = field(default_factory=dict)  # (name, worker, incarnation) -> last
    readings: int = 0

    def add(self, worker: int, incarnation: int, reading: WorkerReading, at_s: float) -> None:
        self.readings += 1
        self.stalls += [StallReading(at_s, worker, topic, partition) for topic, partition in sorted(reading.stalled)]
        self.stalled_now[worker] = reading.stalled
        for name, value in reading.counters.items():
            key = (name, worker, incarnation)
            self.counters[key] = max(value, self.counters.get(key, 0.0))

    def total(self, name: str) -> float | None:
        """A counter summed over workers and their incarnations; None if no worker exported it."""
        values = [value for (counter, _, _), value in self.counters.items() if counter == name]
        return sum(values) if values else None
