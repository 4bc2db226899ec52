"""A request's identity is (batch, custom_id); ids written before ids were scoped read as their own custom_id."""

from __future__ import annotations

import pytest

from streamproc.core.identity import batch_id_problem, custom_id_of, request_id_for


def test_the_same_custom_id_in_two_batches_is_two_requests() -> None:
    assert request_id_for("batch-1", "request-1") == "batch-1/request-1"
    assert request_id_for("batch-1", "request-1") != request_id_for("batch-2", "request-1")


@pytest.mark.parametrize("custom_id", ["request-1", "a/b", "/", "batch-1/x", " spaced ", "Grüße 👋"])
def test_custom_id_round_trips(custom_id: str) -> None:
    assert custom_id_of(request_id_for("batch-1", custom_id), "batch-1") == custom_id


@pytest.mark.parametrize(("request_id", "batch_id"), [
    ("request-1", "batch-1"),  # written before ids were scoped: the custom_id itself
    ("other/request-1", "batch-1"),  # another producer's id
    ("batch-1/", "batch-1"),  # nothing after the scope: not a scoped id
    ("batch-1/request-1", None),  # no batch: nothing to strip
])
def test_ids_without_their_batch_scope_are_their_own_custom_id(request_id: str, batch_id: str | None) -> None:
    assert custom_id_of(request_id, batch_id) == request_id


def test_batch_ids_that_would_make_request_ids_ambiguous_are_refused() -> None:
    assert batch_id_problem("labels-2026-11") is None
    assert batch_id_problem("batch_abc.1") is None
    assert batch_id_problem("a/b") is not None  # ("a/b", "c") and ("a", "b/c") would be one request id
    assert batch_id_problem("") is not None
    assert batch_id_problem("  ") is not None
