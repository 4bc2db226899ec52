"""Systematic failures, per model: the first calls all failing alike pause the model; anything else does not."""

from __future__ import annotations

from streamproc.core.guards.pauses import ModelPauses, Pause
from streamproc.core.outcome import ConfigurationProblem, Failure, Outcome, Success
from streamproc.core.vocabulary import FailureLayer

OK = Success("fine", "m", 10, 2)
REFUSED = Failure(FailureLayer.BUSINESS, "invalid_request_error", "HTTP 400: x-request-id must be a UUID", 400)
OTHER = Failure(FailureLayer.BUSINESS, "content_policy_violation", "HTTP 400: policy", 400)
MISSING = ConfigurationProblem("model_not_found", "HTTP 404: The model `gpt-5o` does not exist", 404)
UNAVAILABLE = Failure(FailureLayer.SERVICE, "http_503", "HTTP 503", 503)


def ended(pauses: ModelPauses, model: str, outcome: Outcome, now: float) -> None:
    """A call sent and answered before the next one went."""
    pauses.record(model, outcome, now, pauses.begin(model))


def test_three_identical_refusals_from_the_start_pause_the_model_only() -> None:
    heard: list[tuple[str, Pause | None]] = []
    pauses = ModelPauses(on_change=lambda model, pause: heard.append((model, pause)))
    for second in range(3):
        assert pauses.may_call("m", float(second))
        ended(pauses, "m", REFUSED, float(second))
    assert not pauses.may_call("m", 3.0) and pauses.may_call("other", 3.0)
    [(model, pause)] = heard
    assert model == "m" and pause is not None and "x-request-id must be a UUID" in pause.reason
    assert pauses.retry_at("m", 3.0) == 62.0


def test_a_model_not_found_is_paused_like_any_systematic_refusal() -> None:
    pauses = ModelPauses()
    for _ in range(3):
        ended(pauses, "gpt-5o", MISSING, 0.0)
    assert set(pauses.paused()) == {"gpt-5o"}


def test_a_probe_that_succeeds_resumes_the_model_and_one_that_fails_waits_again() -> None:
    pauses = ModelPauses(threshold=1, probe_interval_s=60)
    ended(pauses, "m", REFUSED, 0.0)
    assert pauses.may_call("m", 60.0)  # the probe
    assert not pauses.may_call("m", 61.0)  # only one per interval
    ended(pauses, "m", REFUSED, 61.0)
    assert not pauses.may_call("m", 100.0) and pauses.may_call("m", 120.0)
    ended(pauses, "m", OK, 121.0)
    assert pauses.paused() == {} and pauses.may_call("m", 121.5)


def test_a_model_that_answered_well_once_is_never_paused_by_later_failures() -> None:
    pauses = ModelPauses()
    ended(pauses, "m", OK, 0.0)
    for _ in range(10):
        ended(pauses, "m", REFUSED, 1.0)
    assert pauses.paused() == {}


def test_different_first_failures_are_the_requests_own_not_systematic() -> None:
    pauses = ModelPauses()
    for failure in (REFUSED, OTHER, REFUSED, REFUSED, REFUSED):
        ended(pauses, "m", failure, 0.0)
    assert pauses.paused() == {}


def test_retryable_failures_neither_count_nor_reset() -> None:
    pauses = ModelPauses()
    for failure in (REFUSED, UNAVAILABLE, REFUSED, UNAVAILABLE, REFUSED):
        ended(pauses, "m", failure, 0.0)
    assert set(pauses.paused()) == {"m"}


def test_failures_about_the_input_never_pause_a_model() -> None:
    """A batch of equally long prompts gets the same context-length message from every call: the context
    fallback handles those, and the model is fine (an integration test saw mock-small paused for it)."""
    too_long = Failure(FailureLayer.BUSINESS, "context_length_exceeded", "maximum context length is 4096", 400)
    pauses = ModelPauses()
    for _ in range(5):
        ended(pauses, "m", too_long, 0.0)
    assert pauses.paused() == {}
    for _ in range(5):  # the model read requests: a later systematic refusal is not one from the start
        ended(pauses, "m", REFUSED, 1.0)
    assert pauses.paused() == {}


def test_an_answer_that_fails_its_checks_proves_the_model_and_resumes_it() -> None:
    """A real server (llama-cpp-python) refuses `json_schema` at once with a 500, while answers take a second:
    the first three answers were the refusals, and the model stayed paused for the 30 s until its probe,
    although cut answers (semantic failures) came in meanwhile."""
    cut = Failure(FailureLayer.SEMANTIC, "truncated", "finish_reason=length: the answer was cut off", None)
    pauses = ModelPauses()
    for _ in range(3):
        ended(pauses, "m", REFUSED, 0.0)
    assert set(pauses.paused()) == {"m"}
    ended(pauses, "m", cut, 1.0)
    assert pauses.paused() == {}
    for _ in range(5):
        ended(pauses, "m", REFUSED, 2.0)
    assert pauses.paused() == {}  # proven: later refusals are the requests' own


def test_the_same_refusal_text_is_the_requests_own() -> None:
    """A safety-tuned model answers many prompts with one identical refusal: that is not a setup problem."""
    refusal = Failure(FailureLayer.BUSINESS, "refusal", "the model refused: I can't help with that.", None)
    pauses = ModelPauses()
    for _ in range(5):
        ended(pauses, "m", refusal, 0.0)
    assert pauses.paused() == {}


def test_the_first_calls_are_those_sent_first_not_answered_first() -> None:
    """16 calls in flight; the refusals of calls 5-7 come back at once, the answers of calls 0-4 later."""
    pauses = ModelPauses()
    calls = [pauses.begin("m") for _ in range(16)]
    for call in calls[5:8]:
        pauses.record("m", REFUSED, 0.1, call)
    assert pauses.paused() == {}  # calls 0-4 are still out
    pauses.record("m", OK, 1.0, calls[0])
    for call in calls[8:]:
        pauses.record("m", REFUSED, 1.1, call)
    assert pauses.paused() == {}  # proven by the first answer


def test_the_first_calls_failing_alike_pause_in_whatever_order_they_end() -> None:
    pauses = ModelPauses()
    first, second, third, fourth = (pauses.begin("m") for _ in range(4))
    pauses.record("m", REFUSED, 0.1, fourth)
    pauses.record("m", REFUSED, 0.2, third)
    pauses.record("m", REFUSED, 0.3, second)
    assert pauses.paused() == {}  # the first call sent has not ended
    pauses.record("m", REFUSED, 0.4, first)
    assert pauses.paused()["m"].since == 0.4


def test_calls_without_an_answer_are_skipped_and_do_not_hold_the_others() -> None:
    pauses = ModelPauses()
    calls = [pauses.begin("m") for _ in range(5)]
    pauses.abandon("m", calls[0], 0.0)  # refused before it went (a rate limit), or cancelled
    pauses.record("m", REFUSED, 0.1, calls[1])
    pauses.record("m", UNAVAILABLE, 0.1, calls[2])  # retryable: neither counts nor clears
    pauses.record("m", REFUSED, 0.2, calls[3])
    assert pauses.paused() == {}
    pauses.record("m", REFUSED, 0.3, calls[4])
    assert set(pauses.paused()) == {"m"}
    pauses.record("m", OK, 5.0, pauses.begin("m"))  # the probe
    assert pauses.paused() == {}
