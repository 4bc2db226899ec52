"""Which deployments are out of rotation and why, as the workers' beats say and status shows."""

from __future__ import annotations

from streamproc.core.deployments_out import (
    HEARD_WITHIN_MS,
    MAX_OUT,
    MAX_REASON,
    DeploymentOut,
    FleetOutView,
    concerning,
    failure_kind,
    fleet_out,
    out_reason,
    paused_reason,
    worker_out,
)


def test_a_reason_says_whether_the_deployment_hangs_refuses_or_answers_5xx() -> None:
    assert failure_kind("read_timeout", None) == "calls that hang (read_timeout)"
    assert failure_kind("connection_refused", None) == "transport failures (connection_refused)"
    assert failure_kind("server_error", 503) == "HTTP 503 answers (server_error)"
    assert out_reason("open", "calls that hang (read_timeout)") == (
        "circuit breaker open after calls that hang (read_timeout)")
    assert out_reason("half_open", None) == "circuit breaker half_open"


def test_a_worker_s_deployments_out_are_its_breakers_out_and_its_paused_ones() -> None:
    refused = "its first 3 calls all failed alike: model_not_found (HTTP 404): no such model"
    out = worker_out({"m@1": "circuit breaker open", "m@3": "circuit breaker half_open"},
                     {"m@2": refused, "m@3": refused})
    assert out == {"m@1": "circuit breaker open", "m@2": f"paused: {refused}", "m@3": "circuit breaker half_open"}
    assert len(paused_reason("x" * 1000)) == MAX_REASON and worker_out({}, {}) == {}


def test_a_tenant_paused_on_a_model_is_shown_to_that_tenant_s_batches_only() -> None:
    out = worker_out({}, {"m@2": "refused"}, {("team-a", "gpt-a"): "its last 5 calls of gpt-a all failed alike"})
    assert out["gpt-a for tenant team-a"] == "tenant team-a paused: its last 5 calls of gpt-a all failed alike"
    fleet = fleet_out([out])
    assert [entry.tenant for entry in fleet] == ["team-a", None]  # by key: "gpt-a ..." before "m@2"
    assert [entry.deployment for entry in concerning(fleet, {"team-b": 3})] == ["m@2"]
    assert [entry.deployment for entry in concerning(fleet, {"team-a": 1, "team-b": 3})] == [
        "gpt-a for tenant team-a", "m@2"]


def test_the_fleet_s_deployments_out_merge_by_key_with_the_reason_most_workers_give() -> None:
    hang, refused = "circuit breaker open after calls that hang", "circuit breaker open after transport failures"
    merged = fleet_out([{"m@2": hang}, {"m@2": hang, "m@1": refused}, {"m@2": refused}])
    assert merged == (DeploymentOut("m@1", refused, 1), DeploymentOut("m@2", hang, 3))
    assert merged[1].describe() == f"m@2: {hang} (3 workers)"
    assert merged[0].as_json() == {"deployment": "m@1", "reason": refused, "workers": 1}
    assert len(fleet_out([{f"m@{n}": "x" for n in range(200)}])) == MAX_OUT


def test_only_live_workers_count_and_a_worker_whose_breakers_closed_or_that_stopped_says_nothing() -> None:
    view = FleetOutView()
    view.heard("w1", 1_000, {"m@2": "circuit breaker open"})
    view.heard("w2", 1_000, {"m@2": "circuit breaker open"})
    view.heard("w3", 1_000, {"m@1": "circuit breaker open"})
    assert view.out(2_000) == (DeploymentOut("m@1", "circuit breaker open", 1),
                               DeploymentOut("m@2", "circuit breaker open", 2))
    view.heard("w3", 1_500, {})  # its breaker closed
    view.gone("w2")  # its tombstone
    assert view.out(2_000) == (DeploymentOut("m@2", "circuit breaker open", 1),)
    assert view.out(1_000 + HEARD_WITHIN_MS + 1) == ()  # w1 beat no more: gone without a tombstone
