"""The pure parts of ``scripts/bench scale`` (benchmarks/scale.py): /proc parsing, process trees, the metrics
counter, CPU per request and its projection, the table's rows."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from benchmarks.pipeline import BenchError, Observed, RunReport
from benchmarks.scale import (
    ScaleRun,
    check_converged,
    descendants,
    parse_stat,
    ratios,
    results_written,
    rows,
    worker_counts,
)
from streamproc.core.events import InferenceResult


def test_parse_stat_reads_the_parent_and_all_cpu_ticks_past_a_command_with_parentheses() -> None:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime ...
    line = "4242 (python (worker) x) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 9 0 1000 0 0"
    assert parse_stat(line) == (17, 250 + 50 + 7 + 3)


def test_descendants_follow_the_tree_but_leave_out_the_subtrees_of_other_roots() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 12, 20: 1, 21: 20, 30: 99}
    assert descendants(parents, 10) == {10, 11, 12, 13}
    assert descendants(parents, 1, others={20}) == {1, 10, 11, 12, 13}
    assert descendants(parents, 30) == {30}
    assert descendants(parents, 404) == {404}  # gone: only itself, which the caller then skips


def test_results_written_reads_the_workers_results_counter() -> None:
    text = ("# HELP streamproc_results_total Results written to the results topic.\n"
            "# TYPE streamproc_results_total counter\n"
            "streamproc_results_total 1459.0\n"
            "streamproc_results_created 1.7e9\n"
            "# TYPE streamproc_retries_total counter\n"
            'streamproc_retries_total{tier="5s"} 3.0\n')
    assert results_written(text) == 1459
    with pytest.raises(BenchError):
        results_written("# TYPE other_total counter\nother_total 1.0\n")


def test_worker_counts() -> None:
    assert worker_counts("1,2,4") == [1, 2, 4]
    assert worker_counts("3") == [3]
    for bad in ("", "0,1", "1,two", "1,2,1"):
        with pytest.raises(argparse.ArgumentTypeError):
            worker_counts(bad)


def run(workers: int, requests: int, seconds: float, cores: dict[str, float], worker_results: tuple[int, ...],
        idle: dict[str, float] | None = None, round_: int = 0) -> ScaleRun:
    """A run of ``requests`` results whose first call started at t=0 and whose last result was seen at
    ``seconds``."""
    results = {f"r{i}": InferenceResult(f"r{i}", "b", "m", "{}", "", 1, latency_ms=0, completed_ms=0 if i == 0 else 5,
                                        input_hash="h") for i in range(requests)}
    observed = Observed(requests, spawned=-10.0, results=results, last_seen=seconds)
    return ScaleRun(workers, RunReport(f"{workers} worker(s)", observed, requests, cores, 0.0), worker_results,
                    idle or {}, round_)


def test_cpu_per_request_sums_the_workers_and_each_worker_is_charged_its_own_results() -> None:
    scale = run(2, 1000, 10.0, {"worker-1": 0.1, "worker-2": 0.15, "mock": 0.05, "bench": 0.02, "broker-1": 0.2,
                                "broker-2": 0.1, "broker-3": 0.1, "other": 0.5, "machine": 1.22},
                (400, 600))
    assert scale.ms_per_request("worker-") == pytest.approx(2.5)  # (0.1 + 0.15) cores x 10 s / 1000
    assert scale.per_worker_ms() == pytest.approx([2.5, 2.5])  # 1 s / 400, 1.5 s / 600
    assert scale.ms_per_request("broker-") == pytest.approx(4.0)
    assert scale.ms_per_request("mock") == pytest.approx(0.5)


def test_idle_cpu_is_taken_off_and_the_projection_is_capped_by_the_mock_and_the_busiest_broker() -> None:
    scale = run(1, 1000, 10.0, {"worker-1": 0.2, "mock": 0.1, "broker-1": 0.3, "broker-2": 0.2, "broker-3": 0.2},
                (1000,), idle={"worker-1": 0.05, "mock": 0.0, "broker-1": 0.1, "broker-2": 0.1, "broker-3": 0.1})
    assert scale.ms_per_request("worker-", beyond_idle=True) == pytest.approx(1.5)
    assert scale.busiest_broker_ms() == pytest.approx(2.0)  # broker-1: (0.3 - 0.1) x 10 s / 1000
    per_worker, mock_cap, broker_cap = scale.projection()
    assert per_worker == pytest.approx(500.0)  # 1 / 2 ms
    assert mock_cap == pytest.approx(1000.0)  # 1 / 1 ms on a core of its own
    assert broker_cap == pytest.approx(450.0)  # (1 - 0.1 idle) core / 2 ms
    assert run(1, 10, 1.0, {"worker-1": 0.1}, (10,)).projection()[1:] == (float("inf"), float("inf"))


def test_rows_give_the_ratio_to_the_first_run_and_each_share_of_the_machine() -> None:
    one = run(1, 1000, 10.0, {"worker-1": 0.2, "mock": 0.1, "broker-1": 0.4, "other": 0.2}, (1000,))
    two = run(2, 1000, 5.0, {"worker-1": 0.25, "worker-2": 0.23, "mock": 0.2, "broker-1": 0.8, "other": 0.1},
              (520, 480))
    first, second = rows([one, two], cpus=2)
    assert first[:5] == ("1", "100", "2.00 (2.00)", "2.00 (2.00-2.00)", "1.00")
    assert second[1] == "200" and second[4] == "1.20"  # 2.4 ms / 2.0 ms
    assert second[3] == "2.40 (2.40-2.40)"  # 1.25 s / 520 and 1.15 s / 480
    assert second[5] == "0.48 (24%)" and second[7] == "0.80 (40%)"


def test_ratios_pair_each_run_with_the_same_rounds_run_of_the_fewest_workers() -> None:
    def cpu(workers: int, ms: float, round_: int) -> ScaleRun:  # 1,000 requests in 10 s: ms/req = cores x 10
        return run(workers, 1000, 10.0, {f"worker-{i}": ms / 10 / workers for i in range(1, workers + 1)},
                   (1000,) * workers, {f"worker-{i}": 0.01 for i in range(1, workers + 1)}, round_)

    # round 2 ran on a busier machine: everything cost more, but in the same proportion
    runs = [cpu(1, 2.0, 0), cpu(2, 2.2, 0), cpu(4, 2.0, 0), cpu(2, 3.3, 1), cpu(4, 3.0, 1), cpu(1, 3.0, 1)]
    assert {count: [round(v, 3) for v in values] for count, values in ratios(runs).items()} == {
        1: [1.0, 1.0], 2: [1.1, 1.1], 4: [1.0, 1.0]}
    beyond = ratios(runs, beyond_idle=True)[4]  # idle: 0.1 ms/req per worker
    assert beyond == pytest.approx([1.6 / 1.9, 2.6 / 2.9])
    labels = [row[0] for row in rows(runs, cpus=2)]
    assert labels[:2] == ["1 (round 1)", "2 (round 1)"] and rows(runs, cpus=2)[3][4] == "1.10"


def test_a_run_with_a_failure_event_or_a_worker_gone_is_refused() -> None:
    check_converged(Observed(10, 0.0), [], [], str)
    with pytest.raises(BenchError, match="1 failure events"):
        check_converged(Observed(10, 0.0, failures=1), [], [], str)
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    gone.wait()
    with pytest.raises(BenchError, match=r"worker-2 exited \(3\) during the batch:\nlog of worker-2"):
        check_converged(Observed(10, 0.0), [gone], ["worker-2"], lambda name: f"log of {name}")
