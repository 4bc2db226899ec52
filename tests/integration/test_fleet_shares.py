"""Shares that follow the fleet (design §5.8), on the real broker: worker processes against one rate-limited mock
account, no share set by hand.

Two workers start and split the limit; a third joins mid-batch and the three split it; one is SIGKILLed and the
two left take its share once its beat is stale. The mock refuses what goes past its limit (its limiter's 429s)
and refuses a few calls besides whatever the rate (noise 429s). Each worker paced at the whole limit before the
fleet derived their shares.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streamproc.devstack.broker import free_port
from streamproc.settings import Settings
from tests.integration import pipeline

pytestmark = [pytest.mark.integration, pytest.mark.serial]

RPM = 2400  # the account's limit: 40 calls a second
NOISE = 0.005  # calls refused with a 429 whatever the rate, saying only "retry-after: 1" (the server's own)
REQUESTS = 4000  # 100 s at the limit
MODEL = {"model": "mock-small"}


@dataclass
class Sample:
    at: float
    calls: int
    refused_by_limit: int
    shares: dict[str, float | None]
    workers: dict[str, float | None]


@dataclass
class Timeline:
    """The mock's counts and each worker's gauges, sampled a few times a second."""

    ports: dict[str, int]
    samples: list[Sample] = field(default_factory=list)

    def take(self, calls: int, refused: int) -> Sample:
        sample = Sample(time.monotonic(), calls, refused, self._gauges("streamproc_rate_limit_share", MODEL),
                        self._gauges("streamproc_fleet_workers"))
        self.samples.append(sample)
        return sample

    def _gauges(self, name: str, labels: dict[str, str] | None = None) -> dict[str, float | None]:
        return {worker: pipeline.scrape_gauge(port, name, labels) for worker, port in self.ports.items()}

    def rate_per_minute(self, since: float, until: float) -> float:
        window = [s for s in self.samples if since <= s.at <= until]
        return (window[-1].calls - window[0].calls) * 60 / (window[-1].at - window[0].at)

    def print(self, start: float, events: dict[str, float]) -> None:
        """A line a second: the calls per minute the mock saw, its limiter's 429s so far, and the shares."""
        printed = -1.0
        for earlier, sample in zip(self.samples, self.samples[4:], strict=False):
            if sample.at - printed < 1.0:
                continue
            for name, at in events.items():
                if printed < at <= sample.at:
                    print(f"t={at - start:6.1f}s  -- {name}")
            printed = sample.at
            rate = (sample.calls - earlier.calls) * 60 / (sample.at - earlier.at)
            shares = " ".join(f"{name}={value:.3f}" if value is not None else f"{name}=-"
                              for name, value in sample.shares.items())
            print(f"t={sample.at - start:6.1f}s {rate:6.0f} RPM, limit 429s {sample.refused_by_limit:3d}, {shares}")


def mock_profile(path: Path) -> Path:
    path.write_text(json.dumps({"base": "clean", "faults": {"rate_limit": NOISE}, "injected_429": "retry_after_only",
                                "latency": {"kind": "lognormal", "p50": 0.3, "p99": 1.5},
                                "rate_limits": {"rpm": RPM, "burst_seconds": 1.0}}))
    return path


async def wait_for(condition: Callable[[Sample], bool], timeout_s: float, what: str,
                   sample: Callable[[], Sample]) -> float:
    """Seconds until ``condition(sample())`` holds (sampling every 0.2 s)."""
    start = time.monotonic()
    while not condition(sample()):
        assert time.monotonic() - start < timeout_s, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.2)
    return time.monotonic() - start


def took_over(sample: Sample, names: list[str]) -> bool:
    """Whether ``names`` count only themselves and their shares cover the whole limit (they follow demand, so
    they need not be equal)."""
    shares = [sample.shares[name] for name in names]
    return (all(sample.workers[name] == len(names) for name in names)
            and math.fsum(share or 0.0 for share in shares) >= 0.95)


def near(shares: dict[str, float | None], names: list[str], value: float, tolerance: float = 0.04) -> bool:
    return all((share := shares[name]) is not None and abs(share - value) <= tolerance for name in names)


def at_most(shares: dict[str, float | None], names: list[str], value: float) -> bool:
    return all((share := shares[name]) is not None and share <= value + 0.01 for name in names)


async def test_the_workers_split_the_account_as_they_join_and_die(settings: Settings, tmp_path: Path) -> None:
    mock = pipeline.start_mock(str(mock_profile(tmp_path / "limited.json")), 11)
    names = ["w1", "w2", "w3"]
    ports = {name: free_port() for name in names}
    workers = {name: pipeline.WorkerProcess(pipeline.worker_env(settings, mock.url, tmp_path / name,
                                                                llm_rpm=str(RPM), worker_metrics_port=str(ports[name])),
                                            tmp_path / f"{name}.log")
               for name in names}
    timeline = Timeline(ports)
    requests = [pipeline.chat_request(f"f-{i}", i) for i in range(REQUESTS)]
    ids = [r.request_id for r in requests]
    events: dict[str, float] = {}

    def sample() -> Sample:
        stats = mock.stats()
        return timeline.take(stats["calls"], stats["by_outcome"].get("rate_limited", 0))

    start = time.monotonic()
    try:
        workers["w1"].start()
        workers["w2"].start()
        assert settings.kafka_bootstrap is not None
        await pipeline.produce_requests(settings.kafka_bootstrap, settings, requests)
        two_split = await wait_for(lambda s: near(s.shares, ["w1", "w2"], 0.5) and s.calls > 0, 90,
                                   "two workers split the limit", sample)
        events["two busy"] = time.monotonic()
        await wait_for(lambda s: s.at - events["two busy"] >= 8, 30, "two busy for a while", sample)
        events["w3 starts"] = time.monotonic()
        workers["w3"].start()
        await wait_for(lambda s: s.workers["w1"] == 3 and s.workers["w2"] == 3, 60, "w3 seen", sample)
        events["w3 seen"] = time.monotonic()
        # joining, w3 holds nothing: its rebalance lets the others' scheduled calls leave; once it has its
        # partitions they leave it its part
        room = await wait_for(lambda s: at_most(s.shares, ["w1", "w2"], 1 / 3), 90, "w1 and w2 make room for w3",
                              sample)
        events["room for w3"] = time.monotonic()
        await wait_for(lambda s: s.shares["w3"] is not None, 90, "w3 calls", sample)
        events["w3 calls"] = time.monotonic()
        join = await wait_for(lambda s: near(s.shares, names, 1 / 3), 30, "three workers split the limit", sample)
        events["three split"] = time.monotonic()
        await wait_for(lambda s: s.at - events["three split"] >= 8, 30, "three busy for a while", sample)
        events["w1 killed"] = time.monotonic()
        workers["w1"].signal(signal.SIGKILL)
        kill = await wait_for(lambda s: took_over(s, ["w2", "w3"]), 30, "the two left take w1's share", sample)
        events["two split again"] = time.monotonic()
        async with pipeline.OutcomeReader(settings.kafka_bootstrap, settings) as reader:
            while reader.outcomes.unfinished(ids) and time.monotonic() - start < 360:
                await reader.poll()
                sample()
        outcomes = reader.outcomes
        stats = mock.stats()
    finally:
        for worker in workers.values():
            worker.stop()
        mock.stop()
        timeline.print(start, events)

    calls = stats["calls"]
    refused = stats["by_outcome"].get("rate_limited", 0)
    noise = stats["by_outcome"].get("rate_limit", 0)
    three_busy = timeline.rate_per_minute(events["three split"], events["w1 killed"])
    two_busy = timeline.rate_per_minute(events["two busy"], events["w3 starts"])
    print(f"calls {calls}, refused by the limiter {refused} ({refused / calls:.2%}), noise 429s {noise} "
          f"({noise / calls:.2%}); two busy at {two_busy:.0f} RPM, three at {three_busy:.0f} RPM (limit {RPM}); "
          f"two split after {two_split:.1f} s; w3 seen -> room made {room:.1f} s (its rebalance); w3 calls -> "
          f"three split {join:.1f} s; "
          f"SIGKILL -> the two take its share {kill:.1f} s")
    assert not outcomes.unfinished(ids), workers["w2"].log_tail()
    assert (refused + noise) / calls <= 0.02, (refused, noise, calls)  # no 429 storm
    assert two_busy >= 0.8 * RPM and three_busy >= 0.8 * RPM, (two_busy, three_busy)  # no collapse
    assert join <= 5.0  # a beat and a read after w3's first calls
    assert kill <= 3 * 1.0 + 2.0  # its beat is stale three beats after its last; a beat later the two know
