"""Result reuse, the pure part: who opts in, which results may answer later requests, and what a reused answer
looks like as an event and as a state."""

from __future__ import annotations

from dataclasses import replace

from streamproc.core.events import InferenceRequest, InferenceResult, RequestState
from streamproc.core.reuse import REUSE_RESULTS, indexable, on_reused, reuse_wanted, reused_result
from streamproc.core.vocabulary import RequestStatus

ORIGINAL = InferenceResult("a/c-1", "a", "mock-small-0613", '{"id": "chatcmpl-1"}', "spam", 2, 840, 1_000, "h1",
                           provider_request_id="req_provider")
REQUEST = InferenceRequest("b/c-9", '{"model": "mock-small"}', batch_id="b")


def test_a_record_opts_in_by_its_header_or_by_its_batchs_manifest() -> None:
    assert reuse_wanted({REUSE_RESULTS: b"1"}, batch_reuses=False)
    assert reuse_wanted({}, batch_reuses=True)  # a retry or a replay: no header, the manifest says it
    assert not reuse_wanted({}, batch_reuses=False)
    assert not reuse_wanted({REUSE_RESULTS: b"0"}, batch_reuses=False)


def test_only_answers_that_were_called_for_are_indexed() -> None:
    assert indexable(ORIGINAL)
    assert not indexable(replace(ORIGINAL, reused_from="x/c-0"))


def test_a_reused_result_has_the_answer_and_this_requests_identity_and_names_its_origin() -> None:
    reused = reused_result(ORIGINAL, REQUEST, "h1", 5_000)
    assert (reused.request_id, reused.batch_id, reused.reused_from) == ("b/c-9", "b", "a/c-1")
    assert (reused.model, reused.response_json, reused.content) == (ORIGINAL.model, ORIGINAL.response_json, "spam")
    assert (reused.attempts, reused.latency_ms, reused.completed_ms) == (0, 0, 5_000)  # no call was made
    assert reused.provider_request_id == "req_provider"  # the provider's id of the call that answered


def test_a_reused_state_succeeded_with_the_answers_model_and_no_tokens_spent() -> None:
    started = RequestState("b/c-9", RequestStatus.IN_FLIGHT, "h1", 1, "b", created_ms=10, updated_ms=10,
                           source_topic="llm.requests", source_offset=4, prompt_tokens=3)
    done = on_reused(started, reused_result(ORIGINAL, REQUEST, "h1", 5_000), 6_000)
    assert (done.status, done.reused, done.model) == (RequestStatus.SUCCEEDED, True, "mock-small-0613")
    assert (done.prompt_tokens, done.completion_tokens, done.updated_ms) == (0, 0, 6_000)
    assert (done.source_topic, done.source_offset) == (None, None)
