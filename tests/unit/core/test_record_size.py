"""Requests too large to travel inside the worker's own records."""

from __future__ import annotations

from streamproc.core.events import InferenceRequest, RepairContext
from streamproc.core.record_size import CARRIED_BYTES, request_bytes, too_large_to_carry, without_body


def test_the_size_counts_body_repair_and_metadata() -> None:
    request = InferenceRequest("r", "é" * 10, repair=RepairContext("ab", "why"), metadata={"k": "vv"})
    assert request_bytes(request) == 20 + 2 + 3 + 3


def test_a_request_over_the_limit_is_carried_without_its_body_and_says_where_it_is() -> None:
    big = InferenceRequest("r", "x" * (CARRIED_BYTES + 1), batch_id="b", metadata={"a": "b"})
    assert too_large_to_carry(big) and not too_large_to_carry(InferenceRequest("r", "x" * CARRIED_BYTES))
    slim = without_body(big, "llm.requests[3]@0")
    assert (slim.request_id, slim.batch_id, slim.body_json, slim.repair) == ("r", "b", "", None)
    assert slim.metadata == {"body_omitted": f"{CARRIED_BYTES + 3} bytes, too large to carry in this event; the "
                                             "request is at llm.requests[3]@0"}
