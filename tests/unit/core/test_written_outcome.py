"""Which written outcome ends a member of a provider batch taken over (core.written_outcome): a result, or a
terminal failure, of the attempt its line was gathered for; a retried attempt's failure event never does."""

from __future__ import annotations

from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult
from streamproc.core.outcome import Failure, Success
from streamproc.core.vocabulary import FailureLayer
from streamproc.core.written_outcome import WrittenOutcome, for_attempt, written_failure, written_result

REQUEST = InferenceRequest("r1", "{}", batch_id="b")


def _event(attempt: int, terminal: bool) -> FailureEvent:
    return FailureEvent(REQUEST, FailureLayer.SERVICE, "batch_expired", "expired", attempt, terminal, 1, 2, 503)


def test_a_result_ends_its_attempt_with_the_tokens_counted() -> None:
    result = InferenceResult("r1", "b", "m", "{}", "hi", attempts=2, latency_ms=1, completed_ms=1, input_hash="h")
    assert written_result(result, (5, 1)) == WrittenOutcome(2, Success("hi", "m", 5, 1))


def test_only_a_terminal_failure_ends_its_attempt() -> None:
    assert written_failure(_event(1, terminal=False)) is None  # its retry record may not have been written
    assert written_failure(_event(3, terminal=True)) == WrittenOutcome(
        3, Failure(FailureLayer.SERVICE, "batch_expired", "expired", 503))


def test_the_outcome_of_the_attempt_gathered_for_or_the_latest_when_unknown() -> None:
    first, second = WrittenOutcome(1, Success("a", "m", 1, 1)), WrittenOutcome(2, Success("b", "m", 1, 1))
    assert for_attempt([first, second], 1) == first
    assert for_attempt([first], 2) is None
    assert for_attempt([second, first], None) == second
    assert for_attempt([], None) is None
