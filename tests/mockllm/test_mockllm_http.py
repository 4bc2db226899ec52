"""The real server over HTTP: every fault in its documented shape, malformed input, SSE, stats, control."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import jsonschema
import pytest
from multidict import CIMultiDict

from streamproc.mockllm.content_key import request_fingerprint
from streamproc.mockllm.injected_faults import FaultKind
from streamproc.mockllm.profiles import Overrides
from streamproc.mockllm.runner import MockLLMHandle, running_mock_llm

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"label": {"enum": ["spam", "ham"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["label", "confidence"],
}


def chat(content: str = "Is this spam?", **extra: Any) -> dict[str, Any]:
    return {"model": "mock-small", "messages": [{"role": "user", "content": content}], **extra}


def json_schema_chat(content: str = "Classify: win a prize now") -> dict[str, Any]:
    return chat(content, response_format={"type": "json_schema", "json_schema": {"name": "label", "schema": SCHEMA}})


async def post(
    http: aiohttp.ClientSession,
    mock: MockLLMHandle,
    body: Any,
    fault: str | None = None,
    path: str = "chat/completions",
) -> tuple[int, CIMultiDict[str], bytes]:
    headers = {"x-mock-fault": fault} if fault else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(f"{mock.url}/{path}", data=data, headers=headers) as response:
        return response.status, CIMultiDict(response.headers), await response.read()


def error_body(raw: bytes) -> dict[str, Any]:
    body = json.loads(raw)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    return error


async def test_clean_answer_shape_and_fingerprint(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    body = chat()
    status, headers, raw = await post(http, mock, body)
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    answer = json.loads(raw)
    assert answer["object"] == "chat.completion"
    assert answer["id"].startswith("chatcmpl-")
    assert answer["model"] == "mock-small"
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["choices"][0]["message"]["content"].startswith(f"[{request_fingerprint(body)}]")
    usage = answer["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert answer["id"] == f"chatcmpl-mock{request_fingerprint(body)}x0"  # fingerprint, then attempt 0


async def test_json_schema_answer_validates(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    status, _, raw = await post(http, mock, json_schema_chat())
    assert status == 200
    jsonschema.validate(json.loads(json.loads(raw)["choices"][0]["message"]["content"]), SCHEMA)


# ---- each fault in its shape -----------------------------------------------------------------------

SERVICE = [
    ("server_error", 500),
    ("bad_gateway", 502),
    ("service_unavailable", 503),
    ("gateway_timeout", 504),
]


@pytest.mark.parametrize(("fault", "status"), SERVICE)
async def test_service_errors(mock: MockLLMHandle, http: aiohttp.ClientSession, fault: str, status: int) -> None:
    got, headers, raw = await post(http, mock, chat(), fault)
    assert got == status
    assert error_body(raw)["type"] == "server_error"
    assert headers["x-mock-attempt"] == "0"  # error answers name the attempt (answers do in their id)


async def test_overloaded_is_anthropic_shaped(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    status, _, raw = await post(http, mock, chat(), "overloaded")
    assert status == 529
    assert json.loads(raw) == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


async def test_injected_rate_limit(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    status, headers, raw = await post(http, mock, chat(), "rate_limit")
    assert status == 429
    error = error_body(raw)
    assert error["code"] == "rate_limit_exceeded"
    assert error["message"].endswith(
        "Please try again in 1s. Visit https://platform.openai.com/account/rate-limits to learn more."
    )
    assert headers["retry-after"] == "1"
    assert headers["retry-after-ms"] == "1000"


async def test_real_rate_limit_headers(http: aiohttp.ClientSession) -> None:
    async with running_mock_llm("clean", overrides=Overrides(rpm=60, tpm=100_000, burst_seconds=1.0)) as mock:
        status, headers, _ = await post(http, mock, chat("first"))
        assert status == 200
        assert headers["x-ratelimit-limit-requests"] == "60"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert headers["x-ratelimit-limit-tokens"] == "100000"
        assert int(headers["x-ratelimit-remaining-tokens"]) < 1667
        assert headers["x-ratelimit-reset-requests"].endswith("s")
        status, headers, raw = await post(http, mock, chat("second"))
        assert status == 429
        assert error_body(raw)["code"] == "rate_limit_exceeded"
        assert 900 < int(headers["retry-after-ms"]) <= 1000
        assert headers["retry-after"] == "1"
        assert "Please try again in" in error_body(raw)["message"]
        assert headers["x-ratelimit-remaining-requests"] == "0"


@pytest.mark.parametrize(
    ("fault", "status", "code", "type_"),
    [
        ("invalid_request", 400, "invalid_value", "invalid_request_error"),
        ("content_policy", 400, "content_policy_violation", "invalid_request_error"),
        ("insufficient_quota", 429, "insufficient_quota", "insufficient_quota"),
    ],
)
async def test_business_faults(
    mock: MockLLMHandle, http: aiohttp.ClientSession, fault: str, status: int, code: str, type_: str
) -> None:
    got, headers, raw = await post(http, mock, chat(), fault)
    assert got == status
    error = error_body(raw)
    assert (error["code"], error["type"]) == (code, type_)
    assert "retry-after" not in headers


async def test_context_length_exceeded(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    status, _, raw = await post(http, mock, chat("word " * 4000))
    assert status == 400
    error = error_body(raw)
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    status, _, _ = await post(http, mock, {**chat("word " * 4000), "model": "mock-large"})
    assert status == 200


async def test_semantic_faults(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    def content(raw: bytes) -> tuple[str, str]:
        choice = json.loads(raw)["choices"][0]
        return choice["message"]["content"], choice["finish_reason"]

    _, _, raw = await post(http, mock, json_schema_chat(), "empty_content")
    assert content(raw) == ("", "stop")
    _, _, raw = await post(http, mock, json_schema_chat(), "invalid_json")
    with pytest.raises(json.JSONDecodeError):
        json.loads(content(raw)[0])
    _, _, raw = await post(http, mock, json_schema_chat(), "schema_mismatch")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(content(raw)[0]), SCHEMA)
    _, _, raw = await post(http, mock, json_schema_chat(), "length")
    text, finish = content(raw)
    assert finish == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


async def test_truncated_body(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    status, headers, raw = await post(http, mock, chat(), "truncated_body")
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert raw.startswith(b'{"id":"chatcmpl-')
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)


async def test_non_json_body(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    status, headers, raw = await post(http, mock, chat(), "non_json_body")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert raw.startswith(b"<html>")


@pytest.mark.parametrize("fault", ["reset", "stream_break"])
async def test_connection_dropped_mid_body(mock: MockLLMHandle, http: aiohttp.ClientSession, fault: str) -> None:
    with pytest.raises(aiohttp.ClientError):
        await post(http, mock, chat(), fault)
    assert mock.stats()["by_outcome"] == {fault: 1}


async def test_hang_ends_when_the_client_gives_up(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(
            f"{mock.url}/chat/completions",
            json=chat(),
            headers={"x-mock-fault": "hang"},
            timeout=aiohttp.ClientTimeout(total=0.3),
        ):
            pass
    for _ in range(100):  # the handler is cancelled when the connection goes: no task stays behind
        if mock.stats()["hanging"] == 0:
            break
        await asyncio.sleep(0.01)
    assert mock.stats()["hanging"] == 0
    assert mock.stats()["by_status"] == {"none": 1}


# ---- SSE -------------------------------------------------------------------------------------------


async def read_sse(response: aiohttp.ClientResponse) -> list[str]:
    events = []
    async for line in response.content:
        if line.startswith(b"data: "):
            events.append(line[6:].decode().strip())
    return events


async def test_stream(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    body = chat(stream=True, stream_options={"include_usage": True})
    async with http.post(f"{mock.url}/chat/completions", json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = await read_sse(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.startswith(f"[{request_fingerprint(body)}]")
    assert chunks[-1]["usage"]["completion_tokens"] > 0


async def test_stream_break(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    events: list[str] = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(
            f"{mock.url}/chat/completions", json=chat(stream=True), headers={"x-mock-fault": "stream_break"}
        ) as response:
            assert response.status == 200
            async for line in response.content:
                if line.startswith(b"data: "):
                    events.append(line[6:].decode().strip())
    assert events and "[DONE]" not in events


async def test_stream_truncated_event(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    async with http.post(
        f"{mock.url}/chat/completions", json=chat(stream=True), headers={"x-mock-fault": "truncated_body"}
    ) as response:
        events = await read_sse(response)
    assert "[DONE]" not in events
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[-1])


async def test_completions_endpoint(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    status, _, raw = await post(http, mock, {"model": "mock-small", "prompt": "Once upon"}, path="completions")
    assert status == 200
    body = json.loads(raw)
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"]
    async with http.post(f"{mock.url}/completions", json={"model": "mock-small", "prompt": "x", "stream": True}) as r:
        events = await read_sse(r)
    assert events[-1] == "[DONE]" and json.loads(events[0])["object"] == "text_completion"


# ---- malformed requests and other routes -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", None),
        (b"not json at all", None),
        (b'{"model": "mock-small", "messages": [', None),
        (b"\x00\xff garbage", None),
        (b"[]", "invalid_type"),
        (b"null", "invalid_type"),
        (b'{"model": "mock-small"}', "missing_required_parameter"),
        (b'{"model": "mock-small", "messages": {"role": "user"}}', "invalid_type"),
        (b'{"model": ["mock-small"], "messages": [{"role": "user", "content": "x"}]}', "invalid_type"),
        (b'{"model": "mock-small", "messages": [{"role": "user", "content": "x"}], "max_tokens": -5}', "invalid_value"),
        (
            b'{"model": "mock-small", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
            "invalid_value",
        ),
        (b'{"model": "mock-small", "messages": [{"role": "user", "content": {"x": 1}}]}', "invalid_type"),
        (b'{"model": "mock-small", "messages": [{"role": {}, "content": "x"}]}', "invalid_value"),
        (b'{"model": "mock-small", "messages": [{"role": "user", "content": "x"}], "n": 1e309}', "invalid_type"),
    ],
)
async def test_malformed_requests_get_400(
    mock: MockLLMHandle, http: aiohttp.ClientSession, body: bytes, code: str | None
) -> None:
    status, _, raw = await post(http, mock, body)
    assert status == 400
    assert error_body(raw)["code"] == code
    assert mock.stats()["internal_errors"] == 0


async def test_unknown_model_route_and_method(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    status, _, raw = await post(http, mock, {**chat(), "model": "gpt-9"})
    assert (status, error_body(raw)["code"]) == (404, "model_not_found")
    async with http.get(f"{mock.url}/chat/completions") as response:
        assert response.status == 405
        error_body(await response.read())
    async with http.get(f"{mock.root}/v2/nothing") as response:
        assert response.status == 404
        error_body(await response.read())
    async with http.get(f"{mock.url}/models") as response:
        models = await response.json()
    assert [m["id"] for m in models["data"]] == ["mock-small", "mock-large"]
    async with http.get(f"{mock.url}/models/mock-large") as response:
        assert (await response.json())["context_window"] == 32768
    async with http.get(f"{mock.url}/models/nope") as response:
        assert response.status == 404
    async with http.get(f"{mock.root}/healthz") as response:
        assert (await response.json())["status"] == "ok"


async def test_api_key_required(http: aiohttp.ClientSession) -> None:
    async with running_mock_llm("clean", api_key="sk-mock") as mock:
        async with http.post(f"{mock.url}/chat/completions", json=chat()) as response:
            assert response.status == 401
        async with http.post(
            f"{mock.url}/chat/completions", json=chat(), headers={"Authorization": "Bearer sk-wrong-one"}
        ) as response:
            assert response.status == 401
            assert error_body(await response.read())["code"] == "invalid_api_key"
        async with http.post(
            f"{mock.url}/chat/completions", json=chat(), headers={"Authorization": "Bearer sk-mock"}
        ) as response:
            assert response.status == 200


# ---- stats and control -----------------------------------------------------------------------------


async def test_stats_count_per_request_and_per_id(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    for request_id, fault in [("a", "server_error*1"), ("a", "server_error*1"), ("b", "content_policy")]:
        async with http.post(
            f"{mock.url}/chat/completions",
            json=chat(f"request {request_id}"),
            headers={"x-request-id": request_id, "x-mock-fault": fault},
        ):
            pass
    async with http.get(f"{mock.root}/stats?detail=1") as response:
        stats = await response.json()
    assert stats["calls"] == 3
    assert stats["by_status"] == {"200": 1, "400": 1, "500": 1}
    assert stats["by_outcome"] == {"content_policy": 1, "ok": 1, "server_error": 1}
    assert stats["by_layer"] == {"business": 1, "service": 1}
    assert stats["requests"] == {
        "distinct": 2,
        "max_calls": 2,
        "calls_histogram": {"1": 1, "2": 1},
        "repeated_after_business_failure": 0,
    }
    assert stats["per_request_id"] == {
        "a": {"calls": 2, "outcomes": ["server_error", "ok"]},
        "b": {"calls": 1, "outcomes": ["content_policy"]},
    }
    assert stats["tokens"]["completion"] > 0
    assert (stats["in_flight"], stats["hanging"], stats["internal_errors"]) == (0, 0, 0)


async def test_the_client_request_id_header_names_the_request(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    """OpenAI's x-client-request-id (what the worker sends, percent-encoded) wins over x-request-id."""
    for headers in ({"x-client-request-id": "b%C3%A4tch-1:r%25"}, {"x-client-request-id": "c", "x-request-id": "x"}):
        async with http.post(f"{mock.url}/chat/completions", json=chat(), headers=headers) as response:
            assert response.status == 200
    async with http.get(f"{mock.root}/stats?detail=1") as response:
        stats = await response.json()
    assert set(stats["per_request_id"]) == {"b\u00e4tch-1:r%", "c"}


async def test_control_outage_and_reset(mock: MockLLMHandle, http: aiohttp.ClientSession) -> None:
    async def control(path: str, body: Any) -> tuple[int, Any]:
        async with http.post(f"{mock.root}/control/{path}", json=body) as response:
            return response.status, await response.json()

    assert (await control("outage", {"seconds": 0.3}))[1]["outage"]["active"] is True
    status, headers, raw = await post(http, mock, chat())
    assert status == 503 and headers["retry-after"] == "1"
    assert error_body(raw)["type"] == "server_error"
    await asyncio.sleep(0.35)
    assert (await post(http, mock, chat()))[0] == 200
    await control("outage", {"on": True})
    assert (await post(http, mock, chat()))[0] == 503
    await control("outage", {"on": False})
    assert (await post(http, mock, chat()))[0] == 200
    assert (await control("outage", {"seconds": -1}))[0] == 400
    assert (await control("outage", {}))[0] == 400
    assert (await control("outage", [1]))[0] == 400
    assert mock.stats()["calls"] == 4
    assert await control("reset", {}) == (200, {"reset": True})
    assert mock.stats()["calls"] == 0


async def test_same_seed_same_faults(http: aiohttp.ClientSession) -> None:
    """Two servers with the same seed fail the same requests the same way, attempt by attempt."""

    async def run(seed: int) -> list[str]:
        async with running_mock_llm("flaky", seed, overrides=Overrides(faults={FaultKind.HANG: 0.0})) as mock:
            outcomes = []
            for attempt in range(2):
                for i in range(60):
                    try:
                        status, _, _ = await post(http, mock, chat(f"item {i}"))
                        outcomes.append(f"{i}/{attempt}:{status}")
                    except aiohttp.ClientError:
                        outcomes.append(f"{i}/{attempt}:dropped")
            detail = mock.stats(detail=True)["per_request"]
            return outcomes + sorted(str(r["outcomes"]) for r in detail.values())

    first, again, other = await run(3), await run(3), await run(4)
    assert first == again
    assert first != other
    assert any(":200" not in o for o in first[:120])


async def test_body_over_the_size_limit_is_413(http: aiohttp.ClientSession) -> None:
    async with running_mock_llm("clean", max_body_bytes=2_000) as mock:
        status, _, raw = await post(http, mock, chat("x" * 5_000))
        assert status == 413
        assert error_body(raw)["code"] == "request_too_large"
        assert mock.stats()["by_outcome"] == {"body_too_large": 1}
        assert (await post(http, mock, chat("small")))[0] == 200
