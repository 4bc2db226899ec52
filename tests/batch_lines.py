"""Parse export lines with the providers' own types: OpenAI's (``openai``) and Anthropic's (``anthropic``).

The ``openai`` package has no type for a whole batch output line, so :class:`OpenAIBatchLine` is OpenAI's
published ``BatchRequestOutput`` (``id``, ``custom_id``, ``response`` with ``status_code``, ``request_id`` and
``body``, ``error`` with ``code`` and ``message``), nothing else but our ``streamproc`` key, and every part
the package does type is parsed with its type: a 200 body as ``ChatCompletion``, an error body's ``error`` as
``ErrorObject``, ``error`` as ``BatchError``.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
from anthropic.types.messages import MessageBatchIndividualResponse
from openai.types import BatchError, ErrorObject
from openai.types.chat import ChatCompletion


class OpenAIResponse(pydantic.BaseModel, extra="forbid"):
    status_code: int
    request_id: str | None
    body: dict[str, Any]


class OpenAIBatchLine(pydantic.BaseModel, extra="forbid"):
    id: str
    custom_id: str
    response: OpenAIResponse | None
    error: BatchError | None
    streamproc: dict[str, Any] | None = None


def parse_openai_line(text: str) -> tuple[OpenAIBatchLine, ChatCompletion | ErrorObject | None]:
    """The line, and its response body as the openai type it is (a completion, or an error's object)."""
    line = OpenAIBatchLine.model_validate_json(text)
    assert line.id.startswith("batch_req_"), line.id
    assert line.response is not None or line.error is not None, f"a line says nothing: {text}"
    if line.response is None:
        return line, None
    if 200 <= line.response.status_code < 300:
        return line, ChatCompletion.model_validate(line.response.body)
    return line, ErrorObject.model_validate(line.response.body["error"])


def parse_anthropic_line(text: str) -> MessageBatchIndividualResponse:
    """The line as Anthropic's Message Batches result type; only ``streamproc`` besides its own keys."""
    assert set(json.loads(text)) <= {"custom_id", "result", "streamproc"}, text
    return MessageBatchIndividualResponse.model_validate_json(text)
