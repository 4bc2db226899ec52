"""Provider-batch lines answered 200 get the same check a synchronous 200 gets (issue 31): the core turns the
line into a chat completion, ``check_completion`` judges it (a cut answer is truncated, a refusal business)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from streamproc.core.outcome import Failure, Success
from streamproc.core.provider_batch_lines import AnsweredLine, anthropic_line, openai_line
from streamproc.llm.completion import check_completion
from tests.unit.core.test_provider_batch_lines import COMPLETION, LEAF, REQUEST, anthropic, message, openai


def test_a_200_line_is_checked_as_a_synchronous_200() -> None:
    outcome = openai_line(openai(body=COMPLETION))
    assert outcome.custom_id == "r1"
    assert isinstance(outcome.verdict, AnsweredLine) and outcome.verdict.provider_request_id == "req_1"
    checked = check_completion(outcome.verdict.body, REQUEST)
    assert isinstance(checked, Success) and checked.content == "Positive." and checked.completion_tokens == 2
    cut = {**COMPLETION, "choices": [{**COMPLETION["choices"][0], "finish_reason": "length"}]}
    answered = openai_line(openai(body=cut)).verdict
    assert isinstance(answered, AnsweredLine)
    truncated = check_completion(answered.body, REQUEST)
    assert isinstance(truncated, Failure) and truncated.code == "truncated"


def test_an_anthropic_message_is_checked_as_a_chat_completion() -> None:
    verdict = anthropic_line(anthropic({"type": "succeeded", "message": message()})).verdict
    assert isinstance(verdict, AnsweredLine)
    checked = check_completion(verdict.body, REQUEST)
    assert isinstance(checked, Success) and checked.content == "Positive." and checked.prompt_tokens == 5
    cut = anthropic_line(anthropic({"type": "succeeded", "message": message("max_tokens")})).verdict
    assert isinstance(cut, AnsweredLine)
    assert isinstance(failed := check_completion(cut.body, REQUEST), Failure) and failed.code == "truncated"
    refused = anthropic_line(anthropic({"type": "succeeded", "message": message("refusal")})).verdict
    assert isinstance(refused, AnsweredLine)
    assert isinstance(failed := check_completion(refused.body, REQUEST), Failure)
    assert failed.code == "content_policy_violation"


MESSAGES = st.fixed_dictionaries({}, optional={
    "id": LEAF, "model": LEAF, "stop_reason": st.sampled_from(["end_turn", "max_tokens", "refusal"]) | LEAF,
    "content": LEAF | st.lists(LEAF | st.fixed_dictionaries({"type": LEAF, "text": LEAF}), max_size=3),
    "usage": LEAF | st.dictionaries(st.sampled_from(["input_tokens", "output_tokens"]), LEAF),
})


@given(message=MESSAGES)
def test_any_succeeded_message_becomes_a_completion_the_200_check_judges(message: dict[str, Any]) -> None:
    verdict = anthropic_line(anthropic({"type": "succeeded", "message": message})).verdict
    assert isinstance(verdict, AnsweredLine)
    assert isinstance(check_completion(verdict.body, REQUEST), Success | Failure)
