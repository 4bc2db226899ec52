"""What a failure event keeps of the provider's answer: the body, bounded, and the provider's own request id."""

from __future__ import annotations

import json

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


async def test_the_client_hands_the_response_headers_over_for_the_request_id() -> None:
    """Through the real client: the headers of an error answer reach the caller (an httpx transport stands in
    for the server; the client's own code runs whole)."""
    error = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}

    async def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json=error, headers={"x-request-id": "req_429", "retry-after-ms": "10"})

    client = LLMClient(Settings(llm_base_url="http://llm.test/v1", llm_hedge_ratio=0),
                       transport=httpx.MockTransport(server))
    try:
        called = await client.call(InferenceRequest("r-1", "{}"), {"model": "m", "messages": []})
    finally:
        await client.aclose()
    assert provider_request_id(called.headers) == "req_429"
    assert json.loads(kept_body(called.response_body)) == error
