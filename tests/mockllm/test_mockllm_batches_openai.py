"""OpenAI's Files and Batch API on the mock, driven by the official ``openai`` client: every answer parses
strictly with the SDK's own models, and the batch goes through each of its documented ends (completed,
failed validation, expired half-done, cancelled) with the line shapes OpenAI documents. A settable clock
moves the batches through their phases without sleeping."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import openai
import pytest
from openai.types import Batch, Completion, FileDeleted, FileObject
from openai.types.chat import ChatCompletion

from streamproc.core.outcome import Failure, Success
from streamproc.core.provider_batch_lines import AnsweredLine, openai_line
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.completion import check_completion
from streamproc.mockllm.batch_settings import BatchSettings
from streamproc.mockllm.profiles import load_profile
from streamproc.mockllm.runner import MockLLMHandle, running_mock_llm
from tests.mockllm.conftest import Clock
from tests.mockllm.sdk_strict import strict

SETTINGS = BatchSettings(validating_seconds=1, in_progress_seconds=10, finalizing_seconds=1, cancelling_seconds=1,
                         openai_max_requests=20, openai_max_bytes=20_000)


@pytest.fixture
async def mock(clock: Clock) -> AsyncIterator[MockLLMHandle]:
    async with running_mock_llm(replace(load_profile("clean"), batches=SETTINGS), clock=clock) as handle:
        yield handle


@pytest.fixture
async def client(mock: MockLLMHandle) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=mock.url, api_key="sk-test", max_retries=0, timeout=10.0) as c:
        yield c


def request_line(custom_id: str, text: str, model: str = "mock-small") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 500}}


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


async def upload(client: openai.AsyncOpenAI, content: bytes) -> FileObject:
    raw = await client.files.with_raw_response.create(file=("input.jsonl", content), purpose="batch")
    stored = strict(FileObject, raw.http_response.json())
    assert raw.parse() == stored
    assert stored.bytes == len(content) and stored.purpose == "batch" and stored.filename == "input.jsonl"
    return stored


async def create(client: openai.AsyncOpenAI, content: bytes, header: str | None = None) -> Batch:
    stored = await upload(client, content)
    raw = await client.batches.with_raw_response.create(
        input_file_id=stored.id, endpoint="/v1/chat/completions", completion_window="24h",
        metadata={"run": "test"}, extra_headers={"x-mock-batch": header} if header else None)
    return strict(Batch, raw.http_response.json())


async def retrieve(client: openai.AsyncOpenAI, batch_id: str) -> Batch:
    raw = await client.batches.with_raw_response.retrieve(batch_id)
    batch = strict(Batch, raw.http_response.json())
    assert raw.parse() == batch
    return batch


async def lines_of(client: openai.AsyncOpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    assert file_id is not None
    content = await client.files.content(file_id)
    lines = [json.loads(line) for line in content.text.splitlines()]
    for line in lines:
        assert set(line) == {"id", "custom_id", "response", "error"}
        assert line["id"].startswith("batch_req_")
    return {line["custom_id"]: line for line in lines}


MIXED = [
    request_line("ok-1", "Label this review: great value."),
    request_line("ok-2", "Label this review: slow delivery."),
    request_line("server-error", "Summarise [mock:server_error]"),
    request_line("policy", "Summarise [mock:content_policy]"),
    request_line("rate-limited", "Summarise [mock:rate_limit]"),
    request_line("hang", "Summarise [mock:hang]"),
    request_line("reset", "Summarise [mock:reset]"),
    request_line("ok-3", "Label this review: broken on arrival."),
]


async def test_a_batch_goes_validating_in_progress_finalizing_completed(
    client: openai.AsyncOpenAI, clock: Clock, mock: MockLLMHandle
) -> None:
    batch = await create(client, jsonl(MIXED))
    assert batch.status == "validating" and batch.model == "mock-small" and batch.metadata == {"run": "test"}
    assert batch.request_counts is not None and batch.request_counts.total == len(MIXED)
    assert mock.stats()["calls"] == 0

    clock.now += 6  # 1 s validating, then half of the 10 s in progress
    batch = await retrieve(client, batch.id)
    assert batch.status == "in_progress" and batch.in_progress_at == batch.created_at + 1
    assert batch.request_counts is not None and batch.request_counts.completed + batch.request_counts.failed == 4
    assert mock.stats()["calls"] == 4  # lines are answered as the batch runs, not all at once

    clock.now += 5
    batch = await retrieve(client, batch.id)
    assert batch.status == "finalizing" and batch.output_file_id is None
    clock.now += 1
    batch = await retrieve(client, batch.id)
    assert batch.status == "completed" and batch.completed_at == batch.created_at + 12
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (4, 4)
    assert batch.usage is not None and batch.usage.input_tokens > 0 and batch.usage.output_tokens > 0

    output = await lines_of(client, batch.output_file_id)
    assert set(output) == {"ok-1", "ok-2", "ok-3", "reset"}  # a line has no connection to reset: answered intact
    for line in output.values():
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["response"]["request_id"].startswith("req_")
        completion = strict(ChatCompletion, line["response"]["body"])
        assert completion.choices[0].message.content
    errors = await lines_of(client, batch.error_file_id)
    statuses = {custom_id: line["response"]["status_code"] for custom_id, line in errors.items()}
    assert statuses == {"server-error": 500, "policy": 400, "rate-limited": 429, "hang": 500}
    assert errors["policy"]["response"]["body"]["error"]["code"] == "content_policy_violation"
    assert errors["rate-limited"]["response"]["body"]["error"]["code"] == "rate_limit_exceeded"
    assert all(line["error"] is None for line in errors.values())
    stats = mock.stats()
    assert stats["calls"] == len(MIXED)  # each line answered once, however often the batch is read
    assert stats["batches"]["openai"] == {"created": 1, "lines_answered": len(MIXED), "by_phase": {"completed": 1}}
    assert stats["batches"]["files"] == 3  # the input, output and error files

    # the core reads every line as the synchronous call's outcome
    verdicts = {cid: openai_line(json.dumps(line)).verdict for cid, line in {**output, **errors}.items()}
    requests = {line["custom_id"]: line["body"] for line in MIXED}
    for custom_id in output:
        answered = verdicts[custom_id]
        assert isinstance(answered, AnsweredLine)
        assert isinstance(check_completion(answered.body, requests[custom_id]), Success)
    layers = {cid: (v.layer, v.code) for cid, v in verdicts.items() if isinstance(v, Failure)}
    assert layers == {"server-error": (FailureLayer.SERVICE, "server_error"),
                      "hang": (FailureLayer.SERVICE, "server_error"),
                      "rate-limited": (FailureLayer.SERVICE, "rate_limit_exceeded"),
                      "policy": (FailureLayer.BUSINESS, "content_policy_violation")}


async def test_an_expired_batch_keeps_what_was_answered_and_expires_the_rest(
    client: openai.AsyncOpenAI, clock: Clock
) -> None:
    lines = [request_line(f"r{i}", f"Request number {i}") for i in range(10)]
    batch = await create(client, jsonl(lines), header="expire=0.3")
    clock.now += 11
    batch = await retrieve(client, batch.id)
    assert batch.status == "expired" and batch.expired_at == batch.created_at + 11
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 7)
    assert set(await lines_of(client, batch.output_file_id)) == {"r0", "r1", "r2"}
    expired = await lines_of(client, batch.error_file_id)
    assert set(expired) == {f"r{i}" for i in range(3, 10)}
    for line in expired.values():
        assert line["response"] is None and line["error"]["code"] == "batch_expired"
        verdict = openai_line(json.dumps(line)).verdict
        assert isinstance(verdict, Failure) and (verdict.layer, verdict.code) == (FailureLayer.SERVICE, "batch_expired")


async def test_a_cancelled_batch_goes_cancelling_then_cancelled(client: openai.AsyncOpenAI, clock: Clock) -> None:
    lines = [request_line(f"r{i}", f"Request number {i}") for i in range(10)]
    batch = await create(client, jsonl(lines))
    clock.now += 3  # 2 s in progress: 2 of 10 answered
    raw = await client.batches.with_raw_response.cancel(batch.id)
    batch = strict(Batch, raw.http_response.json())
    assert batch.status == "cancelling" and batch.cancelling_at is not None
    clock.now += 1
    batch = await retrieve(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    assert set(await lines_of(client, batch.output_file_id)) == {"r0", "r1"}
    cancelled = await lines_of(client, batch.error_file_id)
    assert len(cancelled) == 8 and all(line["error"]["code"] == "batch_cancelled" for line in cancelled.values())
    with pytest.raises(openai.ConflictError):
        await client.batches.cancel(batch.id)  # an ended batch cannot be cancelled


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (jsonl([request_line("a", "x"), b"{not json"]), "invalid_json_line"),
        (jsonl([request_line("a", "x"), request_line("b", "y", model="mock-large")]), "mismatched_model"),
        (jsonl([request_line("a", "x"), request_line("a", "y")]), "duplicate_custom_id"),
        (jsonl([request_line(f"r{i}", "x") for i in range(21)]), "too_many_requests"),
        (jsonl([request_line(f"r{i}", "x" * 3000) for i in range(7)]), "file_too_large"),
        (jsonl([{**request_line("a", "x"), "url": "/v1/embeddings"}]), "invalid_url"),
        (b"\n", "empty_file"),
    ],
)
async def test_an_invalid_file_fails_validation_with_errors(
    client: openai.AsyncOpenAI, clock: Clock, mock: MockLLMHandle, content: bytes, code: str
) -> None:
    batch = await create(client, content)
    assert batch.status == "validating" and batch.errors is None
    clock.now += 1
    batch = await retrieve(client, batch.id)
    assert batch.status == "failed" and batch.failed_at == batch.created_at + 1
    assert batch.errors is not None and batch.errors.data
    assert batch.errors.data[0].code == code and batch.errors.data[0].message
    assert batch.output_file_id is None and batch.error_file_id is None
    assert mock.stats()["calls"] == 0  # nothing of a failed batch runs


async def test_a_validation_failure_can_be_forced(client: openai.AsyncOpenAI, clock: Clock) -> None:
    batch = await create(client, jsonl([request_line("a", "x")]), header="invalid")
    clock.now += 1
    batch = await retrieve(client, batch.id)
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    assert batch.errors.data[0].code == "invalid_request"


async def test_batches_list_pages_newest_first(client: openai.AsyncOpenAI) -> None:
    created = [(await create(client, jsonl([request_line("a", f"x{i}")]))).id for i in range(3)]
    raw = await client.batches.with_raw_response.list(limit=2)
    page = raw.http_response.json()
    assert set(page) == {"object", "data", "first_id", "last_id", "has_more"} and page["has_more"] is True
    for item in page["data"]:
        strict(Batch, item)
    listed = [b.id async for b in client.batches.list(limit=2)]  # the SDK follows `after` across pages
    assert listed == created[::-1]


async def test_files_retrieve_and_delete(client: openai.AsyncOpenAI) -> None:
    stored = await upload(client, jsonl([request_line("a", "x")]))
    again = strict(FileObject, (await client.files.with_raw_response.retrieve(stored.id)).http_response.json())
    assert again == stored
    deleted = strict(FileDeleted, (await client.files.with_raw_response.delete(stored.id)).http_response.json())
    assert deleted.deleted and deleted.id == stored.id
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(stored.id)
    with pytest.raises(openai.NotFoundError):
        await client.batches.create(input_file_id=stored.id, endpoint="/v1/chat/completions", completion_window="24h")


async def test_bad_requests_are_refused_with_openai_errors(client: openai.AsyncOpenAI) -> None:
    stored = await upload(client, jsonl([request_line("a", "x")]))
    with pytest.raises(openai.BadRequestError):
        await client.batches.create(input_file_id=stored.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        await client.batches.create(input_file_id=stored.id, endpoint="/v1/chat/completions",
                                    completion_window="24h", extra_headers={"x-mock-batch": "expire=2"})
    with pytest.raises(openai.NotFoundError):
        await client.batches.retrieve("batch_nope")
    for wrong in ({"input_file_id": [stored.id]}, {"endpoint": ["/v1/chat/completions"]}, {"completion_window": 24}):
        fields = {"input_file_id": stored.id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **wrong}
        with pytest.raises(openai.BadRequestError):
            await client.post("/batches", body=fields, cast_to=Batch)


async def test_the_key_is_checked(clock: Clock) -> None:
    async with running_mock_llm("clean", api_key="sk-right", clock=clock) as mock, openai.AsyncOpenAI(
        base_url=mock.url, api_key="sk-wrong", max_retries=0
    ) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.files.create(file=("input.jsonl", b"{}\n"), purpose="batch")
        with pytest.raises(openai.AuthenticationError):
            await client.batches.list()


async def test_an_upload_past_the_servers_body_limit_is_taken_whole() -> None:
    """A batch file may be 200 MB, over the 32 MiB the chat endpoints take: the upload is streamed."""
    content = jsonl([request_line(f"r{i}", "word " * 2000) for i in range(4000)])  # ~40 MB
    async with running_mock_llm("clean") as mock, openai.AsyncOpenAI(
        base_url=mock.url, api_key="x", max_retries=0, timeout=60.0
    ) as client:
        stored = await client.files.create(file=("big.jsonl", content), purpose="batch")
        assert stored.bytes == len(content) > 32 * 1024 * 1024
        assert (await client.files.content(stored.id)).content == content


async def test_a_completions_batch(client: openai.AsyncOpenAI, clock: Clock) -> None:
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/completions",
            "body": {"model": "mock-small", "prompt": "Say hi", "max_tokens": 500}}
    stored = await upload(client, jsonl([line]))
    batch = await client.batches.create(input_file_id=stored.id, endpoint="/v1/completions", completion_window="24h")
    clock.now += 12
    batch = await retrieve(client, batch.id)
    assert batch.status == "completed"
    [answer] = (await lines_of(client, batch.output_file_id)).values()
    completion = strict(Completion, answer["response"]["body"])
    assert completion.object == "text_completion" and completion.choices[0].text


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data", b"xx"),  # no boundary
        ("multipart/form-data; boundary=zz", b"garbage"),
        ("multipart/form-data; boundary=zz",
         b'--zz\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\nab'),  # cut
        ("application/json", b"{}"),
    ],
)
async def test_a_body_that_is_no_upload_is_a_400_never_a_500(
    mock: MockLLMHandle, http: aiohttp.ClientSession, content_type: str, body: bytes
) -> None:
    async with http.post(f"{mock.url}/files", data=body, headers={"Content-Type": content_type}) as response:
        assert response.status == 400
        assert (await response.json())["error"]["param"] == "file"
    assert mock.stats()["internal_errors"] == 0
