"""The list of batches: one row per batch with its counts, OpenAI's batch object shape in JSON."""

from __future__ import annotations

from dataclasses import replace

from streamproc.codec.manifest import BatchManifest
from streamproc.core.batch_status import BatchesFold, format_status
from streamproc.core.events import RequestState
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.ops.batches import BatchEntry, format_batches


def state(request_id: str, batch_id: str | None, status: RequestStatus, created_ms: int = 5_000) -> RequestState:
    layer = FailureLayer.BUSINESS if status is RequestStatus.FAILED else None
    return RequestState(request_id, status, "h", batch_id=batch_id, last_layer=layer, created_ms=created_ms)


def test_each_batch_is_folded_on_its_own() -> None:
    fold = BatchesFold()
    fold.apply([state("a/1", "a", RequestStatus.SUCCEEDED), state("b/1", "b", RequestStatus.IN_FLIGHT),
                state("a/2", "a", RequestStatus.FAILED), state("x", None, RequestStatus.SUCCEEDED)])
    assert sorted(fold.folds) == ["a", "b"]
    assert fold.status("a", 2).converged
    assert fold.status("b", 3).pending == 2
    assert fold.status("unknown", 4).pending == 4
    assert fold.folds["b"].first_created_ms == 5_000


def test_entry_has_openais_batch_keys_and_the_table_lines_up() -> None:
    fold = BatchesFold()
    fold.apply([replace(state("a/1", "a", RequestStatus.SUCCEEDED), tenant="team-b", priority="high"),
                replace(state("a/2", "a", RequestStatus.FAILED), tenant="team-a")])
    done = BatchEntry(fold.status("a", 2, 1_700_000_000_000), 1_700_000_000_000,
                      BatchManifest("a", 2, 1_700_000_000_000, "in.jsonl"))
    running = BatchEntry(fold.status("labels-2026-11", 3), 0, None)
    document = done.as_json()
    assert {key: document[key] for key in ("id", "object", "created_at", "status", "request_counts", "source")} == {
        "id": "a", "object": "batch", "created_at": 1_700_000_000, "status": "completed",
        "request_counts": {"total": 2, "completed": 1, "failed": 1}, "source": "in.jsonl"}
    assert document["counts"]["converged"] is True
    assert (document["counts"]["tenants"], document["counts"]["priorities"]) == ({"team-a": 1, "team-b": 1},
                                                                                 {"high": 1, "normal": 1})
    assert (document["completed_at"], document["cancelled_at"], document["expired_at"]) == (1_700_000_000, None, None)
    assert document["usage"]["total_tokens"] == 0
    assert running.state == "in_progress"
    capped = replace(running, spend={"cost_usd": 1.5, "tokens": 900, "max_cost_usd": 3.0, "max_tokens": None})
    assert format_batches([done, running, capped]).splitlines() == [
        "BATCH           CREATED              STATUS       TENANT     PRIORITY  TOTAL  SUCCEEDED  FAILED  WAITING"
        "          SPEND",
        "a               2023-11-14 22:13:20  completed    team-a +1  high +1       2          1       1        0"
        "              -",
        "labels-2026-11  -                    in_progress  -          -             3          0       0        3"
        "              -",
        "labels-2026-11  -                    in_progress  -          -             3          0       0        3"
        "  $1.5000 of $3",
    ]


def test_a_cancelled_batch_is_cancelling_until_it_converges_then_cancelled() -> None:
    fold = BatchesFold()
    fold.apply([state("c/1", "c", RequestStatus.SUCCEEDED), state("c/2", "c", RequestStatus.IN_FLIGHT)])
    manifest = BatchManifest("c", 2, 1_000, "in.jsonl", cancelled_ms=2_000)
    assert BatchEntry(fold.status("c", 2), 1_000, manifest).state == "cancelling"  # a call still runs
    fold.apply([state("c/2", "c", RequestStatus.FAILED)])
    assert BatchEntry(fold.status("c", 2), 1_000, manifest).state == "cancelled"


def test_a_batch_whose_last_request_ended_after_its_window_is_expired() -> None:
    fold = BatchesFold()
    fold.apply([state("e/1", "e", RequestStatus.SUCCEEDED), replace(state("e/2", "e", RequestStatus.FAILED),
                                                                    updated_ms=9_000)])
    assert BatchEntry(fold.status("e", 2), 1_000, BatchManifest("e", 2, 1_000, "f", expires_ms=8_000)).state == \
        "expired"
    assert BatchEntry(fold.status("e", 2), 1_000, BatchManifest("e", 2, 1_000, "f", expires_ms=10_000)).state == \
        "completed"


def test_a_forgotten_batch_is_listed_as_forgotten_with_the_counts_it_ended_with() -> None:
    from streamproc.core.retention import Forgotten
    from streamproc.ops.status import status_of

    fold = BatchesFold()
    fold.apply([state("a/1", "a", RequestStatus.SUCCEEDED)])  # a state still on the changelog before its tombstone
    manifest = BatchManifest("a", 3, 1_700_000_000_000, "in.jsonl",
                             forgotten=Forgotten(1_700_000_900_000, 1_700_000_500_000, 2, {"business": 1}))
    status = status_of(manifest, lambda submitted, created_ms: fold.status("a", submitted, created_ms))
    document = BatchEntry(status, manifest.created_ms, manifest).as_json()
    assert {key: document[key] for key in ("status", "completed_at", "forgotten_at", "request_counts")} == {
        "status": "forgotten", "completed_at": 1_700_000_500, "forgotten_at": 1_700_000_900,
        "request_counts": {"total": 3, "completed": 2, "failed": 1}}
    assert "forgotten" in format_batches([BatchEntry(status, manifest.created_ms, manifest)])


def test_a_batch_waiting_on_a_paused_tenant_says_so_in_the_list_and_in_status() -> None:
    fold = BatchesFold()
    fold.apply([replace(state("a/1", "a", RequestStatus.RETRYING), last_error_code="tenant_paused"),
                replace(state("a/2", "a", RequestStatus.RETRYING), last_error_code="tenant_paused"),
                state("a/3", "a", RequestStatus.SUCCEEDED)])
    status = fold.status("a", 3)
    assert status.as_json()["parked"] == {"tenant_paused": 2}
    row = format_batches([BatchEntry(status, 0, None)]).splitlines()[1]
    assert "2 (2 tenant_paused)" in row
    assert "retrying   2 (2 tenant_paused parked)" in format_status(status)
