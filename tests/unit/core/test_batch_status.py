"""The per-batch status fold: counts add up to submitted, converged only when every request ended."""

from __future__ import annotations

from dataclasses import replace

from streamproc.core.batch_status import StatusFold, format_status
from streamproc.core.events import RequestState
from streamproc.core.vocabulary import FailureLayer, RequestStatus


def state(request_id: str, status: RequestStatus, layer: FailureLayer | None = None,
          batch_id: str = "b") -> RequestState:
    return RequestState(request_id, status, "h", batch_id=batch_id, last_layer=layer)


def test_counts_add_up_and_latest_state_wins() -> None:
    fold = StatusFold("b")
    fold.apply([state("1", RequestStatus.IN_FLIGHT), state("2", RequestStatus.IN_FLIGHT),
                state("3", RequestStatus.IN_FLIGHT), state("x", RequestStatus.SUCCEEDED, batch_id="other")])
    fold.apply([state("1", RequestStatus.SUCCEEDED), state("2", RequestStatus.RETRYING)])
    status = fold.status(submitted=5)
    assert status.as_json() == {"batch_id": "b", "submitted": 5, "succeeded": 1,
                                "failed": {"transport": 0, "service": 0, "semantic": 0, "business": 0},
                                "retrying": 1, "in_flight": 1, "pending": 2, "converged": False,
                                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                                          "by_model": {}}, "reused": 0,
                                "tenants": {"default": 3}, "priorities": {"normal": 3}, "parked": {}}


def test_converged_when_every_request_ended() -> None:
    fold = StatusFold("b")
    fold.apply([state("1", RequestStatus.SUCCEEDED), state("2", RequestStatus.FAILED, FailureLayer.SEMANTIC),
                state("3", RequestStatus.FAILED, FailureLayer.BUSINESS)])
    status = fold.status(submitted=3)
    assert status.converged
    assert status.failed == {"transport": 0, "service": 0, "semantic": 1, "business": 1}
    assert "converged  yes" in format_status(status)
    assert not fold.status(submitted=4).converged  # one not seen yet: pending
    assert not StatusFold("empty").status(0).converged


def test_states_beyond_the_manifest_raise_submitted_instead_of_breaking_the_sum() -> None:
    fold = StatusFold("b")
    fold.apply([state("1", RequestStatus.SUCCEEDED), state("2", RequestStatus.SUCCEEDED)])
    status = fold.status(submitted=0)  # the manifest is not written yet
    assert (status.submitted, status.pending, status.converged) == (2, 0, True)


def test_token_usage_is_summed_per_model_over_the_results_latest_state_only() -> None:
    fold = StatusFold("b")
    done = [replace(state(str(i), RequestStatus.SUCCEEDED), model=model, prompt_tokens=10, completion_tokens=i)
            for i, model in ((1, "small"), (2, "small"), (3, "large"))]
    fold.apply([*done, state("4", RequestStatus.FAILED, FailureLayer.BUSINESS)])
    fold.apply([replace(done[0], completion_tokens=5)])  # a later state of the same id replaces the earlier
    usage = fold.status(submitted=4).usage_json()
    assert usage == {"prompt_tokens": 30, "completion_tokens": 10, "total_tokens": 40,
                     "by_model": {"large": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
                                  "small": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}}}
    assert "tokens     40 (30 prompt, 10 completion)" in format_status(fold.status(submitted=4))


def test_an_answer_paid_for_but_too_large_for_a_result_counts_in_the_tokens() -> None:
    fold = StatusFold("b")
    fold.apply([replace(state("1", RequestStatus.SUCCEEDED), model="m", prompt_tokens=4, completion_tokens=2),
                replace(state("2", RequestStatus.FAILED, FailureLayer.BUSINESS), model="m", prompt_tokens=12,
                        completion_tokens=524_288),
                replace(state("3", RequestStatus.RETRYING), model="m", prompt_tokens=9)])  # not ended: not yet
    status = fold.status(submitted=3)
    assert (status.succeeded, status.failed["business"], status.usage) == (1, 1, {"m": (16, 524_290)})


def test_reused_results_are_counted_among_the_succeeded_and_spent_no_tokens() -> None:
    fold = StatusFold("b")
    fold.apply([replace(state("1", RequestStatus.SUCCEEDED), model="m", reused=True),
                replace(state("2", RequestStatus.SUCCEEDED), model="m", prompt_tokens=4, completion_tokens=2),
                replace(state("3", RequestStatus.IN_FLIGHT), reused=True)])  # not an end: not counted
    status = fold.status(submitted=3)
    assert (status.succeeded, status.reused, status.usage) == (2, 1, {"m": (4, 2)})
    assert status.as_json()["reused"] == 1
    assert "succeeded  2 (1 reused, no call)" in format_status(status).splitlines()


def test_requests_are_counted_by_tenant_and_priority_the_pending_as_the_manifest_says() -> None:
    fold = StatusFold("b")
    fold.apply([replace(state("1", RequestStatus.SUCCEEDED), tenant="team-a", priority="high"),
                replace(state("2", RequestStatus.IN_FLIGHT), tenant="team-a", priority="high"),
                state("3", RequestStatus.FAILED, FailureLayer.BUSINESS)])
    status = fold.status(submitted=6).with_pending_as("team-a", "high")
    assert (status.tenants, status.priorities) == ({"team-a": 5, "default": 1}, {"high": 5, "normal": 1})
    lines = format_status(status).splitlines()
    assert "tenant     team-a 5, default 1" in lines and "priority   high 5, normal 1" in lines
    alone = StatusFold("c").status(submitted=2).with_pending_as("team-b", "low")
    assert "tenant     team-b" in format_status(alone).splitlines()
