"""The official ``openai`` client against the mock: clean answers parse, each fault raises what it would
raise against the real API. This is the contract the pipeline's own client is classified against."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import openai
import pytest

from streamproc.mockllm.content_key import request_fingerprint
from streamproc.mockllm.profiles import BUILTIN_PROFILES
from streamproc.mockllm.runner import MockLLMHandle, running_mock_llm

MESSAGES: list[Any] = [{"role": "user", "content": "Label this review: great value, fast delivery."}]


@pytest.fixture
async def client(mock: MockLLMHandle) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=mock.url, api_key="sk-test", max_retries=0, timeout=5.0) as c:
        yield c


async def create(client: openai.AsyncOpenAI, fault: str | None = None, **extra: Any) -> Any:
    return await client.chat.completions.create(
        model=extra.pop("model", "mock-small"),
        messages=extra.pop("messages", MESSAGES),
        extra_headers={"x-mock-fault": fault} if fault else None,
        **extra,
    )


async def test_clean_answer_parses(client: openai.AsyncOpenAI) -> None:
    completion = await create(client)
    assert completion.object == "chat.completion"
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content is not None
    assert choice.message.content.startswith(f"[{request_fingerprint({'messages': MESSAGES, 'model': 'mock-small'})}]")
    assert completion.usage is not None and completion.usage.total_tokens > 0


async def test_clean_stream_parses(client: openai.AsyncOpenAI) -> None:
    stream = await create(client, stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    assert text.startswith("[") and finish == "stop"
    assert usage is not None and usage.completion_tokens > 0


async def test_structured_output_parses(client: openai.AsyncOpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"label": {"type": "string", "enum": ["positive", "negative"]}, "stars": {"type": "integer"}},
        "required": ["label", "stars"],
        "additionalProperties": False,
    }
    completion = await create(
        client, response_format={"type": "json_schema", "json_schema": {"name": "review", "schema": schema}}
    )
    value = json.loads(completion.choices[0].message.content)
    assert value["label"] in ("positive", "negative") and isinstance(value["stars"], int)


@pytest.mark.parametrize(
    ("fault", "error", "status", "code"),
    [
        ("rate_limit", openai.RateLimitError, 429, "rate_limit_exceeded"),
        ("insufficient_quota", openai.RateLimitError, 429, "insufficient_quota"),
        ("server_error", openai.InternalServerError, 500, None),
        ("bad_gateway", openai.InternalServerError, 502, None),
        ("service_unavailable", openai.InternalServerError, 503, None),
        ("gateway_timeout", openai.InternalServerError, 504, None),
        ("overloaded", openai.InternalServerError, 529, None),
        ("invalid_request", openai.BadRequestError, 400, "invalid_value"),
        ("content_policy", openai.BadRequestError, 400, "content_policy_violation"),
    ],
)
async def test_status_faults_raise_the_matching_error(
    client: openai.AsyncOpenAI, fault: str, error: type[openai.APIStatusError], status: int, code: str | None
) -> None:
    with pytest.raises(error) as caught:
        await create(client, fault)
    assert caught.value.status_code == status
    assert caught.value.code == code


async def test_every_answer_carries_a_request_id_of_the_servers_own(client: openai.AsyncOpenAI) -> None:
    first, second = await create(client), await create(client)
    assert first._request_id is not None and first._request_id.startswith("req_")
    assert first._request_id != second._request_id
    with pytest.raises(openai.InternalServerError) as caught:
        await create(client, "server_error")
    assert caught.value.request_id is not None and caught.value.request_id.startswith("req_")


async def test_rate_limit_error_carries_the_retry_hint(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        await create(client, "rate_limit")
    assert caught.value.response.headers["retry-after-ms"] == "1000"
    assert "Please try again in 1s." in caught.value.message


@pytest.mark.parametrize("stream", [False, True])
async def test_hang_times_out(mock: MockLLMHandle, stream: bool) -> None:
    async with openai.AsyncOpenAI(base_url=mock.url, api_key="k", max_retries=0, timeout=0.3) as client:
        with pytest.raises(openai.APITimeoutError):
            await create(client, "hang", stream=stream)


@pytest.mark.parametrize(
    ("fault", "stream"), [("reset", False), ("reset", True), ("stream_break", False), ("stream_break", True)]
)
async def test_dropped_connections_are_connection_errors(client: openai.AsyncOpenAI, fault: str, stream: bool) -> None:
    """A stream may fail when it is opened or while it is read, depending on when the drop arrives."""
    with pytest.raises(openai.APIConnectionError):
        result = await create(client, fault, stream=stream)
        if stream:
            async for _ in result:
                pass


async def test_cut_or_foreign_bodies(client: openai.AsyncOpenAI) -> None:
    """What the openai client does with a 200 that is not the JSON it expects: a raw decoding error for a cut
    body, and the page as a plain string for HTML (a client must check the type of what it got)."""
    with pytest.raises(json.JSONDecodeError):
        await create(client, "truncated_body")
    page = await create(client, "non_json_body")
    assert isinstance(page, str) and page.startswith("<html>")


async def test_semantic_faults_are_200s_with_bad_content(client: openai.AsyncOpenAI) -> None:
    json_format = {"type": "json_object"}
    assert (await create(client, "empty_content")).choices[0].message.content == ""
    broken = (await create(client, "invalid_json", response_format=json_format)).choices[0].message.content
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)
    cut = await create(client, "length")
    assert cut.choices[0].finish_reason == "length"
    with pytest.raises(openai.LengthFinishReasonError):
        await client.chat.completions.parse(model="mock-small", messages=MESSAGES, max_tokens=2)


async def test_context_length_exceeded(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await create(client, messages=[{"role": "user", "content": "word " * 4000}])
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"


async def test_unknown_model(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await create(client, model="gpt-404")
    assert caught.value.code == "model_not_found"
    assert [m.id async for m in client.models.list()] == ["mock-small", "mock-large"]


async def test_wrong_key() -> None:
    async with running_mock_llm("clean", api_key="sk-right") as mock:
        async with openai.AsyncOpenAI(base_url=mock.url, api_key="sk-wrong-key", max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError) as caught:
                await create(client)
            assert caught.value.code == "invalid_api_key"
        async with openai.AsyncOpenAI(base_url=mock.url, api_key="sk-right", max_retries=0) as client:
            assert (await create(client)).choices[0].finish_reason == "stop"


async def test_the_clients_own_retry_gets_through_a_transient_fault() -> None:
    """A 429 on the first attempt only: the client waits the hinted 50 ms and the retry succeeds."""
    profile = replace(BUILTIN_PROFILES["clean"], retry_after_seconds=0.05)
    async with running_mock_llm(profile) as mock:
        async with openai.AsyncOpenAI(base_url=mock.url, api_key="k", max_retries=2) as client:
            completion = await create(client, "rate_limit*1")
        assert completion.choices[0].finish_reason == "stop"
        assert mock.stats()["requests"]["calls_histogram"] == {"2": 1}
        assert mock.stats()["by_outcome"] == {"ok": 1, "rate_limit": 1}
