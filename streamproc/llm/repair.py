"""Repair requests: the rejected answer and the format rules sent back to the model (design §2, L3)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from streamproc.core.events import InferenceRequest, RepairContext


def with_max_tokens(body: dict[str, Any], max_tokens: int | None) -> dict[str, Any]:
    """The body with its completion budget set to ``max_tokens`` (``max_completion_tokens`` when the body
    uses OpenAI's newer name); unchanged when None."""
    if max_tokens is None:
        return body
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    return {**body, key: max_tokens}


def completion_budget(body: Mapping[str, Any]) -> int | None:
    """The body's ``max_completion_tokens`` or ``max_tokens``, when it sets a positive one."""
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def build_repair_request(request: InferenceRequest, bad_output: str, reason: str) -> InferenceRequest:
    """The same request (same body, so the same input hash) carrying what to repair on its next call."""
    return replace(request, repair=RepairContext(bad_output=bad_output, reason=reason))


def repair_messages(body: Mapping[str, Any], repair: RepairContext) -> dict[str, Any]:
    """A copy of a chat body with the rejected answer and the format rules appended as the next turns.

    The body must have a ``messages`` list (chat completions; other bodies are rejected as malformed input
    before any call). An empty rejected answer is not echoed: some providers refuse empty assistant turns.
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ValueError("a repair needs a chat completions body with a messages list")
    turns: list[dict[str, Any]] = []
    if repair.bad_output.strip():
        turns.append({"role": "assistant", "content": repair.bad_output})
    turns.append({"role": "user", "content": _repair_instructions(body.get("response_format"), repair.reason)})
    return {**body, "messages": [*messages, *turns]}


def _repair_instructions(response_format: Any, reason: str) -> str:
    fmt = response_format if isinstance(response_format, dict) else {}
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if fmt.get("type") == "json_schema" and isinstance(schema, dict):
        rules = (
            "Reply with only a JSON value that validates against this JSON Schema, "
            f"with no prose and no code fences:\n{json.dumps(schema, ensure_ascii=False)}"
        )
    elif fmt.get("type") in ("json_object", "json_schema"):
        rules = "Reply with only a valid JSON object, with no prose and no code fences."
    else:
        rules = "Reply again with a complete answer."
    return f"Your previous answer was rejected: {reason}\n{rules}"
