"""The pure parts of ``scripts/bench pipeline`` (benchmarks/pipeline.py): reading a worker's counters, and
which LLM calls beyond one per request its metrics explain."""

from __future__ import annotations

from benchmarks.pipeline import Observed, RunReport, counter_total, shared_and_unclean

METRICS = ('# TYPE streamproc_llm_calls_total counter\n'
           'streamproc_llm_calls_total{model="m",outcome="success"} 5000.0\n'
           'streamproc_llm_calls_total{model="m",outcome="transport"} 2.0\n'
           'streamproc_llm_calls_total{model="n",outcome="service"} 1.0\n'
           'streamproc_llm_calls_created{model="m",outcome="success"} 1.7e9\n'
           '# TYPE streamproc_hedged_calls_total counter\n'
           'streamproc_hedged_calls_total 4.0\n')


def test_counter_total_sums_a_family_leaving_out_the_excluded_labels_and_none_when_absent() -> None:
    assert counter_total(METRICS, "streamproc_llm_calls") == 5003
    assert counter_total(METRICS, "streamproc_llm_calls", exclude={"outcome": "success"}) == 3
    assert counter_total(METRICS, "streamproc_hedged_calls") == 4
    assert counter_total(METRICS, "streamproc_results") is None


def report(mock_calls: int, explained: dict[str, int] | None) -> RunReport:
    return RunReport("worker-latency", Observed(5000, spawned=0.0), mock_calls, {"worker": 0.3, "other": 0.0}, 100.0,
                     calls_explained=explained)


def test_extra_calls_the_workers_metrics_explain_are_no_warning_and_the_others_are() -> None:
    assert shared_and_unclean(report(5001, {"hedged": 1, "failed calls": 0})) == []
    [warning] = shared_and_unclean(report(5003, {"hedged": 1, "failed calls": 1}))
    assert "5003 LLM calls for 5000 requests, 1 not explained by the worker's metrics" in warning
    [warning] = shared_and_unclean(report(5001, None))  # metrics not read: every extra call is reported
    assert warning.endswith("5001 LLM calls for 5000 requests")
    [warning] = shared_and_unclean(report(4999, {"hedged": 0, "failed calls": 0}))  # a request never called
    assert "4999 LLM calls" in warning
