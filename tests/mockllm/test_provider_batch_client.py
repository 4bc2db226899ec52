"""The provider-batch client (streamproc.llm.provider_batches) and poller (streamproc.llm.provider_batch_poller)
against the real mock server over HTTP: OpenAI's upload, create, retrieve, list, cancel and file
downloads, Anthropic's create, retrieve, list, cancel and results stream, each answer read into the core's values
and each member of an ended batch into exactly one synchronous call's outcome, and the batch a crashed worker
created found again. A settable clock moves the batches
through their phases without sleeping."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from pydantic import SecretStr

from streamproc.core.outcome import ConfigurationProblem, Failure
from streamproc.core.provider_batch_gatherer import ANTHROPIC_LIMITS, OPENAI_LIMITS, BatchGatherer, PendingLine
from streamproc.core.provider_batch_lines import AnsweredLine, anthropic_line, openai_line
from streamproc.core.provider_batch_objects import BatchPhase
from streamproc.core.provider_batch_polling import BATCH_FAILED, LINE_MISSING, PollPolicy
from streamproc.core.provider_batch_requests import anthropic_body, anthropic_request
from streamproc.core.provider_batch_requests import openai_line as openai_request_line
from streamproc.core.provider_batch_takeover import (
    GATHER_METADATA_KEY,
    ProviderBatchRecord,
    RecordState,
    member_custom_id,
    next_step,
)
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.api_key import InsecureEndpointError
from streamproc.llm.provider_batch_poller import member_outcomes, wait_until_ended
from streamproc.llm.provider_batches import AnthropicBatches, BatchCallFailed, OpenAIBatches, find_created
from streamproc.mockllm.batch_settings import BatchSettings
from streamproc.mockllm.profiles import load_profile
from streamproc.mockllm.runner import MockLLMHandle, running_mock_llm
from streamproc.settings import LLMEndpoint
from tests.mockllm.conftest import Clock

KEY = "sk-batch-test-key"
SETTINGS = BatchSettings(validating_seconds=1, in_progress_seconds=10, finalizing_seconds=1, cancelling_seconds=1)


def endpoint(base_url: str, key: str | None = KEY) -> LLMEndpoint:
    return LLMEndpoint(base_url=base_url, api_key=SecretStr(key) if key else None, api_key_file=None,
                       allow_insecure=False, http="httpcore", connect_timeout_s=5, read_timeout_s=10,
                       max_response_bytes=1 << 20)


@pytest.fixture
async def mock(clock: Clock) -> AsyncIterator[MockLLMHandle]:
    async with running_mock_llm(replace(load_profile("clean"), batches=SETTINGS), api_key=KEY,
                                clock=clock) as handle:
        yield handle


@pytest.fixture
async def openai_batches(mock: MockLLMHandle) -> AsyncIterator[OpenAIBatches]:
    client = OpenAIBatches(endpoint(mock.url))
    yield client
    await client.aclose()


@pytest.fixture
async def anthropic_batches(mock: MockLLMHandle) -> AsyncIterator[AnthropicBatches]:
    client = AnthropicBatches(endpoint(mock.url))
    yield client
    await client.aclose()


def openai_input(texts: dict[str, str]) -> bytes:
    return b"".join(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "mock-small", "max_tokens": 50,
                                         "messages": [{"role": "user", "content": text}]}}).encode() + b"\n"
                    for cid, text in texts.items())


def anthropic_input(texts: dict[str, str]) -> bytes:
    return json.dumps({"requests": [{"custom_id": cid, "params": {
        "model": "mock-small", "max_tokens": 50, "messages": [{"role": "user", "content": text}]}}
        for cid, text in texts.items()]}).encode()


TEXTS = {"ok-1": "Label this review: great value.", "ok-2": "Label this review: slow delivery.",
         "limited": "Summarise [mock:rate_limit]", "policy": "Summarise [mock:content_policy]"}


async def collect(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]


async def test_openai_batch_from_upload_to_outcomes(openai_batches: OpenAIBatches, clock: Clock) -> None:
    file_id = await openai_batches.upload(openai_input(TEXTS))
    created = await openai_batches.create(file_id, "/v1/chat/completions", metadata={"streamproc_gather": "g-1"})
    assert (created.provider, created.phase, created.total) == ("openai", BatchPhase.VALIDATING, 4)
    assert created.metadata == {"streamproc_gather": "g-1"}

    clock.now += 6
    running = await openai_batches.retrieve(created.batch_id)
    assert running.phase is BatchPhase.IN_PROGRESS and 0 < running.finished < 4
    clock.now += 6
    done = await openai_batches.retrieve(created.batch_id)
    assert done.phase is BatchPhase.COMPLETED and done.phase.ended and done.finished == 4
    assert done.output_file_id and done.error_file_id

    outcomes = {}
    for file_id in (done.output_file_id, done.error_file_id):
        for line in await collect(openai_batches.file_lines(file_id)):
            outcome = openai_line(line)
            outcomes[outcome.custom_id] = outcome.verdict
    assert set(outcomes) == set(TEXTS)
    assert isinstance(outcomes["ok-1"], AnsweredLine) and isinstance(outcomes["ok-2"], AnsweredLine)
    limited, policy = outcomes["limited"], outcomes["policy"]
    assert isinstance(limited, Failure) and limited.layer is FailureLayer.SERVICE
    assert isinstance(policy, Failure) and policy.layer is FailureLayer.BUSINESS


async def test_batches_are_listed_newest_first_in_pages(openai_batches: OpenAIBatches) -> None:
    file_id = await openai_batches.upload(openai_input(TEXTS))
    created = [await openai_batches.create(file_id, "/v1/chat/completions") for _ in range(3)]
    page = await openai_batches.page(limit=2)
    assert [b.batch_id for b in page.batches] == [created[2].batch_id, created[1].batch_id]
    assert page.has_more and page.last_id == created[1].batch_id
    rest = await openai_batches.page(page.last_id, limit=2)
    assert [b.batch_id for b in rest.batches] == [created[0].batch_id] and not rest.has_more


async def test_openai_expired_and_cancelled_batches(openai_batches: OpenAIBatches, clock: Clock) -> None:
    file_id = await openai_batches.upload(openai_input({f"r{i}": f"Request {i}" for i in range(10)}))
    expiring = await openai_batches.create(file_id, "/v1/chat/completions", headers={"x-mock-batch": "expire=0.3"})
    cancelled = await openai_batches.create(file_id, "/v1/chat/completions")
    clock.now += 3
    cancelling = await openai_batches.cancel(cancelled.batch_id)
    assert cancelling.phase is BatchPhase.CANCELLING
    clock.now += 9
    expired = await openai_batches.retrieve(expiring.batch_id)
    assert expired.phase is BatchPhase.EXPIRED and expired.finished == 10
    assert expired.error_file_id is not None
    verdicts = [openai_line(line).verdict for line in await collect(openai_batches.file_lines(expired.error_file_id))]
    assert len(verdicts) == 7 and all(isinstance(v, Failure) and v.code == "batch_expired" for v in verdicts)
    ended = await openai_batches.retrieve(cancelled.batch_id)
    assert ended.phase is BatchPhase.CANCELLED
    with pytest.raises(BatchCallFailed) as refused:
        await openai_batches.cancel(cancelled.batch_id)  # an ended batch: the mock answers 409
    assert isinstance(refused.value.outcome, Failure) and refused.value.outcome.http_status == 409


async def test_openai_validation_failure_is_a_failed_batch_with_its_errors(
        openai_batches: OpenAIBatches, clock: Clock) -> None:
    file_id = await openai_batches.upload(openai_input(TEXTS))
    batch = await openai_batches.create(file_id, "/v1/chat/completions", headers={"x-mock-batch": "invalid"})
    clock.now += 2
    failed = await openai_batches.retrieve(batch.batch_id)
    assert failed.phase is BatchPhase.FAILED and failed.errors and "invalid" in failed.errors[0]


async def test_anthropic_batch_from_create_to_outcomes(anthropic_batches: AnthropicBatches, clock: Clock) -> None:
    created = await anthropic_batches.create(anthropic_input(TEXTS))
    assert (created.provider, created.phase, created.total, created.finished) == (
        "anthropic", BatchPhase.IN_PROGRESS, 4, 0)
    with pytest.raises(BatchCallFailed):  # no results before the batch ends
        await collect(anthropic_batches.result_lines(created.batch_id))
    clock.now += 12
    done = await anthropic_batches.retrieve(created.batch_id)
    assert done.phase is BatchPhase.COMPLETED and done.finished == 4 and done.results_url
    verdicts = {o.custom_id: o.verdict for o in map(anthropic_line,
                                                    await collect(anthropic_batches.result_lines(done.batch_id)))}
    assert isinstance(verdicts["ok-1"], AnsweredLine)
    limited, policy = verdicts["limited"], verdicts["policy"]
    assert isinstance(limited, Failure) and limited.layer is FailureLayer.SERVICE
    assert isinstance(policy, Failure) and policy.layer is FailureLayer.BUSINESS
    page = await anthropic_batches.page()
    assert [b.batch_id for b in page.batches] == [created.batch_id]


async def test_anthropic_expired_and_cancelled_batches(anthropic_batches: AnthropicBatches, clock: Clock) -> None:
    requests = anthropic_input({f"r{i}": f"Request {i}" for i in range(10)})
    expiring = await anthropic_batches.create(requests, headers={"x-mock-batch": "expire=0.5"})
    cancelled = await anthropic_batches.create(requests)
    clock.now += 3
    assert (await anthropic_batches.cancel(cancelled.batch_id)).phase is BatchPhase.CANCELLING
    clock.now += 10
    expired = await anthropic_batches.retrieve(expiring.batch_id)
    assert expired.phase is BatchPhase.EXPIRED and expired.finished == 10
    ended = await anthropic_batches.retrieve(cancelled.batch_id)
    assert ended.phase is BatchPhase.CANCELLED
    codes = {o.verdict.code for o in map(anthropic_line, await collect(anthropic_batches.result_lines(
        cancelled.batch_id))) if isinstance(o.verdict, Failure)}
    assert codes == {"batch_cancelled"}
    with pytest.raises(BatchCallFailed):
        await anthropic_batches.create(requests, headers={"x-mock-batch": "invalid"})  # a 400 at create


async def test_a_wrong_key_is_a_configuration_problem_and_is_redacted(mock: MockLLMHandle) -> None:
    wrong = "sk-wrong-key-0123456789"
    for client in (OpenAIBatches(endpoint(mock.url, wrong)), AnthropicBatches(endpoint(mock.url, wrong))):
        try:
            with pytest.raises(BatchCallFailed) as refused:
                await client.retrieve("batch_x")
            assert isinstance(refused.value.outcome, ConfigurationProblem)
            assert wrong not in str(refused.value)
        finally:
            await client.aclose()


async def test_a_refused_connection_is_transport(mock: MockLLMHandle) -> None:
    client = OpenAIBatches(endpoint("http://127.0.0.1:9/v1"))
    try:
        with pytest.raises(BatchCallFailed) as refused:
            await client.retrieve("batch_x")
        assert isinstance(refused.value.outcome, Failure) and refused.value.outcome.layer is FailureLayer.TRANSPORT
    finally:
        await client.aclose()


@pytest.mark.parametrize("batch_id", ["../files", "a/b", "x?y=1", "", "batch x"])
async def test_an_id_that_is_not_a_plain_token_is_never_sent(openai_batches: OpenAIBatches, mock: MockLLMHandle,
                                                              batch_id: str) -> None:
    with pytest.raises(ValueError, match="not a provider id"):
        await openai_batches.retrieve(batch_id)


def test_a_key_over_plain_http_to_a_remote_host_is_refused() -> None:
    with pytest.raises(InsecureEndpointError, match="clear text"):
        OpenAIBatches(endpoint("http://llm.example.com/v1"))


class ClockSleep:
    """The poller's sleep: moves the mock's clock instead of waiting, and keeps the delays it was asked for."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.clock.now += seconds


POLICY = PollPolicy(first_s=1, max_s=8)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_the_poller_waits_out_a_batch_and_gives_every_member_one_outcome(
        openai_batches: OpenAIBatches, anthropic_batches: AnthropicBatches, clock: Clock, provider: str) -> None:
    texts = {f"r{i}": f"Request {i}" for i in range(10)}
    api: OpenAIBatches | AnthropicBatches
    if provider == "openai":
        api = openai_batches
        file_id = await openai_batches.upload(openai_input(texts))
        created = await openai_batches.create(file_id, "/v1/chat/completions", headers={"x-mock-batch": "expire=0.5"})
    else:
        api = anthropic_batches
        created = await anthropic_batches.create(anthropic_input(texts), headers={"x-mock-batch": "expire=0.5"})
    sleep = ClockSleep(clock)
    ended = await wait_until_ended(api, created.batch_id, POLICY, sleep)
    assert ended.phase is BatchPhase.EXPIRED
    assert sleep.delays[0] == 1 and max(sleep.delays) <= 8

    unusable: list[str] = []
    members = [*texts, "never-sent"]  # a member the provider has no line for
    outcomes = [o async for o in member_outcomes(api, ended, members, unusable.append)]
    assert sorted(o.custom_id for o in outcomes) == sorted(members) and unusable == []
    verdicts = {o.custom_id: o.verdict for o in outcomes}
    assert sum(isinstance(v, AnsweredLine) for v in verdicts.values()) == 5
    expired = [v for v in verdicts.values() if isinstance(v, Failure) and v.code == "batch_expired"]
    assert len(expired) == 5 and all(v.layer is FailureLayer.SERVICE for v in expired)
    missing = verdicts["never-sent"]
    assert isinstance(missing, Failure) and missing.code == LINE_MISSING


async def test_lines_of_no_open_member_are_reported_not_turned_into_outcomes(
        openai_batches: OpenAIBatches, clock: Clock) -> None:
    file_id = await openai_batches.upload(openai_input(TEXTS))
    created = await openai_batches.create(file_id, "/v1/chat/completions")
    ended = await wait_until_ended(openai_batches, created.batch_id, POLICY, ClockSleep(clock))
    unusable: list[str] = []
    outcomes = [o async for o in member_outcomes(openai_batches, ended, ["ok-1", "ok-2"], unusable.append)]
    assert [o.custom_id for o in outcomes] == ["ok-1", "ok-2"]
    assert len(unusable) == 2 and all("not an open member" in u for u in unusable)


async def test_a_batch_that_failed_validation_fails_each_member_with_its_errors(
        openai_batches: OpenAIBatches, clock: Clock) -> None:
    file_id = await openai_batches.upload(openai_input(TEXTS))
    created = await openai_batches.create(file_id, "/v1/chat/completions", headers={"x-mock-batch": "invalid"})
    ended = await wait_until_ended(openai_batches, created.batch_id, POLICY, ClockSleep(clock))
    outcomes = [o async for o in member_outcomes(openai_batches, ended, list(TEXTS), lambda _: None)]
    assert [o.custom_id for o in outcomes] == list(TEXTS)
    assert all(isinstance(o.verdict, Failure) and o.verdict.code == BATCH_FAILED for o in outcomes)


async def test_the_poller_stops_on_a_refused_key_and_waits_out_a_failing_poll(
        mock: MockLLMHandle, openai_batches: OpenAIBatches, clock: Clock) -> None:
    refused = OpenAIBatches(endpoint(mock.url, "sk-wrong-key-0123456789"))
    try:
        with pytest.raises(BatchCallFailed):
            await wait_until_ended(refused, "batch_x", POLICY, ClockSleep(clock))
    finally:
        await refused.aclose()
    never_sleeps = ClockSleep(clock)
    with pytest.raises(BatchCallFailed, match="404"):  # an unknown batch: no later poll finds it either
        await wait_until_ended(openai_batches, "batch_unknown", POLICY, never_sleeps)
    assert never_sleeps.delays == []
    down = OpenAIBatches(endpoint("http://127.0.0.1:9/v1"))
    sleep = ClockSleep(clock)

    async def give_up_after_four(seconds: float) -> None:
        await sleep(seconds)
        if len(sleep.delays) == 4:
            raise TimeoutError
    try:
        with pytest.raises(TimeoutError):
            await wait_until_ended(down, "batch_x", POLICY, give_up_after_four)
    finally:
        await down.aclose()
    assert sleep.delays == [2, 4, 8, 8]  # transport failures back off, and are not the end


def chat(text: str) -> dict[str, object]:
    return {"model": "mock-small", "max_tokens": 50, "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_gathered_batch_goes_from_requests_to_each_request_s_outcome(
        openai_batches: OpenAIBatches, anthropic_batches: AnthropicBatches, clock: Clock, provider: str) -> None:
    """The parts in the order the route will use them: gather, record as creating, create, record as open, wait,
    and each request id's outcome through its position's custom id."""
    requests = {"req/ä 1": "Label this review: great value.", "req:2": "Summarise [mock:rate_limit]",
                "req-3": "Label this review: slow delivery."}
    gatherer = BatchGatherer(OPENAI_LIMITS if provider == "openai" else ANTHROPIC_LIMITS)
    build = openai_request_line if provider == "openai" else anthropic_request
    for index, text in enumerate(requests.values()):
        assert gatherer.add(PendingLine(member_custom_id(index), "mock-small", build(member_custom_id(index),
                                                                                     chat(text))), 0) == []
    (sealed,) = gatherer.flush()
    record = ProviderBatchRecord("g-1", "openai" if provider == "openai" else "anthropic", sealed.model, 0,
                                 tuple(requests), RecordState.CREATING, 0, 0)
    api: OpenAIBatches | AnthropicBatches
    if provider == "openai":
        api = openai_batches
        body = b"".join(line.line + b"\n" for line in sealed.lines)
        assert len(body) == sealed.size_bytes
        view = await openai_batches.create(await openai_batches.upload(body), "/v1/chat/completions",
                                           metadata={GATHER_METADATA_KEY: record.gather_id})
    else:
        api = anthropic_batches
        view = await anthropic_batches.create(anthropic_body([line.line for line in sealed.lines]))
    record = record.opened(view, 1)
    ended = await wait_until_ended(api, record.provider_batch_id or "", POLICY, ClockSleep(clock))
    by_request = {record.member(o.custom_id): o.verdict
                  async for o in member_outcomes(api, ended, record.custom_ids(), lambda _: None)}
    assert set(by_request) == set(requests)
    assert isinstance(by_request["req/ä 1"], AnsweredLine) and isinstance(by_request["req-3"], AnsweredLine)
    limited = by_request["req:2"]
    assert isinstance(limited, Failure) and limited.layer is FailureLayer.SERVICE


def now_ms() -> int:
    return int(time.time() * 1000)


async def test_a_takeover_adopts_the_batch_a_crashed_worker_created_instead_of_creating_it_again(
        openai_batches: OpenAIBatches, mock: MockLLMHandle) -> None:
    creating = ProviderBatchRecord("g-crash", "openai", "mock-small", 0, ("r1", "r2"), RecordState.CREATING,
                                   now_ms(), now_ms())
    body = b"".join(openai_request_line(cid, chat("Hello")) + b"\n" for cid in creating.custom_ids())
    # the worker created the batch, then was killed before it wrote the open record
    created = await openai_batches.create(await openai_batches.upload(body), "/v1/chat/completions",
                                          metadata={GATHER_METADATA_KEY: creating.gather_id})
    await openai_batches.create(await openai_batches.upload(body), "/v1/chat/completions",
                                metadata={GATHER_METADATA_KEY: "another-gather"})
    # whoever owns the partition next reads the creating record
    assert next_step(creating) == "find"
    found = await find_created(openai_batches, creating, taken=set())
    assert found is not None
    adopted = creating.opened(found, 5)
    assert adopted.provider_batch_id == created.batch_id and next_step(adopted) == "poll"
    assert mock.stats()["batches"]["openai"]["created"] == 2  # no third batch
    never = replace(creating, gather_id="never-created")
    assert await find_created(openai_batches, never, taken=set()) is None


async def test_an_anthropic_takeover_adopts_the_one_batch_of_its_size_and_time(
        anthropic_batches: AnthropicBatches) -> None:
    """Anthropic's batches carry no metadata: the request count and the creation time pick the batch."""
    creating = ProviderBatchRecord("g-crash", "anthropic", "mock-small", 0, ("r1", "r2", "r3"),
                                   RecordState.CREATING, now_ms(), now_ms())
    created = await anthropic_batches.create(anthropic_input({cid: "Hello" for cid in creating.custom_ids()}))
    other = await anthropic_batches.create(anthropic_input({"a": "x", "b": "y"}))  # another gather, another size
    found = await find_created(anthropic_batches, creating, taken={other.batch_id})
    assert found is not None and found.batch_id == created.batch_id
    assert await find_created(anthropic_batches, creating, taken={created.batch_id}) is None  # another record's
    twin = await anthropic_batches.create(anthropic_input({cid: "Hi" for cid in creating.custom_ids()}))
    assert twin.batch_id != created.batch_id
    assert await find_created(anthropic_batches, creating, taken=set()) is None  # two fit: ambiguous


async def test_an_answer_past_the_response_cap_is_not_read_further(mock: MockLLMHandle) -> None:
    client = OpenAIBatches(endpoint(mock.url).model_copy(update={"max_response_bytes": 100}))
    try:
        assert (await client.page()).batches == ()  # an empty list fits
        with pytest.raises(BatchCallFailed) as refused:
            await client.upload(openai_input(TEXTS))  # a file object does not
        assert refused.value.outcome.code == "malformed_batch_answer" and "100 bytes" in str(refused.value)
    finally:
        await client.aclose()
