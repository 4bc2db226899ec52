"""One tenant's failures alike pause that tenant on that model, only while other tenants' calls are answered."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.guards.pauses import Pause
from streamproc.core.guards.tenant_pauses import TenantPauses
from streamproc.core.outcome import Failure, Outcome, Success
from streamproc.core.vocabulary import FailureLayer

OK = Success("fine", "m", 10, 2)
REFUSED = Failure(FailureLayer.BUSINESS, "invalid_value", "HTTP 400: temperature must be <= 2", 400)
OTHER = Failure(FailureLayer.BUSINESS, "invalid_value", "HTTP 400: top_p must be <= 1", 400)
UNAVAILABLE = Failure(FailureLayer.SERVICE, "http_503", "HTTP 503", 503)


def ended(pauses: TenantPauses, tenant: str, outcome: Outcome, now: float, model: str = "m") -> None:
    """A call sent and answered before the next one went."""
    pauses.record(tenant, model, outcome, now, pauses.begin(tenant, model))


def test_five_refusals_alike_while_another_tenant_is_answered_pause_that_tenant_only() -> None:
    heard: list[tuple[str, str, Pause | None]] = []
    pauses = TenantPauses(on_change=lambda tenant, model, pause: heard.append((tenant, model, pause)))
    ended(pauses, "b", OK, 0.0)
    for second in range(1, 6):
        assert pauses.may_call("a", "m", float(second))
        ended(pauses, "a", REFUSED, float(second))
    assert not pauses.may_call("a", "m", 6.0)
    assert pauses.may_call("b", "m", 6.0) and pauses.may_call("a", "other-model", 6.0)
    [(tenant, model, pause)] = heard
    assert (tenant, model) == ("a", "m") and pause is not None and "temperature must be <= 2" in pause.reason
    assert pauses.retry_at("a", "m", 6.0) == 35.0 and set(pauses.paused()) == {("a", "m")}


def test_a_lone_tenant_is_never_paused_by_this_rule() -> None:
    pauses = TenantPauses()
    for second in range(20):
        ended(pauses, "a", REFUSED, float(second))
    assert pauses.paused() == {}


def test_an_answer_of_another_tenant_older_than_the_window_is_no_witness() -> None:
    pauses = TenantPauses(witness_s=60)
    ended(pauses, "b", OK, 0.0)
    for _ in range(5):
        ended(pauses, "a", REFUSED, 61.0)
    assert pauses.paused() == {}
    ended(pauses, "b", OK, 62.0)
    ended(pauses, "a", REFUSED, 62.0)  # the run went on: the sixth alike, now witnessed
    assert set(pauses.paused()) == {("a", "m")}


def test_failures_that_differ_or_an_answer_between_restart_the_run() -> None:
    pauses = TenantPauses()
    ended(pauses, "b", OK, 0.0)
    for outcome in (REFUSED, REFUSED, REFUSED, REFUSED, OTHER, REFUSED, REFUSED, OK, REFUSED, REFUSED, REFUSED,
                    REFUSED, UNAVAILABLE):
        ended(pauses, "a", outcome, 1.0)
    assert pauses.paused() == {}
    ended(pauses, "a", REFUSED, 1.0)  # the 503 neither counted nor cleared: five alike
    assert set(pauses.paused()) == {("a", "m")}


def test_a_probe_per_interval_a_failed_one_waits_again_and_an_answer_resumes() -> None:
    heard: list[Pause | None] = []
    pauses = TenantPauses(threshold=1, probe_interval_s=30, on_change=lambda t, m, pause: heard.append(pause))
    ended(pauses, "b", OK, 0.0)
    ended(pauses, "a", REFUSED, 0.0)
    assert not pauses.may_call("a", "m", 29.0)
    assert pauses.may_call("a", "m", 30.0) and not pauses.may_call("a", "m", 30.5)  # one probe
    ended(pauses, "a", REFUSED, 31.0)
    assert set(pauses.paused()) == {("a", "m")} and pauses.retry_at("a", "m", 31.0) == 60.0
    assert pauses.may_call("a", "m", 60.0)
    ended(pauses, "a", OK, 61.0)
    assert pauses.paused() == {} and pauses.may_call("a", "m", 61.0)
    assert [pause is None for pause in heard] == [False, True]


def test_refusals_judged_in_the_order_sent_not_answered() -> None:
    """Five quick refusals that come back before the answer of a call sent earlier do not pause the tenant."""
    pauses = TenantPauses()
    ended(pauses, "b", OK, 0.0)
    slow = pauses.begin("a", "m")
    quick = [pauses.begin("a", "m") for _ in range(5)]
    for call in quick:
        pauses.record("a", "m", REFUSED, 1.0, call)
    assert pauses.paused() == {}
    pauses.record("a", "m", OK, 2.0, slow)  # answered: the run starts after it, with the five refusals
    assert set(pauses.paused()) == {("a", "m")}


def test_a_call_ended_unanswered_lets_the_refusal_after_it_count() -> None:
    pauses = TenantPauses(threshold=1)
    ended(pauses, "b", OK, 0.0)
    cancelled = pauses.begin("a", "m")
    ended(pauses, "a", REFUSED, 1.0)
    assert pauses.paused() == {}  # waits for the call sent before it
    pauses.abandon("a", "m", cancelled, 1.5)
    assert set(pauses.paused()) == {("a", "m")}


def test_calls_in_flight_when_the_pause_began_neither_end_nor_prolong_it() -> None:
    pauses = TenantPauses(threshold=1)
    ended(pauses, "b", OK, 0.0)
    refused, in_flight = pauses.begin("a", "m"), pauses.begin("a", "m")
    pauses.record("a", "m", REFUSED, 1.0, refused)
    assert set(pauses.paused()) == {("a", "m")}
    pauses.record("a", "m", OK, 2.0, in_flight)  # sent before the pause: the probes decide
    assert set(pauses.paused()) == {("a", "m")}


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([OK, REFUSED, OTHER, UNAVAILABLE])),
                max_size=60))
def test_a_tenant_is_paused_only_after_threshold_alike_in_a_row_and_never_while_answered(
        calls: list[tuple[str, Outcome]]) -> None:
    """Whatever the mix: a paused tenant's last calls before its pause failed alike, at least ``threshold`` in a
    row; its last call answered means it is not paused."""
    pauses = TenantPauses(threshold=3)
    history: dict[str, list[Outcome]] = {}
    for tenant, outcome in calls:
        if not pauses.may_call(tenant, "m", 0.0):
            continue
        ended(pauses, tenant, outcome, 0.0)
        history.setdefault(tenant, []).append(outcome)
        if (tenant, "m") in pauses.paused():
            counted = [o for o in history[tenant] if o is not UNAVAILABLE]
            assert len(counted) >= 3 and counted[-1] is not OK and len({*counted[-3:]}) == 1
            assert any(other != tenant and OK in seen for other, seen in history.items())
        if outcome is OK:
            assert (tenant, "m") not in pauses.paused()
