"""Repair requests: the rejected answer and the format rules appended as the next chat turns."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from streamproc.core.events import InferenceRequest, RepairContext
from streamproc.llm.repair import build_repair_request, completion_budget, repair_messages, with_max_tokens

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
BODY: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "temperature": 0,
    "messages": [{"role": "system", "content": "Label it."}, {"role": "user", "content": "Buy now!!!"}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "label", "schema": SCHEMA}},
}


def test_build_repair_request_sets_repair_and_keeps_the_body() -> None:
    request = InferenceRequest("r1", json.dumps(BODY), batch_id="b1", metadata={"k": "v"})
    repaired = build_repair_request(request, '{"lbl": "spam"}', "schema_mismatch: 'label' is a required property")
    assert repaired.repair == RepairContext('{"lbl": "spam"}', "schema_mismatch: 'label' is a required property")
    assert (repaired.request_id, repaired.body_json, repaired.batch_id, repaired.metadata) == (
        "r1",
        request.body_json,
        "b1",
        {"k": "v"},
    )
    assert request.repair is None


def test_repair_messages_append_the_bad_output_and_the_schema() -> None:
    original = copy.deepcopy(BODY)
    repaired = repair_messages(BODY, RepairContext('{"lbl": "spam"}', "'label' is a required property"))
    assert original == BODY  # pure: the input is untouched
    assert repaired["messages"][:2] == BODY["messages"]
    assistant, user = repaired["messages"][2:]
    assert assistant == {"role": "assistant", "content": '{"lbl": "spam"}'}
    assert user["role"] == "user"
    assert "'label' is a required property" in user["content"]
    assert json.dumps(SCHEMA) in user["content"]
    assert {k: v for k, v in repaired.items() if k != "messages"} == {k: v for k, v in BODY.items() if k != "messages"}


def test_repair_of_an_empty_answer_does_not_echo_it() -> None:
    repaired = repair_messages(BODY, RepairContext("", "empty_content: the answer has no content"))
    assert [m["role"] for m in repaired["messages"]] == ["system", "user", "user"]
    assert "empty_content" in repaired["messages"][-1]["content"]


@pytest.mark.parametrize(
    ("response_format", "rule"),
    [
        ({"type": "json_object"}, "valid JSON object"),
        (None, "complete answer"),
        ({"type": "text"}, "complete answer"),
    ],
)
def test_repair_rules_follow_the_requested_format(response_format: dict[str, str] | None, rule: str) -> None:
    body = {**BODY, "response_format": response_format}
    user = repair_messages(body, RepairContext("oops", "invalid_json"))["messages"][-1]["content"]
    assert rule in user
    assert "JSON Schema" not in user


def test_repair_needs_chat_messages() -> None:
    with pytest.raises(ValueError, match="messages"):
        repair_messages({"model": "m", "prompt": "hi"}, RepairContext("x", "y"))


def test_the_budget_is_set_under_the_name_the_body_uses_and_read_only_when_positive() -> None:
    body = {"model": "m", "messages": []}
    assert completion_budget(body) is None  # the server's default is unknown: nothing to raise
    assert completion_budget({**body, "max_tokens": True}) is None
    assert completion_budget({**body, "max_tokens": 0}) is None
    assert completion_budget({**body, "max_completion_tokens": 32, "max_tokens": 8}) == 32
    assert with_max_tokens(body, None) is body
    assert with_max_tokens(body, 64) == {**body, "max_tokens": 64}
    assert with_max_tokens({**body, "max_completion_tokens": 8}, 64) == {**body, "max_completion_tokens": 64}
