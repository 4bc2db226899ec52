"""The backfill plan: latest terminal failure per id, filters, and the skip rules."""

from __future__ import annotations

from streamproc.core.events import FailureEvent, InferenceRequest
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.ops.backfill import REPLAY, BackfillFilter, plan_backfill


def failure(request_id: str, layer: FailureLayer, code: str, *, terminal: bool = True, at_ms: int = 1_000,
            batch_id: str = "b", body: str = '{"messages": []}') -> FailureEvent:
    request = InferenceRequest(request_id, body, batch_id=batch_id)
    return FailureEvent(request, layer, code, f"{code} happened", 3, terminal, at_ms, at_ms)


def test_replays_retryable_layers_and_skips_with_reasons() -> None:
    failures = [
        failure("t", FailureLayer.TRANSPORT, "read_timeout"),
        failure("s", FailureLayer.SERVICE, "rate_limit_exceeded"),
        failure("m", FailureLayer.SEMANTIC, "invalid_json"),
        failure("b", FailureLayer.BUSINESS, "context_length_exceeded"),
        failure("done", FailureLayer.SERVICE, "http_503"),
        failure("n", FailureLayer.TRANSPORT, "connect_error", terminal=False),  # not terminal: not replayed
    ]
    plan = plan_backfill(failures, {"done": RequestStatus.SUCCEEDED}, BackfillFilter())
    assert [r.request_id for r in plan.replays] == ["t", "s", "m"]
    assert plan.replays[2].repair is not None and "invalid_json happened" in plan.replays[2].repair.reason
    assert plan.replays[0].repair is None
    assert plan.counts[("business", "context_length_exceeded",
                        "skip: business (fix the input, then --include-business)")] == 1
    assert plan.counts[("service", "http_503", "skip: succeeded since")] == 1
    assert plan.summary()["to_replay"] == 3 and plan.summary()["to_skip"] == 2


def test_a_conflict_of_an_id_whose_owner_waits_parked_is_never_replayed_over_it() -> None:
    """The id is reserved (``pending``) for the record read first, parked on the backlog: a replay of the later
    record's conflicting_duplicate would start (rule 4) with the other body and take the id from it."""
    conflict = failure("parked", FailureLayer.BUSINESS, "conflicting_duplicate")
    plan = plan_backfill([conflict], {"parked": RequestStatus.PENDING}, BackfillFilter(include_business=True))
    assert plan.replays == []
    assert plan.counts[("business", "conflicting_duplicate", "skip: waiting to be handled")] == 1


def test_business_only_on_request_and_filters_apply() -> None:
    failures = [failure("b", FailureLayer.BUSINESS, "invalid_request_error", at_ms=5_000),
                failure("old", FailureLayer.TRANSPORT, "read_timeout", at_ms=10),
                failure("other", FailureLayer.TRANSPORT, "read_timeout", batch_id="c")]
    selection = BackfillFilter(batch_id="b", include_business=True, since_ms=100)
    assert [r.request_id for r in plan_backfill(failures, {}, selection).replays] == ["b"]
    only_codes = BackfillFilter(error_codes=frozenset({"read_timeout"}), until_ms=1_000)
    assert sorted(r.request_id for r in plan_backfill(failures, {}, only_codes).replays) == ["old"]
    only_layer = BackfillFilter(layers=frozenset({FailureLayer.TRANSPORT}))
    assert sorted(r.request_id for r in plan_backfill(failures, {}, only_layer).replays) == ["old", "other"]


def test_latest_terminal_failure_per_id_wins_and_undecodable_records_are_skipped() -> None:
    failures = [failure("x", FailureLayer.TRANSPORT, "read_timeout"),
                failure("x", FailureLayer.SEMANTIC, "schema_mismatch"),
                failure("poison", FailureLayer.TRANSPORT, "read_timeout", body="")]
    plan = plan_backfill(failures, {}, BackfillFilter())
    assert [(r.request_id, r.repair is not None) for r in plan.replays] == [("x", True)]
    assert plan.counts[("transport", "read_timeout", "skip: the original record was undecodable")] == 1
    assert sum(1 for (_, _, d) in plan.counts if d == REPLAY) == 1


def test_a_forgotten_batchs_failures_are_skipped_since_a_worker_would_refuse_them() -> None:
    failures = [failure("gone/1", FailureLayer.TRANSPORT, "read_timeout", batch_id="gone"),
                failure("kept/1", FailureLayer.TRANSPORT, "read_timeout", batch_id="kept")]
    plan = plan_backfill(failures, {"gone/1": RequestStatus.FAILED}, BackfillFilter(), forgotten={"gone"})
    assert [r.request_id for r in plan.replays] == ["kept/1"]
    assert plan.counts[("transport", "read_timeout", "skip: batch forgotten")] == 1
