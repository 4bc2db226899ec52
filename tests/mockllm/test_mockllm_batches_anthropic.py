"""Anthropic's Message Batches API on the mock, driven by the official ``anthropic`` client: every answer
parses strictly with the SDK's own models, results stream as JSONL of succeeded / errored / canceled /
expired, and the envelope's limits are refused as Anthropic refuses them. A settable clock moves the
batches through their phases without sleeping."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import anthropic
import pytest
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

from streamproc.core.outcome import Failure, Success
from streamproc.core.provider_batch_lines import AnsweredLine, anthropic_line
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.completion import check_completion
from streamproc.mockllm.batch_settings import BatchSettings
from streamproc.mockllm.content_key import request_fingerprint
from streamproc.mockllm.profiles import load_profile
from streamproc.mockllm.runner import MockLLMHandle, running_mock_llm
from tests.mockllm.conftest import Clock
from tests.mockllm.sdk_strict import strict

SETTINGS = BatchSettings(validating_seconds=1, in_progress_seconds=10, cancelling_seconds=1,
                         anthropic_max_requests=20, anthropic_max_bytes=50_000)


@pytest.fixture
async def mock(clock: Clock) -> AsyncIterator[MockLLMHandle]:
    async with running_mock_llm(replace(load_profile("clean"), batches=SETTINGS), api_key="sk-ant",
                                clock=clock) as handle:
        yield handle


@pytest.fixture
async def client(mock: MockLLMHandle) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=mock.root, api_key="sk-ant", max_retries=0, timeout=10.0) as c:
        yield c


def request(custom_id: str, text: str, **params: Any) -> dict[str, Any]:
    return {"custom_id": custom_id,
            "params": {"model": "mock-small", "max_tokens": 50, "messages": [{"role": "user", "content": text}],
                       **params}}


async def create(client: anthropic.AsyncAnthropic, requests: list[Any], header: str | None = None) -> MessageBatch:
    raw = await client.messages.batches.with_raw_response.create(
        requests=requests, extra_headers={"x-mock-batch": header} if header else None)
    batch = strict(MessageBatch, raw.http_response.json())
    assert await raw.parse() == batch
    return batch


async def retrieve(client: anthropic.AsyncAnthropic, batch_id: str) -> MessageBatch:
    raw = await client.messages.batches.with_raw_response.retrieve(batch_id)
    batch = strict(MessageBatch, raw.http_response.json())
    assert await raw.parse() == batch
    return batch


async def results(client: anthropic.AsyncAnthropic, mock: MockLLMHandle, batch_id: str
                  ) -> dict[str, MessageBatchIndividualResponse]:
    """The results as the SDK streams them, each line also parsed strictly from the raw bytes."""
    streamed = [r async for r in await client.messages.batches.results(batch_id)]
    raw = await client.messages.batches.with_raw_response.retrieve(batch_id)  # the results_url, then its bytes
    url = (await raw.parse()).results_url
    assert url is not None and url.startswith(mock.root)
    async with client._client.stream("GET", url, headers={"x-api-key": "sk-ant"}) as response:
        body = await response.aread()
    strict_lines = [strict(MessageBatchIndividualResponse, json.loads(line)) for line in body.splitlines()]
    assert strict_lines == streamed
    return {r.custom_id: r for r in streamed}


MIXED = [
    request("ok-1", "Label this review: great value."),
    request("ok-2", "Label this review: slow delivery.", system="You label reviews."),
    request("server-error", "Summarise [mock:server_error]"),
    request("policy", "Summarise [mock:content_policy]"),
    request("overloaded", "Summarise [mock:overloaded]"),
    request("too-long", "Summarise", max_tokens=100_000),
    {"custom_id": "no-messages", "params": {"model": "mock-small", "max_tokens": 50}},  # refused line by line
    {"custom_id": "blocks", "params": {"model": "mock-small", "max_tokens": 50,
                                       "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}},
]


async def test_a_batch_runs_in_progress_then_ended_with_every_result_type(
    client: anthropic.AsyncAnthropic, clock: Clock, mock: MockLLMHandle
) -> None:
    batch = await create(client, MIXED)
    assert batch.processing_status == "in_progress" and batch.results_url is None
    assert batch.request_counts.processing == len(MIXED)
    with pytest.raises(anthropic.AnthropicError):
        await client.messages.batches.results(batch.id)  # no results_url before it ends

    clock.now += 11
    batch = await retrieve(client, batch.id)
    assert batch.processing_status == "ended" and batch.ended_at is not None
    counts = batch.request_counts
    assert (counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired) == (0, 3, 5, 0, 0)

    by_id = await results(client, mock, batch.id)
    assert set(by_id) == {r["custom_id"] for r in MIXED}
    for custom_id in ("ok-1", "ok-2", "blocks"):
        result = by_id[custom_id].result
        assert result.type == "succeeded"
        assert result.message.stop_reason == "end_turn" and result.message.usage.output_tokens > 0
        text = result.message.content[0]
        assert text.type == "text" and text.text.startswith("[")
    fingerprint = request_fingerprint({"model": "mock-small", "max_tokens": 50,
                                       "messages": [{"role": "user", "content": "Label this review: great value."}]})
    ok = by_id["ok-1"].result
    assert ok.type == "succeeded" and ok.message.content[0].type == "text"
    assert ok.message.content[0].text.startswith(f"[{fingerprint}]")  # the same answer as the synchronous call
    types = {}
    for custom_id in ("server-error", "policy", "overloaded", "too-long", "no-messages"):
        result = by_id[custom_id].result
        assert result.type == "errored"
        types[custom_id] = result.error.error.type
    assert types == {"server-error": "api_error", "policy": "invalid_request_error",
                     "overloaded": "overloaded_error", "too-long": "invalid_request_error",
                     "no-messages": "invalid_request_error"}
    assert mock.stats()["calls"] == len(MIXED)

    # the core reads every result as the synchronous call's outcome
    verdicts = {cid: anthropic_line(r.model_dump_json()).verdict for cid, r in by_id.items()}
    for custom_id in ("ok-1", "ok-2", "blocks"):
        answered = verdicts[custom_id]
        assert isinstance(answered, AnsweredLine)
        assert isinstance(check_completion(answered.body, {"messages": []}), Success)
    layers = {cid: (v.layer, v.code) for cid, v in verdicts.items() if isinstance(v, Failure)}
    assert layers == {"server-error": (FailureLayer.SERVICE, "server_error"),
                      "overloaded": (FailureLayer.SERVICE, "overloaded"),
                      "policy": (FailureLayer.BUSINESS, "content_policy_violation"),  # by its text
                      "too-long": (FailureLayer.BUSINESS, "context_length_exceeded"),
                      "no-messages": (FailureLayer.BUSINESS, "invalid_request_error")}


async def test_an_expired_batch_has_expired_results(client: anthropic.AsyncAnthropic, clock: Clock,
                                                    mock: MockLLMHandle) -> None:
    batch = await create(client, [request(f"r{i}", f"Request {i}") for i in range(10)], header="expire=0.5")
    clock.now += 11
    batch = await retrieve(client, batch.id)
    assert batch.processing_status == "ended"
    assert (batch.request_counts.succeeded, batch.request_counts.expired) == (5, 5)
    by_id = await results(client, mock, batch.id)
    assert [by_id[f"r{i}"].result.type for i in range(10)] == ["succeeded"] * 5 + ["expired"] * 5


async def test_a_cancelled_batch_goes_canceling_then_ended(client: anthropic.AsyncAnthropic, clock: Clock,
                                                           mock: MockLLMHandle) -> None:
    batch = await create(client, [request(f"r{i}", f"Request {i}") for i in range(10)])
    clock.now += 4  # 3 s of 10 in progress: 3 answered
    raw = await client.messages.batches.with_raw_response.cancel(batch.id)
    batch = strict(MessageBatch, raw.http_response.json())
    assert batch.processing_status == "canceling" and batch.cancel_initiated_at is not None
    assert mock.stats()["batches"]["anthropic"]["by_phase"] == {"cancelling": 1}
    clock.now += 1
    batch = await retrieve(client, batch.id)
    assert batch.processing_status == "ended"
    assert (batch.request_counts.succeeded, batch.request_counts.canceled) == (3, 7)
    assert mock.stats()["batches"]["anthropic"] == {"created": 1, "lines_answered": 3, "by_phase": {"cancelled": 1}}
    by_id = await results(client, mock, batch.id)
    assert sum(r.result.type == "canceled" for r in by_id.values()) == 7
    with pytest.raises(anthropic.BadRequestError):
        await client.messages.batches.cancel(batch.id)


async def test_batches_list_pages_newest_first(client: anthropic.AsyncAnthropic) -> None:
    created = [(await create(client, [request("a", f"x{i}")])).id for i in range(3)]
    raw = await client.messages.batches.with_raw_response.list(limit=2)
    page = raw.http_response.json()
    assert set(page) == {"data", "has_more", "first_id", "last_id"} and page["has_more"] is True
    for item in page["data"]:
        strict(MessageBatch, item)
    assert [b.id async for b in client.messages.batches.list(limit=2)] == created[::-1]


@pytest.mark.parametrize(
    "requests",
    [
        [],
        [request(f"r{i}", "x") for i in range(21)],  # over the request limit
        [request("a", "x"), request("a", "y")],  # duplicate custom_id
        [request("not ok!", "x")],  # custom_id pattern
        [request(f"r{i}", "x" * 10_000) for i in range(6)],  # over the byte limit
    ],
)
async def test_an_invalid_batch_is_refused(client: anthropic.AsyncAnthropic, mock: MockLLMHandle,
                                           requests: list[Any]) -> None:
    with pytest.raises(anthropic.APIStatusError) as caught:
        await client.messages.batches.create(requests=requests)
    assert caught.value.status_code in (400, 413)
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["message"]
    assert mock.stats()["calls"] == 0


async def test_a_validation_failure_can_be_forced_and_the_key_is_checked(client: anthropic.AsyncAnthropic,
                                                                         mock: MockLLMHandle) -> None:
    with pytest.raises(anthropic.BadRequestError):
        await create(client, [request("a", "x")], header="invalid")
    async with anthropic.AsyncAnthropic(base_url=mock.root, api_key="sk-wrong", max_retries=0) as wrong:
        with pytest.raises(anthropic.AuthenticationError):
            await wrong.messages.batches.list()
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.batches.retrieve("msgbatch_nope")


async def test_a_create_body_of_many_megabytes_is_read_whole() -> None:
    """Past the server's 32 MiB client limit and across many reads: the body arrives in pieces."""
    requests: list[Any] = [request(f"r{i}", f"{i} " + "word " * 2000) for i in range(4000)]  # ~40 MB
    async with running_mock_llm("clean") as mock, anthropic.AsyncAnthropic(
        base_url=mock.root, api_key="x", max_retries=0, timeout=60.0
    ) as client:
        batch = await client.messages.batches.create(requests=requests)
        assert batch.request_counts.processing == len(requests)
