"""What a failure event keeps of the provider's answer: the body, bounded, and the provider's own request id."""

from __future__ import annotations

import json
from collections.abc import Mapping

import httpx
import pytest

from streamproc.core.events import InferenceRequest
from streamproc.llm.client import LLMClient
from streamproc.llm.provider_answer import KEPT_BODY_BYTES, kept_body, provider_request_id
from streamproc.settings import Settings


@pytest.mark.parametrize(("headers", "expected"), [
    ({"x-request-id": "req_abc"}, "req_abc"),  # OpenAI, vLLM, Azure
    ({"X-Request-ID": "req_abc"}, "req_abc"),  # header names are case-insensitive
    ({"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"}, "req_011CSHoEeqs5C35K2UUqR7Fy"),  # Anthropic
    ({"x-request-id": "a", "request-id": "b"}, "a"),
    ({"x-request-id": "  "}, None),
    ({"x-client-request-id": "ours"}, None),  # our own correlation id is not the provider's
    ({}, None),
])
def test_the_providers_request_id_comes_from_its_headers_or_is_none(headers: dict[str, str],
                                                                    expected: str | None) -> None:
    assert provider_request_id(headers) == expected


def test_a_body_within_the_bound_is_kept_verbatim() -> None:
    body = json.dumps({"error": {"message": "Th\u00eds model's maximum context length is 8192 tokens."}}).encode()
    assert kept_body(body) == body.decode()
    assert kept_body(b"") == ""
    assert kept_body(b"x" * KEPT_BODY_BYTES) == "x" * KEPT_BODY_BYTES


@pytest.mark.parametrize("body", [
    b"x" * (KEPT_BODY_BYTES + 1),
    "\u00e9".encode() * KEPT_BODY_BYTES,  # two bytes a character: the cut must not split one
    b"\xff" * (KEPT_BODY_BYTES // 2),  # within the bound as bytes, but each stray byte becomes 3 bytes of U+FFFD
])
def test_a_longer_body_is_cut_within_the_bound_and_says_its_size(body: bytes) -> None:
    kept = kept_body(body)
    assert len(kept.encode("utf-8")) <= KEPT_BODY_BYTES
    assert kept.endswith(f"\u2026 [cut: {len(body)} bytes in all]")
    assert body.decode("utf-8", "replace").startswith(kept[: -len(f"\u2026 [cut: {len(body)} bytes in all]")])


def completion(*messages: Mapping[str, object], **extra: object) -> bytes:
    return json.dumps({"id": "chatcmpl-9", "object": "chat.completion", "model": "gpt-4o-2024-08-06",
                       "choices": [{"index": i, "message": m, "logprobs": None, "finish_reason": "stop"}
                                   for i, m in enumerate(messages)],
                       "usage": {"prompt_tokens": 12, "completion_tokens": 700_000, "total_tokens": 700_012},
                       **extra}, ensure_ascii=False).encode()


@pytest.mark.parametrize("text", [
    "word " * 600_000,
    "\u00e9\"\n\u4e2d" * 300_000,  # characters JSON escapes or UTF-8 writes in 2-3 bytes: the cut is searched
])
def test_a_long_completion_keeps_its_json_with_the_text_cut_and_everything_else_whole(text: str) -> None:
    body = completion({"role": "assistant", "content": text, "refusal": None})
    kept = kept_body(body)
    assert KEPT_BODY_BYTES - 64 < len(kept.encode()) <= KEPT_BODY_BYTES  # the room is used, never passed
    doc, whole = json.loads(kept), json.loads(body)
    content = doc["choices"][0]["message"].pop("content")
    note = f"\u2026 [cut: {len(text.encode())} bytes in all]"
    assert content.endswith(note) and text.startswith(content.removesuffix(note))
    del whole["choices"][0]["message"]["content"]
    assert doc == whole  # id, model, finish_reason, usage: as the provider sent them


def test_choices_share_the_room_and_a_short_one_stays_whole() -> None:
    body = completion({"role": "assistant", "content": "short and whole"},
                      {"role": "assistant", "content": "a" * 400_000, "reasoning_content": "b" * 400_000})
    doc = json.loads(kept_body(body))
    assert len(kept_body(body).encode()) <= KEPT_BODY_BYTES
    first, second = (choice["message"] for choice in doc["choices"])
    assert first["content"] == "short and whole"
    assert second["content"].endswith("[cut: 400000 bytes in all]")
    assert second["reasoning_content"].endswith("[cut: 400000 bytes in all]")
    assert abs(len(second["content"]) - len(second["reasoning_content"])) <= 1


def test_logprobs_are_left_out_of_a_cut_completion() -> None:
    raw = json.loads(completion({"role": "assistant", "content": "x" * 200_000}))
    raw["choices"][0]["logprobs"] = {"content": [{"token": "x", "logprob": -0.1, "top_logprobs": []}] * 1000}
    doc = json.loads(kept_body(json.dumps(raw).encode()))
    assert doc["choices"][0]["logprobs"] is None
    assert doc["choices"][0]["message"]["content"].endswith("[cut: 200000 bytes in all]")


def test_a_completion_whose_other_parts_alone_pass_the_bound_is_cut_as_text() -> None:
    body = completion(*({"role": "assistant", "content": "x" * 10} for _ in range(KEPT_BODY_BYTES // 40)))
    kept = kept_body(body)
    assert len(kept.encode()) <= KEPT_BODY_BYTES and kept.endswith(f"[cut: {len(body)} bytes in all]")


async def test_the_client_hands_the_response_headers_over_for_the_request_id() -> None:
    """Through the real client: the headers of an error answer reach the caller (an httpx transport stands in
    for the server; the client's own code runs whole)."""
    error = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}

    async def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json=error, headers={"x-request-id": "req_429", "retry-after-ms": "10"})

    client = LLMClient(Settings(llm_base_url="http://llm.test/v1").llm_endpoint, connections=256, hedge_ratio=0,
                       transport=httpx.MockTransport(server))
    try:
        called = await client.call(InferenceRequest("r-1", "{}"), {"model": "m", "messages": []})
    finally:
        await client.aclose()
    assert provider_request_id(called.headers) == "req_429"
    assert json.loads(kept_body(called.response_body)) == error
