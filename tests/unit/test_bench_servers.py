"""The pure helpers of ``scripts/bench servers`` (benchmarks/servers.py): layers, ratios, summaries, rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from benchmarks.servers import (
    TARGET_SLOT_FRACTION,
    ClientRecord,
    SlotRun,
    StrictRun,
    admitted_calls,
    client_summary,
    is_recoverable,
    last_outcomes,
    metric_value,
    outcome_layer,
    per_interval,
    per_request_outcomes,
    slot_rows,
    strict_rows,
    timeout_count,
)


@pytest.mark.parametrize(
    ("outcome", "layer"),
    [
        ("ok", None),
        ("hang", "transport"),
        ("truncated_body", "transport"),
        ("rate_limit", "service"),  # the profile's injected 429
        ("rate_limited", "service"),  # the mock's own limiter
        ("outage", "service"),
        ("server_error", "service"),
        ("empty_content", "semantic"),
        ("content_policy", "business"),
        ("insufficient_quota", "config"),
        ("context_length_exceeded", "business"),
        ("something_new", "business"),
    ],
)
def test_outcome_layer(outcome: str, layer: str | None) -> None:
    assert outcome_layer(outcome) == layer


def test_recoverable_means_only_transport_and_service_failures() -> None:
    assert is_recoverable([])
    assert is_recoverable(["ok"])
    assert is_recoverable(["hang", "rate_limited", "bad_gateway", "ok"])
    assert not is_recoverable(["hang", "content_policy"])
    assert not is_recoverable(["invalid_json", "ok"])


def test_admitted_calls_leave_out_what_the_limiter_never_saw() -> None:
    by_outcome = {"ok": 90, "rate_limited": 30, "rate_limit": 5, "hang": 2, "outage": 3, "malformed_request": 1}
    # the profile's injected 429s (rate_limit) were admitted and used up the limit; the limiter's own were not
    assert admitted_calls(131, by_outcome) == 97
    assert admitted_calls(0, {}) == 0


def test_per_request_outcomes_from_detailed_stats() -> None:
    stats = {"per_request_id": {"a": {"calls": 2, "outcomes": ["hang", "ok"]}, "b": {"calls": 0}}}
    assert per_request_outcomes(stats) == {"a": ["hang", "ok"], "b": []}
    assert per_request_outcomes({}) == {}


def test_metric_value_reads_an_unlabelled_series() -> None:
    text = ("# HELP streamproc_adaptive_in_flight_limit The limit.\n"
            "# TYPE streamproc_adaptive_in_flight_limit gauge\n"
            "streamproc_adaptive_in_flight_limit_other 7.0\n"
            "streamproc_adaptive_in_flight_limit 3.0\n")
    assert metric_value(text, "streamproc_adaptive_in_flight_limit") == 3.0
    assert metric_value(text, "streamproc_missing") is None
    assert metric_value("", "x") is None


def test_timeout_count_counts_transport_timeouts_only() -> None:
    failures = {("transport", "read_timeout"): 2, ("transport", "timeout"): 1, ("transport", "connection_reset"): 4,
                ("service", "gateway_timeout"): 5}
    assert timeout_count(failures) == 3


def strict_run(*, ids: Sequence[str] = ("r1", "r2", "r3"), results: Sequence[str] = ("r1", "r2", "r3"),
               first: float | None = 100.0, times: Sequence[float] = (110.0, 120.0, 133.0), calls: int = 1650,
               answered_429: int = 50, by_outcome: Mapping[str, int] | None = None,
               outcomes: Mapping[str, Sequence[str]] | None = None) -> StrictRun:
    return StrictRun("strict, test", frozenset(ids), frozenset(results), first, tuple(times), calls, answered_429,
                     {"rate_limited": 50} if by_outcome is None else by_outcome, outcomes or {}, 3000)


def test_strict_run_figures() -> None:
    run = strict_run()
    assert run.converged
    assert run.wall_s == pytest.approx(33.0)
    assert run.needed == 1600
    assert run.ideal_s == pytest.approx(32.0)  # 1,600 calls at 3,000 per minute
    assert run.ratio == pytest.approx(33.0 / 32.0)
    assert run.share_429 == pytest.approx(50 / 1650)
    assert run.until_s(0.5) == pytest.approx(20.0)  # 2 of the 3 requests
    assert run.until_s(0.95) == pytest.approx(33.0)
    assert run.until_s(0.0) is None
    assert run.paced_429 == 50 and run.share_paced_429 == pytest.approx(50 / 1650)  # 3 %: the pace's fault
    assert run.ok() == {"ratio": True, "unrecovered": True, "paced_429": False}
    injected = strict_run(by_outcome={"rate_limit": 50, "rate_limited": 3})  # the profile's own 429s are 50
    assert (injected.paced_429, injected.ok()["paced_429"]) == (3, True)


def test_strict_run_misses_the_ratio_when_slow_or_unfinished() -> None:
    assert strict_run(times=(110.0, 120.0, 140.0)).ok()["ratio"] is False  # 40 s for an ideal of 32 s
    unfinished = strict_run(times=(110.0, 120.0), results=("r1", "r2"))
    assert not unfinished.converged
    assert unfinished.wall_s == pytest.approx(20.0)  # to the last outcome it had
    assert unfinished.until_s(0.95) is None
    assert unfinished.ok()["ratio"] is False
    assert strict_run(first=None, times=(), results=()).ratio is None
    assert strict_run(calls=50).ratio is None  # nothing admitted: no ideal


def test_unrecovered_are_recoverable_requests_without_a_result() -> None:
    outcomes = {"r1": ["hang", "ok"], "r2": ["server_error"] * 6, "r3": ["content_policy"]}
    run = strict_run(results=("r1",), outcomes=outcomes)
    assert run.recoverable == {"r1", "r2"}
    assert run.unrecovered == ["r2"]  # r3 failed on the business layer: not recoverable
    assert run.ok()["unrecovered"] is False
    # a request the client never called is recoverable, and without a result it counts
    assert strict_run(ids=("r1", "r4"), results=("r1",), outcomes=outcomes).unrecovered == ["r4"]


def test_strict_rows_show_targets_and_marks() -> None:
    rows = strict_rows(strict_run(results=("r1",), outcomes={"r2": ["hang"]}, times=(110.0, 133.0)))
    assert rows[0][1].startswith("33.0 s (did NOT finish: 2 of 3")
    by_name = {row[0].strip(): row for row in rows}
    assert by_name["wall / ideal"][1:] == ("1.03", "<= 1.10", "MISSED")  # fast, but unfinished
    assert by_name["recoverable requests without a result"][3] == "MISSED"
    assert by_name["calls made (mock) / of which 429"][1] == "1,650 / 50 = 3.0%"
    assert all(len(row) == 4 for row in rows)


def test_slot_run_figures_and_rows() -> None:
    run = SlotRun(requests=200, results=200, seconds=42.0, service_s=0.2, timeouts=0, converged=True,
                  in_flight_limit=2.0, abandoned=0)
    assert run.capacity == pytest.approx(5.0)
    assert run.throughput == pytest.approx(200 / 42)
    assert run.fraction == pytest.approx(40 / 42)
    assert run.fraction >= TARGET_SLOT_FRACTION
    assert run.ok() == {"timeouts": True, "fraction": True}
    rows = {row[0].strip(): row for row in slot_rows(run)}
    assert rows["worker's adaptive in-flight limit at the end"][1] == "2"
    slow = SlotRun(200, 190, 60.0, 0.2, timeouts=3, converged=False, in_flight_limit=None)
    assert slow.ok() == {"timeouts": False, "fraction": False}
    assert slot_rows_marks(slow) == ["MISSED", "MISSED"]
    assert SlotRun(10, 0, None, 0.2, 0, False, None).throughput == 0.0


def slot_rows_marks(run: SlotRun) -> list[str]:
    return [row[3] for row in slot_rows(run) if row[3]]


def test_client_summary_and_records_round_trip() -> None:
    records = [ClientRecord("a", 10.0, 12.0, True), ClientRecord("b", 10.5, 80.0, False, "ReadTimeout"),
               ClientRecord("c", 11.0, None)]  # unfinished at the deadline
    assert client_summary(records) == (10.0, (12.0, 80.0), frozenset({"a"}))
    assert client_summary([]) == (None, (), frozenset())
    assert [ClientRecord.from_json(r.to_json()) for r in records] == records


def test_last_outcomes_name_the_slowest_requests_and_their_calls() -> None:
    finished = {"b-000001": 105.0, "b-000002": 161.5, "b-000003": 120.0}
    outcomes = {"b-000002": ["hang", "ok"]}
    assert last_outcomes(finished, outcomes, 100.0, n=2) == ["000003 at +20.0s []", "000002 at +61.5s [hang, ok]"]


def test_per_interval_counts_each_step_up_to_the_last() -> None:
    assert per_interval([100.5, 101.0, 104.9, 116.0, 99.0], 100.0, 5.0) == [3, 0, 0, 1]  # 99.0: before the start
    assert per_interval([], 100.0, 5.0) == []
