"""A chat-completions body as a provider batch's line (issue 31): OpenAI's line carries it as it is; Anthropic's
Messages parameters carry what has a counterpart and refuse, by name, what has none."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamproc.core.provider_batch_gatherer import ANTHROPIC_LIMITS, BatchGatherer, PendingLine
from streamproc.core.provider_batch_requests import (
    NotConvertible,
    anthropic_body,
    anthropic_request,
    messages_params,
    openai_line,
)

BODY: dict[str, Any] = {"model": "claude-x", "max_tokens": 64, "temperature": 0.2, "stop": "END", "user": "u-1",
                        "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "developer", "content": [{"type": "text", "text": "Label only."}]},
                                     {"role": "user", "content": "Label: great value 😀"},
                                     {"role": "assistant", "content": "Positive"},
                                     {"role": "user", "content": [{"type": "text", "text": "And: slow"}]}]}


def test_an_openai_line_carries_the_body_as_it_is() -> None:
    line = json.loads(openai_line("m0", BODY))
    assert line == {"custom_id": "m0", "method": "POST", "url": "/v1/chat/completions", "body": BODY}
    assert "😀".encode() in openai_line("m0", BODY)  # UTF-8, not escapes: the gatherer counts these bytes


def test_messages_params_of_a_chat_body() -> None:
    assert messages_params(BODY) == {
        "model": "claude-x", "max_tokens": 64, "temperature": 0.2, "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"},
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Label only."}],
        "messages": [{"role": "user", "content": "Label: great value 😀"},
                     {"role": "assistant", "content": "Positive"},
                     {"role": "user", "content": [{"type": "text", "text": "And: slow"}]}]}
    short = messages_params({"model": "m", "max_completion_tokens": 5, "stop": ["a", "b"],
                             "messages": [{"role": "user", "content": "hi"}]})
    assert short == {"model": "m", "max_tokens": 5, "stop_sequences": ["a", "b"],
                     "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("body", "message"), [
    ({**BODY, "tools": [], "response_format": {}}, "no counterpart here for response_format, tools"),
    ({**BODY, "n": 2}, "n must be 1"),
    ({**BODY, "stream": True}, "cannot stream"),
    ({k: v for k, v in BODY.items() if k != "max_tokens"}, "needs max_tokens"),
    ({**BODY, "max_tokens": 0}, "needs max_tokens"),
    ({**BODY, "messages": []}, "non-empty list"),
    ({**BODY, "messages": [{"role": "system", "content": "x"}]}, "at least one user or assistant"),
    ({**BODY, "messages": [{"role": "tool", "content": "x"}]}, "role 'tool'"),
    ({**BODY, "messages": [{"role": "assistant", "content": None, "tool_calls": []}]},
     "messages\\[0\\] has tool_calls"),
    ({**BODY, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages\\[0\\].content is not text"),
])
def test_what_the_messages_api_cannot_carry_is_refused_by_name(body: dict[str, Any], message: str) -> None:
    with pytest.raises(NotConvertible, match=message):
        anthropic_request("m0", body)


def test_the_anthropic_body_is_as_long_as_the_gatherer_counted() -> None:
    gatherer = BatchGatherer(ANTHROPIC_LIMITS)
    requests = [anthropic_request(f"m{i}", BODY) for i in range(3)]
    for index, request in enumerate(requests):
        gatherer.add(PendingLine(f"m{index}", "claude-x", request), now_ms=0)
    sealed = gatherer.flush()[0]
    body = anthropic_body([line.line for line in sealed.lines])
    # the gatherer counts a separator for every request; the body has one fewer
    assert len(body) == sealed.size_bytes - 1
    assert [r["custom_id"] for r in json.loads(body)["requests"]] == ["m0", "m1", "m2"]
