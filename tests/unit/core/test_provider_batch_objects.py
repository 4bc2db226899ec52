"""The providers' batch objects read into values (issue 31), on the shapes their API references give: every
status maps to one phase, counts and file ids are kept, and a shape that is not the provider's is refused with
a message that says what is wrong."""

from __future__ import annotations

from typing import Any

import pytest

from streamproc.core.provider_batch_objects import (
    BatchPhase,
    MalformedAnswer,
    anthropic_batch,
    batch_page,
    openai_batch,
    openai_file_id,
)

# OpenAI's API reference, "The batch object"
OPENAI_BATCH: dict[str, Any] = {
    "id": "batch_abc123", "object": "batch", "endpoint": "/v1/completions", "errors": None,
    "input_file_id": "file-abc123", "completion_window": "24h", "status": "completed",
    "output_file_id": "file-cvaTdG", "error_file_id": "file-HOWS94", "created_at": 1711471533,
    "in_progress_at": 1711471538, "expires_at": 1711557933, "finalizing_at": 1711493133,
    "completed_at": 1711493163, "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
    "request_counts": {"total": 100, "completed": 95, "failed": 5},
    "metadata": {"customer_id": "user_123456789", "batch_description": "Nightly eval job"},
}
# Anthropic's API reference, "Retrieve a Message Batch"
ANTHROPIC_BATCH: dict[str, Any] = {
    "id": "msgbatch_013Zva2CMHLNnXjNJJKqJ2EF", "type": "message_batch", "processing_status": "in_progress",
    "request_counts": {"processing": 100, "succeeded": 50, "errored": 30, "canceled": 10, "expired": 10},
    "ended_at": None, "created_at": "2024-08-20T18:37:24.100435Z", "expires_at": "2024-08-21T18:37:24.100435Z",
    "archived_at": None, "cancel_initiated_at": None,
    "results_url": None,
}


def test_openai_batch_keeps_its_phase_counts_files_and_metadata() -> None:
    view = openai_batch(OPENAI_BATCH)
    assert (view.provider, view.batch_id, view.phase, view.total, view.finished) == (
        "openai", "batch_abc123", BatchPhase.COMPLETED, 100, 100)
    assert (view.output_file_id, view.error_file_id) == ("file-cvaTdG", "file-HOWS94")
    assert view.metadata == {"customer_id": "user_123456789", "batch_description": "Nightly eval job"}
    assert view.phase.ended and view.errors == () and view.created_ms == 1_711_471_533_000


@pytest.mark.parametrize("status", [p.value for p in BatchPhase])
def test_every_openai_status_is_a_phase(status: str) -> None:
    assert openai_batch({**OPENAI_BATCH, "status": status}).phase.value == status


def test_a_failed_openai_batch_lists_its_validation_errors() -> None:
    doc = {**OPENAI_BATCH, "status": "failed", "output_file_id": None, "error_file_id": None,
           "errors": {"object": "list", "data": [{"code": "invalid_json_line", "message": "Line 2 is not JSON.",
                                                  "param": None, "line": 2}]}}
    view = openai_batch(doc)
    assert view.phase is BatchPhase.FAILED and view.errors == ("invalid_json_line: Line 2 is not JSON.",)


def test_running_phases_have_not_ended() -> None:
    for phase in (BatchPhase.VALIDATING, BatchPhase.IN_PROGRESS, BatchPhase.FINALIZING, BatchPhase.CANCELLING):
        assert not phase.ended


@pytest.mark.parametrize(("changes", "message"), [
    ({"status": "paused"}, "unknown status 'paused'"),
    ({"id": None}, "id is not a non-empty string"),
    ({"request_counts": {"total": -1}}, "request_counts.total is not a count"),
    ({"request_counts": {"total": True}}, "request_counts.total is not a count"),
    ({"output_file_id": 7}, "output_file_id is not a string"),
])
def test_an_openai_batch_not_of_its_shape_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(MalformedAnswer, match=message):
        openai_batch({**OPENAI_BATCH, **changes})


def test_openai_file_id() -> None:
    assert openai_file_id({"id": "file-abc123", "object": "file", "bytes": 120000, "created_at": 1677610602,
                           "filename": "batch.jsonl", "purpose": "batch"}) == "file-abc123"
    with pytest.raises(MalformedAnswer, match="expected a file object"):
        openai_file_id({"id": "batch_1", "object": "batch"})
    with pytest.raises(MalformedAnswer, match="as a JSON object"):
        openai_file_id(["file-1"])


def test_anthropic_batch_in_progress_counts_what_came_to_an_end() -> None:
    view = anthropic_batch(ANTHROPIC_BATCH)
    assert (view.provider, view.phase, view.total, view.finished) == ("anthropic", BatchPhase.IN_PROGRESS, 200, 100)
    assert view.metadata is None and view.results_url is None
    assert view.created_ms == 1_724_179_044_100  # 2024-08-20T18:37:24.100435Z, to the millisecond


@pytest.mark.parametrize(("changes", "phase"), [
    ({"processing_status": "canceling", "cancel_initiated_at": "2024-08-20T18:40:00Z"}, BatchPhase.CANCELLING),
    ({"processing_status": "ended", "cancel_initiated_at": "2024-08-20T18:40:00Z"}, BatchPhase.CANCELLED),
    ({"processing_status": "ended"}, BatchPhase.EXPIRED),  # ten expired
    ({"processing_status": "ended", "request_counts": {"processing": 0, "succeeded": 9, "errored": 1,
                                                       "canceled": 0, "expired": 0}}, BatchPhase.COMPLETED),
])
def test_which_end_an_anthropic_batch_came_to(changes: dict[str, Any], phase: BatchPhase) -> None:
    assert anthropic_batch({**ANTHROPIC_BATCH, **changes}).phase is phase


@pytest.mark.parametrize(("changes", "message"), [
    ({"type": "message"}, "expected a message_batch"),
    ({"processing_status": "queued"}, "unknown processing_status 'queued'"),
    ({"request_counts": None}, "has no request_counts"),
    ({"request_counts": {"succeeded": "5"}}, "request_counts.succeeded is not a count"),
    ({"created_at": "yesterday"}, "not an RFC 3339 time"),
    ({"created_at": "2024-08-20T18:37:24"}, "no time zone"),
])
def test_an_anthropic_batch_not_of_its_shape_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(MalformedAnswer, match=message):
        anthropic_batch({**ANTHROPIC_BATCH, **changes})


def test_a_page_of_batches() -> None:
    page = batch_page({"object": "list", "data": [OPENAI_BATCH, {**OPENAI_BATCH, "id": "batch_2"}],
                       "first_id": "batch_abc123", "last_id": "batch_2", "has_more": True}, openai_batch)
    assert [b.batch_id for b in page.batches] == ["batch_abc123", "batch_2"]
    assert page.has_more and page.last_id == "batch_2"
    empty = batch_page({"data": [], "has_more": False, "first_id": None, "last_id": None}, anthropic_batch)
    assert empty.batches == () and not empty.has_more and empty.last_id is None
    with pytest.raises(MalformedAnswer, match="without a data array"):
        batch_page({"data": None}, openai_batch)
