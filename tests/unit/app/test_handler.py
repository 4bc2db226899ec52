"""The per-record handler: every record ends in exactly one outcome, and the handler never raises.

Pure logic with in-memory fakes: a recording Sink, a dict-backed StateStore, a scripted Caller whose
replies are classified by the real ``classify`` functions, a fixed clock and a seeded RNG.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import pytest

from streamproc import codec
from streamproc.app.handler import Disposition, Handler, HandlerOptions, Record, StateWriteFailed
from streamproc.core import headers
from streamproc.core.decision import Retries
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RepairContext, RequestState
from streamproc.core.outcome import ConfigurationProblem, Failure
from streamproc.core.request_state import (
    RecordRef,
    Start,
    admit,
    input_hash,
    on_retry_scheduled,
    on_success,
    on_terminal_failure,
)
from streamproc.core.retry_policy import DEFAULT_MAX_ATTEMPTS, RetryPolicy, Tier
from streamproc.core.reuse import REUSE_RESULTS, reuse_wanted, reused_result
from streamproc.core.verdict import classify_http_error
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.llm.client import CallResult
from streamproc.llm.completion import check_completion
from streamproc.llm.transport_errors import classify_exception

NOW = 1_700_000_000_000
SEED = 7
REQUESTS = "llm.requests"
PARTITION = 3
OFFSET = 100
TIER_NAMES = {"5s", "30s", "2m", "10m"}
ORIGIN_HEADERS = {headers.ORIG_TOPIC: REQUESTS.encode(), headers.ORIG_PARTITION: b"3", headers.ORIG_OFFSET: b"100"}

BODY: dict[str, Any] = {"model": "gpt-test", "messages": [{"role": "user", "content": "Label: Buy now!!!"}]}
JSON_BODY: dict[str, Any] = {**BODY, "response_format": {"type": "json_object"}}


def make_request(request_id: str = "req-1", body: dict[str, Any] | None = None) -> InferenceRequest:
    return InferenceRequest(request_id, json.dumps(body if body is not None else BODY), batch_id="batch-1",
                            submitted_ms=NOW - 1_000)


# --- replies: what the LLM answers, classified by the real functions -------------------------------------

Reply = Callable[[dict[str, Any]], CallResult]


def completion_bytes(content: str | None, finish_reason: str = "stop") -> bytes:
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-test-0613",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3},
    }).encode()


def answer(content: str | None, latency_ms: int = 12) -> Reply:
    """A 200, checked against the body actually sent (as the real client does)."""
    raw = completion_bytes(content)
    return lambda body: CallResult(check_completion(raw, body), raw, latency_ms)


def http_error(status: int, payload: dict[str, Any], response_headers: dict[str, str] | None = None) -> Reply:
    raw = json.dumps(payload).encode()
    outcome = classify_http_error(status, response_headers or {}, raw)
    return lambda body: CallResult(outcome, raw, 30)


def raised(exc: Exception) -> Reply:
    outcome = classify_exception(exc)
    return lambda body: CallResult(outcome, b"", 30_000)


READ_TIMEOUT = raised(httpx.ReadTimeout("timed out"))
UNAVAILABLE = http_error(503, {"error": {"message": "Service Unavailable", "type": "server_error"}},
                         {"retry-after": "2"})
CONTEXT_TOO_LONG = http_error(400, {"error": {
    "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
BAD_KEY = http_error(401, {"error": {"message": "Incorrect API key provided: sk-abc.", "type": "invalid_request_error",
                                     "code": "invalid_api_key"}})


def rate_limited(retry_after_ms: int) -> Reply:
    return http_error(429, {"error": {"message": "Rate limit reached for requests", "type": "requests",
                                      "code": "rate_limit_exceeded"}},
                      {"retry-after-ms": str(retry_after_ms)})


# --- fakes -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SentRetry:
    tier: Tier
    request: InferenceRequest
    headers: headers.Headers


class RecordingSink:
    """Keeps what was sent; ``fail_sends`` makes the first N sends raise, as a broker outage would."""

    def __init__(self, log: list[str], fail_sends: int = 0) -> None:
        self.log = log
        self.fail_sends = fail_sends
        self.results: list[InferenceResult] = []
        self.failures: list[tuple[FailureEvent, headers.Headers]] = []
        self.retries: list[SentRetry] = []
        self.dead_letters: list[tuple[Record, headers.Headers]] = []
        self.rekeyed: list[Record] = []  # the copies, as the worker reads them back (at the offset after)

    def _maybe_fail(self, what: str) -> None:
        if self.fail_sends > 0:
            self.fail_sends -= 1
            self.log.append(f"send failed: {what}")
            raise RuntimeError(f"broker unavailable while sending {what}")

    async def result(self, result: InferenceResult) -> None:
        self._maybe_fail("result")
        self.log.append(f"result {result.request_id}")
        self.results.append(result)

    async def failure(self, event: FailureEvent, hdrs: headers.Headers) -> None:
        self._maybe_fail("failure")
        self.log.append(f"failure {event.layer.value} terminal={event.terminal}")
        self.failures.append((event, dict(hdrs)))

    async def retry(self, tier: Tier, request: InferenceRequest, hdrs: headers.Headers) -> RecordRef:
        self._maybe_fail("retry")
        self.log.append(f"retry {tier.name}")
        self.retries.append(SentRetry(tier, request, dict(hdrs)))
        return RecordRef(f"retry.{tier.name}", 100 + len(self.retries))  # where a broker would have put it

    async def dead_letter(self, record: Record, hdrs: headers.Headers) -> None:
        self._maybe_fail("dead_letter")
        self.log.append("dead_letter")
        self.dead_letters.append((record, dict(hdrs)))

    async def rekey(self, record: Record, request_id: str, hdrs: headers.Headers) -> None:
        self._maybe_fail("rekey")
        self.log.append(f"rekey {request_id}")
        self.rekeyed.append(Record(record.topic, PARTITION, record.offset + 1, request_id.encode(), record.value,
                                   dict(hdrs)))

    @property
    def sent(self) -> int:
        return (len(self.results) + len(self.failures) + len(self.retries) + len(self.dead_letters)
                + len(self.rekeyed))


class DictStore:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.states: dict[str, RequestState] = {}
        self.unsent: set[RequestStatus] = set()  # writes of these statuses stay local: the changelog send fails

    def get(self, request_id: str) -> RequestState | None:
        return self.states.get(request_id)

    async def put(self, state: RequestState) -> None:
        self.log.append(f"state {state.status.value}")
        self.states[state.request_id] = state
        if state.status in self.unsent:
            raise StateWriteFailed(f"request {state.request_id}: not sent")


class ScriptedCaller:
    def __init__(self, replies: list[Reply]) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[InferenceRequest, dict[str, Any]]] = []

    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        self.calls.append((request, body))
        assert self.replies, f"unexpected call #{len(self.calls)} for {request.request_id}"
        return self.replies.pop(0)(body)


class RaisingCaller:
    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        raise KeyError("a bug in the client")


@dataclass
class Clock:
    now: int = NOW

    def __call__(self) -> int:
        return self.now


@dataclass
class Rig:
    """A handler wired to fakes that share one event log."""

    replies: list[Reply] = field(default_factory=list)
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    fail_sends: int = 0

    def __post_init__(self) -> None:
        self.log: list[str] = []
        self.sink = RecordingSink(self.log, self.fail_sends)
        self.store = DictStore(self.log)
        self.caller = ScriptedCaller(self.replies)
        self.clock = Clock()
        self.problems: list[ConfigurationProblem] = []
        self.handler = Handler(self.caller, self.sink, self.store, Retries(self.policy, random.Random(SEED)),
                               self.problems.append, HandlerOptions(clock_ms=self.clock))

    async def handle(self, record: Record) -> Disposition:
        return await self.handler.handle(record)

    def state(self, request_id: str = "req-1") -> RequestState:
        state = self.store.get(request_id)
        assert state is not None, f"no state for {request_id}"
        return state


def submission(request: InferenceRequest, offset: int = OFFSET, key: bytes | None = None,
               hdrs: dict[str, bytes] | None = None) -> Record:
    return Record(REQUESTS, PARTITION, offset, key if key is not None else request.request_id.encode(),
                  codec.encode(request), hdrs or {})


def next_hop(sent: SentRetry, offset: int) -> Record:
    """The retry record as the tier agent reads it back (through the real codec)."""
    return Record(f"llm.retry.{sent.tier.name}", PARTITION, offset, sent.request.request_id.encode(),
                  codec.encode(sent.request), sent.headers)


def only_failure(rig: Rig) -> tuple[FailureEvent, headers.Headers]:
    assert len(rig.sink.failures) == 1, rig.log
    return rig.sink.failures[0]


def text(hdrs: headers.Headers, name: str) -> str:
    return hdrs[name].decode()


def in_flight_state(request: InferenceRequest, source: RecordRef, attempt: int = 1) -> RequestState:
    admission = admit(None, request, attempt, NOW - 5_000, source=source)
    assert isinstance(admission, Start)
    return admission.state


# --- success ---------------------------------------------------------------------------------------------


async def test_success_sends_one_result_then_marks_the_request_succeeded() -> None:
    rig = Rig([answer("spam", latency_ms=12)])
    request = make_request()

    assert await rig.handle(submission(request)) is Disposition.ACK

    assert rig.sink.failures == [] and rig.sink.retries == [] and rig.sink.dead_letters == []
    [result] = rig.sink.results
    assert result == InferenceResult(
        request_id="req-1", batch_id="batch-1", model="gpt-test-0613",
        response_json=completion_bytes("spam").decode(), content="spam", attempts=1, latency_ms=12,
        completed_ms=NOW, input_hash=input_hash(request),
    )
    [(called_request, called_body)] = rig.caller.calls
    assert called_request == request and called_body == BODY
    state = rig.state()
    assert (state.status, state.attempts, state.source_topic) == (RequestStatus.SUCCEEDED, 1, None)
    # in flight before the call, result before the succeeded state (design §4)
    assert rig.log == ["state in_flight", "result req-1", "state succeeded"]


# --- transport and service failures: retry tiers ---------------------------------------------------------


@pytest.mark.parametrize(("reply", "layer", "code", "hint_ms"), [
    (READ_TIMEOUT, FailureLayer.TRANSPORT, "read_timeout", None),
    (UNAVAILABLE, FailureLayer.SERVICE, "server_error", 2_000),
    (rate_limited(1_500), FailureLayer.SERVICE, "rate_limit_exceeded", 1_500),
    (rate_limited(20_000), FailureLayer.SERVICE, "rate_limit_exceeded", 20_000),
])
async def test_retryable_failure_sends_a_retry_record_and_one_non_terminal_failure(
        reply: Reply, layer: FailureLayer, code: str, hint_ms: int | None) -> None:
    rig = Rig([reply])
    request = make_request()

    assert await rig.handle(submission(request)) is Disposition.ACK

    assert rig.sink.results == []
    [retry] = rig.sink.retries
    assert retry.request == request
    hdrs = retry.headers
    assert text(hdrs, headers.REQUEST_ID) == "req-1"
    assert text(hdrs, headers.ATTEMPT) == "2"
    assert text(hdrs, headers.FAILURE_LAYER) == layer.value
    assert text(hdrs, headers.ERROR_CODE) == code
    assert text(hdrs, headers.FIRST_FAILURE_TS) == str(NOW)
    assert {name: hdrs[name] for name in ORIGIN_HEADERS} == ORIGIN_HEADERS
    due_in = int(text(hdrs, headers.DUE_TS)) - NOW
    # never before the server's hint, never after the tier's delay, and on the smallest tier that waits that long
    assert (hint_ms or 0) <= due_in <= retry.tier.delay_ms
    assert retry.tier == rig.policy.tier_for(due_in)
    if hint_ms is None:
        assert headers.RETRY_AFTER_MS not in hdrs
    else:
        assert text(hdrs, headers.RETRY_AFTER_MS) == str(hint_ms)

    event, failure_hdrs = only_failure(rig)
    assert (event.layer, event.error_code, event.attempt, event.terminal) == (layer, code, 1, False)
    assert event.request == request
    assert (event.first_failure_ms, event.last_failure_ms) == (NOW, NOW)
    assert event.retry_after_ms == hint_ms
    assert text(failure_hdrs, headers.ATTEMPT) == "1"  # the attempt that failed
    assert headers.DUE_TS not in failure_hdrs
    assert {name: failure_hdrs[name] for name in ORIGIN_HEADERS} == ORIGIN_HEADERS

    state = rig.state()
    assert (state.status, state.attempts, state.last_layer, state.last_error_code) == (
        RequestStatus.RETRYING, 1, layer, code)
    assert (state.next_topic, state.next_offset) == (f"retry.{retry.tier.name}", 101)  # for the reconciler
    assert state.retries_spent == (0 if code == "rate_limit_exceeded" else 1)  # a 429 spends no budget
    assert rig.log[-1] == "state retrying"  # written only once the retry and the failure are on Kafka


async def test_a_server_hint_longer_than_the_first_tier_picks_a_later_tier() -> None:
    rig = Rig([rate_limited(20_000)])
    await rig.handle(submission(make_request()))
    [retry] = rig.sink.retries
    assert retry.tier == Tier("30s", 30_000)


async def test_retry_record_with_attempt_2_is_admitted_and_its_failure_counted() -> None:
    rig = Rig([READ_TIMEOUT, UNAVAILABLE])
    request = make_request()
    await rig.handle(submission(request))
    [first_retry] = rig.sink.retries
    rig.clock.now = NOW + 6_000

    assert await rig.handle(next_hop(first_retry, offset=7)) is Disposition.ACK

    assert len(rig.caller.calls) == 2
    second_event, second_hdrs = rig.sink.failures[1]
    assert (second_event.attempt, second_event.terminal, second_event.error_code) == (2, False, "server_error")
    assert second_event.first_failure_ms == NOW  # carried from the first failure
    assert second_event.last_failure_ms == NOW + 6_000
    assert text(second_hdrs, headers.ATTEMPT) == "2"
    second_retry = rig.sink.retries[1]
    assert text(second_retry.headers, headers.ATTEMPT) == "3"
    state = rig.state()
    assert (state.status, state.attempts, state.last_error_code) == (RequestStatus.RETRYING, 2, "server_error")


async def test_provenance_is_written_once_and_carried_unchanged() -> None:
    rig = Rig([READ_TIMEOUT, READ_TIMEOUT])
    await rig.handle(submission(make_request()))
    first_retry = rig.sink.retries[0]
    rig.clock.now = NOW + 6_000

    await rig.handle(next_hop(first_retry, offset=7))  # read from llm.retry.5s[3]@7

    second_retry = rig.sink.retries[1]
    for hdrs in (second_retry.headers, rig.sink.failures[1][1]):
        assert {name: hdrs[name] for name in ORIGIN_HEADERS} == ORIGIN_HEADERS
        assert text(hdrs, headers.FIRST_FAILURE_TS) == str(NOW)
    assert int(text(second_retry.headers, headers.DUE_TS)) >= NOW + 6_000


async def test_success_on_a_retry_reports_the_attempt_that_answered() -> None:
    rig = Rig([UNAVAILABLE, answer("ham")])
    await rig.handle(submission(make_request()))
    await rig.handle(next_hop(rig.sink.retries[0], offset=7))

    [result] = rig.sink.results
    assert (result.attempts, result.content) == (2, "ham")
    assert rig.state().status is RequestStatus.SUCCEEDED
    assert [e.terminal for e, _ in rig.sink.failures] == [False]


@pytest.mark.parametrize(("layer", "reply", "code"), [
    (FailureLayer.TRANSPORT, READ_TIMEOUT, "read_timeout"),
    (FailureLayer.SERVICE, UNAVAILABLE, "server_error"),
    (FailureLayer.SEMANTIC, answer("   "), "empty_content"),
])
async def test_the_last_allowed_attempt_ends_in_a_terminal_failure(
        layer: FailureLayer, reply: Reply, code: str) -> None:
    budget = DEFAULT_MAX_ATTEMPTS[layer]
    rig = Rig([reply] * budget)
    await rig.handle(submission(make_request()))
    for hop in range(1, budget):
        rig.clock.now += 700_000
        assert await rig.handle(next_hop(rig.sink.retries[-1], offset=hop)) is Disposition.ACK

    assert len(rig.caller.calls) == budget
    assert len(rig.sink.retries) == budget - 1
    events = [event for event, _ in rig.sink.failures]
    assert [e.attempt for e in events] == list(range(1, budget + 1))
    assert [e.terminal for e in events] == [False] * (budget - 1) + [True]
    assert {(e.layer, e.error_code) for e in events} == {(layer, code)}
    last_event, last_hdrs = rig.sink.failures[-1]
    assert last_event.first_failure_ms == NOW
    assert text(last_hdrs, headers.FAILURE_LAYER) == layer.value  # the worker sends it to llm.failed.<layer>
    state = rig.state()
    assert (state.status, state.attempts, state.last_layer) == (RequestStatus.FAILED, budget, layer)
    assert rig.log[-2:] == [f"failure {layer.value} terminal=True", "state failed"]


async def test_headers_do_not_grow_over_hops() -> None:
    rig = Rig([rate_limited(1_000)] * 6)
    await rig.handle(submission(make_request(), hdrs={"traceparent": b"00-abc-def-01"}))
    for hop in range(1, 6):
        rig.clock.now += 700_000
        await rig.handle(next_hop(rig.sink.retries[-1], offset=hop))

    retry_names = [sorted(sent.headers) for sent in rig.sink.retries]
    failure_names = [sorted(hdrs) for _, hdrs in rig.sink.failures]
    assert len(retry_names) == 5 and len(failure_names) == 6
    assert all(names == retry_names[0] for names in retry_names), retry_names
    assert all(names == failure_names[0] for names in failure_names), failure_names
    assert [text(sent.headers, headers.ATTEMPT) for sent in rig.sink.retries] == ["2", "3", "4", "5", "6"]
    assert rig.sink.failures[-1][0].terminal


# --- business and semantic failures ----------------------------------------------------------------------


async def test_context_length_exceeded_is_terminal_at_once_and_never_retried() -> None:
    rig = Rig([CONTEXT_TOO_LONG])
    assert await rig.handle(submission(make_request())) is Disposition.ACK

    assert rig.sink.retries == [] and rig.sink.results == []
    event, hdrs = only_failure(rig)
    assert (event.layer, event.error_code, event.terminal, event.attempt, event.http_status) == (
        FailureLayer.BUSINESS, "context_length_exceeded", True, 1, 400)
    assert "maximum context length" in event.message
    assert text(hdrs, headers.FAILURE_LAYER) == "business"
    assert rig.state().status is RequestStatus.FAILED
    assert len(rig.caller.calls) == 1


async def test_semantic_failure_retries_as_a_repair_request_carrying_the_bad_output() -> None:
    request = make_request(body=JSON_BODY)
    rig = Rig([answer("Sure! Here is the label: spam"), answer('{"label": "spam"}')])
    await rig.handle(submission(request))

    [retry] = rig.sink.retries
    event, _ = only_failure(rig)
    assert (event.layer, event.error_code, event.terminal) == (FailureLayer.SEMANTIC, "invalid_json", False)
    assert event.request.repair is None  # the failure carries the request as it was called
    assert retry.request.repair == RepairContext(bad_output="Sure! Here is the label: spam", reason=event.message)
    assert retry.request.body_json == request.body_json  # same input, so the same input hash
    assert text(retry.headers, headers.ATTEMPT) == "2"

    await rig.handle(next_hop(retry, offset=7))

    _, repaired_body = rig.caller.calls[1]
    messages = repaired_body["messages"]
    assert messages[:-2] == JSON_BODY["messages"]
    assert messages[-2] == {"role": "assistant", "content": "Sure! Here is the label: spam"}
    assert messages[-1]["role"] == "user" and "rejected" in messages[-1]["content"]
    [result] = rig.sink.results
    assert (result.content, result.attempts, result.input_hash) == ('{"label": "spam"}', 2, input_hash(request))


def cut_off(content: str) -> Reply:
    """A 200 whose answer stopped at max_tokens."""
    raw = completion_bytes(content, finish_reason="length")
    return lambda body: CallResult(check_completion(raw, body), raw, 12)


async def test_a_cut_answer_is_escalated_the_same_request_with_twice_the_room_up_to_eight_times_its_own() -> None:
    """Escalations are bounded by their own rule (core.retry_policy.Escalation), not by the semantic layer's 3
    attempts: each is the same request, due at once, with only its completion budget raised."""
    request = make_request(body={**BODY, "max_tokens": 64})
    rig = Rig([cut_off("The message is spam because"), cut_off("It is spam: it"), cut_off("Spam. It"),
               answer("Spam: it promises money.")])
    await rig.handle(submission(request))
    for hop in range(3):
        rig.clock.now += 1_000
        await rig.handle(next_hop(rig.sink.retries[hop], offset=10 + hop))

    sent = [body["max_tokens"] for _, body in rig.caller.calls]
    assert sent == [64, 128, 256, 512]  # doubled after each cut, never above 8 x 64
    assert [text(retry.headers, headers.MAX_TOKENS) for retry in rig.sink.retries] == ["128", "256", "512"]
    assert [int(text(retry.headers, headers.DUE_TS)) for retry in rig.sink.retries] == [NOW, NOW + 1_000,
                                                                                        NOW + 2_000]  # at once
    assert [event.error_code for event, _ in rig.sink.failures] == ["truncated"] * 3
    assert all(body["messages"] == BODY["messages"] for _, body in rig.caller.calls)  # no repair turns
    assert all(retry.request == request for retry in rig.sink.retries)
    [result] = rig.sink.results
    assert result.attempts == 4 and result.input_hash == input_hash(request)  # the body itself never changed
    assert rig.state().retries_spent == 0  # none of the batch's retry budget


async def test_a_cut_answer_past_its_escalations_is_a_semantic_failure_like_any_other() -> None:
    request = make_request(body={**BODY, "max_tokens": 64})
    rig = Rig([cut_off("The message"), cut_off("The message is"), cut_off("The message is spam"),
               cut_off("The message is spam, since")])
    await rig.handle(submission(request))
    for hop in range(3):
        await rig.handle(next_hop(rig.sink.retries[hop], offset=10 + hop))

    assert [body["max_tokens"] for _, body in rig.caller.calls] == [64, 128, 256, 512]
    assert len(rig.sink.retries) == 3  # the 4th cut ends it: past the semantic layer's 3 attempts
    event, _ = rig.sink.failures[-1]
    assert (event.terminal, event.layer, event.error_code, event.attempt) == (True, FailureLayer.SEMANTIC,
                                                                             "truncated", 4)


async def test_a_cut_answer_without_a_budget_of_its_own_is_repaired_not_escalated() -> None:
    """The server's default budget is unknown, so there is nothing to raise: a repair request, which the batch's
    retry budget pays for."""
    rig = Rig([cut_off("The message is spam because"), answer("Spam.")])
    await rig.handle(submission(make_request()))
    [retry] = rig.sink.retries
    assert headers.MAX_TOKENS not in retry.headers and retry.request.repair is not None
    assert rig.state().retries_spent == 1
    await rig.handle(next_hop(retry, offset=11))
    assert "max_tokens" not in rig.caller.calls[1][1]
    assert rig.caller.calls[1][1]["messages"][-2] == {"role": "assistant", "content": "The message is spam because"}


async def test_the_raised_room_is_kept_through_other_failures_and_the_newer_field_name_used() -> None:
    request = make_request(body={**BODY, "max_completion_tokens": 100})
    rig = Rig([cut_off("Half an"), UNAVAILABLE, answer("A whole answer.")])
    await rig.handle(submission(request))
    await rig.handle(next_hop(rig.sink.retries[0], offset=11))
    await rig.handle(next_hop(rig.sink.retries[1], offset=12))

    assert [body["max_completion_tokens"] for _, body in rig.caller.calls] == [100, 200, 200]
    assert "max_tokens" not in rig.caller.calls[1][1]  # the newer name is kept


# --- configuration problems ------------------------------------------------------------------------------


async def test_configuration_problem_holds_the_record_and_emits_nothing() -> None:
    rig = Rig([BAD_KEY, answer("spam")])
    record = submission(make_request())

    assert await rig.handle(record) is Disposition.HOLD

    assert rig.sink.sent == 0
    [problem] = rig.problems
    assert (problem.code, problem.http_status) == ("invalid_api_key", 401)
    state = rig.state()
    assert (state.status, state.source_topic, state.source_offset) == (RequestStatus.IN_FLIGHT, REQUESTS, OFFSET)

    # after the fix the worker starts again and reads the same record: it is admitted, not skipped
    assert await rig.handle(record) is Disposition.ACK
    assert len(rig.sink.results) == 1 and len(rig.problems) == 1


# --- dedupe ----------------------------------------------------------------------------------------------


def _stored_states() -> dict[str, RequestState]:
    request = make_request()
    other = RecordRef(REQUESTS, 50)
    in_flight = in_flight_state(request, other)
    return {
        "in_flight": in_flight,
        "retrying": on_retry_scheduled(in_flight, FailureLayer.TRANSPORT, "read_timeout", NOW - 4_000),
        "succeeded": on_success(in_flight, NOW - 4_000),
        "failed": on_terminal_failure(in_flight, FailureLayer.BUSINESS, "refusal", NOW - 4_000),
    }


@pytest.mark.parametrize("status", ["in_flight", "retrying", "succeeded", "failed"])
async def test_a_duplicate_submission_is_skipped_without_calling(status: str) -> None:
    rig = Rig([answer("never used")])
    stored = _stored_states()[status]
    rig.store.states["req-1"] = stored

    assert await rig.handle(submission(make_request(), offset=101)) is Disposition.ACK

    assert rig.caller.calls == []
    assert rig.sink.sent == 0
    assert rig.store.states == {"req-1": stored}


async def test_a_resubmission_after_success_is_skipped() -> None:
    rig = Rig([answer("spam")])
    await rig.handle(submission(make_request(), offset=100))
    await rig.handle(submission(make_request(), offset=101))
    assert len(rig.caller.calls) == 1 and len(rig.sink.results) == 1 and rig.sink.failures == []


async def test_a_stale_copy_of_a_retry_record_is_skipped() -> None:
    rig = Rig([READ_TIMEOUT, READ_TIMEOUT])
    await rig.handle(submission(make_request()))
    retry = rig.sink.retries[0]
    await rig.handle(next_hop(retry, offset=7))
    await rig.handle(next_hop(retry, offset=8))  # the same retry record written twice
    assert len(rig.caller.calls) == 2


async def test_a_crash_redelivery_of_the_record_in_flight_is_called_again() -> None:
    rig = Rig([answer("spam")])
    request = make_request()
    rig.store.states["req-1"] = in_flight_state(request, RecordRef(REQUESTS, OFFSET))

    assert await rig.handle(submission(request, offset=OFFSET)) is Disposition.ACK

    assert len(rig.caller.calls) == 1
    assert len(rig.sink.results) == 1
    assert rig.state().status is RequestStatus.SUCCEEDED


@pytest.mark.parametrize("status", ["in_flight", "succeeded", "retrying"])
async def test_a_conflicting_duplicate_fails_and_leaves_the_original_untouched(status: str) -> None:
    rig = Rig([answer("never used")])
    original = _stored_states()[status]
    rig.store.states["req-1"] = original
    conflicting = make_request(body={**BODY, "temperature": 1})

    assert await rig.handle(submission(conflicting, offset=101)) is Disposition.ACK

    assert rig.caller.calls == []
    event, hdrs = only_failure(rig)
    assert (event.layer, event.error_code, event.terminal) == (FailureLayer.BUSINESS, "conflicting_duplicate", True)
    assert event.request == conflicting
    assert text(hdrs, headers.ERROR_CODE) == "conflicting_duplicate"
    assert rig.store.states == {"req-1": original}
    assert rig.sink.retries == [] and rig.sink.results == []


# --- poison records --------------------------------------------------------------------------------------


def random_bytes(n: int = 64) -> bytes:
    rng = random.Random(1234)
    return b"\x17" + bytes(rng.randrange(256) for _ in range(n - 1))  # not C3 01, 00 or JSON text


async def test_undecodable_record_with_a_key_is_a_business_failure_keeping_the_raw_value() -> None:
    rig = Rig()
    value = random_bytes()
    record = Record(REQUESTS, PARTITION, OFFSET, b"req-9", value, {})

    assert await rig.handle(record) is Disposition.ACK

    event, hdrs = only_failure(rig)
    assert (event.layer, event.error_code, event.terminal) == (FailureLayer.BUSINESS, "undecodable_record", True)
    assert event.request.request_id == "req-9"
    assert base64.b64decode(event.request.metadata["raw_value_base64"]) == value
    assert event.message.startswith(f"record {REQUESTS}[{PARTITION}]@{OFFSET}: ")
    assert "unknown framing" in event.message
    assert text(hdrs, headers.REQUEST_ID) == "req-9"
    assert {name: hdrs[name] for name in ORIGIN_HEADERS} == ORIGIN_HEADERS
    assert rig.sink.dead_letters == [] and rig.caller.calls == []
    state = rig.state("req-9")
    assert (state.status, state.last_error_code) == (RequestStatus.FAILED, "undecodable_record")


async def test_an_invalid_json_request_without_a_key_is_a_failure_for_the_id_it_names_where_it_is() -> None:
    """Not re-keyed: it ends at once, and its failure names the record its producer wrote (design §3)."""
    rig = Rig()
    value = json.dumps({"custom_id": "req-json", "body": BODY}).encode()
    assert await rig.handle(Record(REQUESTS, PARTITION, OFFSET, None, value, {})) is Disposition.ACK
    assert rig.sink.rekeyed == []
    event, hdrs = only_failure(rig)
    assert (event.request.request_id, event.error_code) == ("req-json", "invalid_json_request")
    assert event.message == f"record {REQUESTS}[{PARTITION}]@{OFFSET}: missing method (only POST is supported)"
    assert headers.read_hop(hdrs).origin == headers.Origin(REQUESTS, PARTITION, OFFSET)
    assert rig.state("req-json").status is RequestStatus.FAILED


@pytest.mark.parametrize("key", [None, b"", b"\xff\xfe"])
async def test_a_request_whose_key_names_no_id_is_written_again_under_its_id_and_nothing_else(
        key: bytes | None) -> None:
    """Handled where its producer put it, its state would sit on another partition than its retries (design §3)."""
    rig = Rig([answer("ham")])
    record = Record(REQUESTS, PARTITION, OFFSET, key, codec.encode(make_request()), {"x-tenant": b"team-a"})
    assert await rig.handle(record) is Disposition.ACK
    assert rig.log == ["rekey req-1"] and rig.caller.calls == []
    [copy] = rig.sink.rekeyed
    assert (copy.topic, copy.key, copy.value) == (REQUESTS, b"req-1", record.value)
    assert copy.headers == {"x-tenant": b"team-a", headers.ORIG_TOPIC: REQUESTS.encode(),
                            headers.ORIG_PARTITION: str(PARTITION).encode(), headers.ORIG_OFFSET: str(OFFSET).encode()}
    assert await rig.handle(copy) is Disposition.ACK
    assert [result.request_id for result in rig.sink.results] == ["req-1"]
    assert rig.state().status is RequestStatus.SUCCEEDED
    rig.log.clear()
    assert await rig.handle(record) is Disposition.ACK  # the original read again (a crash before its ack)
    [_, second] = rig.sink.rekeyed
    assert await rig.handle(replace(second, offset=OFFSET + 2)) is Disposition.ACK
    # the second copy is a duplicate of an ended request: skipped (its state written again), not called
    assert rig.log == ["rekey req-1", "state succeeded"] and len(rig.sink.results) == len(rig.caller.calls) == 1


async def test_a_copy_that_cannot_be_sent_is_an_internal_error_as_any_failed_send() -> None:
    rig = Rig(fail_sends=1)
    record = Record(REQUESTS, PARTITION, OFFSET, None, codec.encode(make_request()), {})
    assert await rig.handle(record) is Disposition.ACK
    event, _ = only_failure(rig)
    assert (event.error_code, event.request.request_id) == ("internal_error", "req-1")
    assert "while sending rekey" in event.message
    assert rig.sink.rekeyed == [] and rig.store.states == {}  # no state on the producer's partition


async def test_undecodable_record_without_any_id_goes_to_the_dead_letters_with_the_reason() -> None:
    rig = Rig()
    record = Record(REQUESTS, PARTITION, OFFSET, None, random_bytes(), {})

    assert await rig.handle(record) is Disposition.ACK

    [(dead, hdrs)] = rig.sink.dead_letters
    assert dead == record  # byte for byte
    assert text(hdrs, headers.FAILURE_LAYER) == "business"
    assert text(hdrs, headers.ERROR_CODE) == "unreadable_record"
    reason = text(hdrs, headers.ERROR_MESSAGE)
    assert reason.startswith(f"record {REQUESTS}[{PARTITION}]@{OFFSET}: ") and "unknown framing" in reason
    assert {name: hdrs[name] for name in ORIGIN_HEADERS} == ORIGIN_HEADERS
    assert rig.sink.failures == [] and rig.store.states == {} and rig.caller.calls == []


async def test_a_key_that_differs_from_the_request_id_is_a_key_mismatch() -> None:
    rig = Rig([answer("never used")])
    record = submission(make_request("req-1"), key=b"someone-else")

    assert await rig.handle(record) is Disposition.ACK

    event, _ = only_failure(rig)
    assert (event.layer, event.error_code, event.terminal) == (FailureLayer.BUSINESS, "key_mismatch", True)
    assert "'someone-else'" in event.message and "'req-1'" in event.message
    assert rig.caller.calls == []
    assert "req-1" not in rig.store.states  # its state lives on another partition: never written from here


@pytest.mark.parametrize("body_json", ["[1, 2]", '"just text"', "{not json", ""])
async def test_a_body_that_is_not_a_json_object_fails_before_any_call(body_json: str) -> None:
    rig = Rig([answer("never used")])
    request = InferenceRequest("req-1", body_json, batch_id="batch-1")

    assert await rig.handle(submission(request)) is Disposition.ACK

    assert rig.caller.calls == []
    event, _ = only_failure(rig)
    assert (event.layer, event.error_code, event.terminal) == (FailureLayer.BUSINESS, "malformed_body", True)
    assert "'req-1'" in event.message
    assert event.request == request
    assert rig.state().status is RequestStatus.FAILED


# --- the handler never raises ----------------------------------------------------------------------------


async def test_a_failed_result_send_becomes_an_internal_error_not_an_exception() -> None:
    rig = Rig([answer("spam")], fail_sends=1)

    assert await rig.handle(submission(make_request())) is Disposition.ACK

    assert rig.sink.results == []
    event, hdrs = only_failure(rig)
    assert (event.layer, event.error_code, event.terminal) == (FailureLayer.BUSINESS, "internal_error", True)
    assert "RuntimeError: broker unavailable while sending result" in event.message
    assert event.request == make_request()
    assert {name: hdrs[name] for name in ORIGIN_HEADERS} == ORIGIN_HEADERS


async def test_an_internal_error_leaves_the_request_replayable() -> None:
    """The internal_error failure says "replay once fixed": the state must let that replay through."""
    rig = Rig([answer("spam"), answer("spam")], fail_sends=1)
    request = make_request()
    await rig.handle(submission(request))
    assert rig.state().status is RequestStatus.FAILED

    replay = submission(request, offset=900, hdrs={headers.REPLAY: b"1"})
    assert await rig.handle(replay) is Disposition.ACK

    assert len(rig.caller.calls) == 2
    assert len(rig.sink.results) == 1 and rig.state().status is RequestStatus.SUCCEEDED


async def test_a_retry_record_from_before_a_replay_is_skipped_while_the_replay_runs() -> None:
    """Attempt numbers restart at 1 with a replay; the run (``x-run``) is what tells the first run's retry
    record, read again after a rebalance, from a newer attempt of the replay's run."""
    rig = Rig([READ_TIMEOUT, CONTEXT_TOO_LONG, READ_TIMEOUT])
    request = make_request()
    await rig.handle(submission(request))
    [first_run_retry] = rig.sink.retries
    assert text(first_run_retry.headers, headers.RUN) == "1"
    rig.clock.now = NOW + 6_000
    await rig.handle(next_hop(first_run_retry, offset=7))  # attempt 2 fails for good
    assert rig.state().status is RequestStatus.FAILED

    await rig.handle(submission(request, offset=900, hdrs={headers.REPLAY: b"1", headers.ATTEMPT: b"1"}))
    assert (rig.state().run, rig.state().status) == (2, RequestStatus.RETRYING)
    assert text(rig.sink.retries[-1].headers, headers.RUN) == "2"

    assert await rig.handle(next_hop(first_run_retry, offset=7)) is Disposition.ACK  # read again: skipped
    assert len(rig.caller.calls) == 3
    assert (rig.state().run, rig.state().attempts, rig.state().status) == (2, 1, RequestStatus.RETRYING)


async def test_each_failure_event_carries_the_run_its_attempt_was_admitted_in() -> None:
    """A replay's attempt 1 is not the first run's attempt 1: the run tells the sink's rows apart, and a consumer
    of the failure topics can tell them apart from the record's headers alone."""
    rig = Rig([READ_TIMEOUT, CONTEXT_TOO_LONG, CONTEXT_TOO_LONG])
    request = make_request()
    await rig.handle(submission(request))
    [retry] = rig.sink.retries
    rig.clock.now = NOW + 6_000
    await rig.handle(next_hop(retry, offset=7))
    await rig.handle(submission(request, offset=900, hdrs={headers.REPLAY: b"1", headers.ATTEMPT: b"1"}))

    assert [(event.run, event.attempt, event.terminal) for event, _ in rig.sink.failures] == [
        (1, 1, False), (1, 2, True), (2, 1, True)]
    assert [text(hdrs, headers.RUN) for _, hdrs in rig.sink.failures] == ["1", "1", "2"]  # the records' too


async def test_an_internal_error_on_a_retry_hop_keeps_provenance_and_attempt() -> None:
    rig = Rig([READ_TIMEOUT, READ_TIMEOUT])
    await rig.handle(submission(make_request()))
    rig.sink.fail_sends = 1  # the retry send of the second hop fails
    rig.clock.now = NOW + 6_000

    assert await rig.handle(next_hop(rig.sink.retries[0], offset=7)) is Disposition.ACK

    event, hdrs = rig.sink.failures[-1]
    assert (event.error_code, event.terminal, event.attempt) == ("internal_error", True, 2)
    assert event.first_failure_ms == NOW
    assert {name: hdrs[name] for name in ORIGIN_HEADERS} == ORIGIN_HEADERS  # not llm.retry.5s[3]@7
    assert rig.state().status is RequestStatus.FAILED


async def test_a_caller_that_raises_becomes_an_internal_error() -> None:
    log: list[str] = []
    sink, store = RecordingSink(log), DictStore(log)
    handler = Handler(RaisingCaller(), sink, store, Retries(RetryPolicy(), random.Random(SEED)),
                      lambda problem: None, HandlerOptions(clock_ms=Clock()))

    assert await handler.handle(submission(make_request())) is Disposition.ACK

    [(event, _)] = sink.failures
    assert event.error_code == "internal_error" and "KeyError" in event.message


async def test_a_sink_that_always_raises_holds_the_record() -> None:
    rig = Rig([answer("spam")], fail_sends=10)
    assert await rig.handle(submission(make_request())) is Disposition.HOLD
    assert rig.sink.sent == 0
    # held, not acked: its redelivery is admitted as the record that started the attempt
    assert rig.state().status is RequestStatus.IN_FLIGHT


@pytest.mark.parametrize("value", [None, b"", b"\xc3\x01" + b"\x00" * 8, b"\x00\x00\x00\x00\x01hello"])
async def test_odd_payloads_never_raise(value: bytes | None) -> None:
    for key in (None, b"req-x", b"\xff\xfe"):
        rig = Rig()
        disposition = await rig.handle(Record(REQUESTS, PARTITION, OFFSET, key, value, {headers.ATTEMPT: b"zz"}))
        assert disposition is Disposition.ACK
        assert rig.sink.sent == 1, rig.log  # exactly one outcome: a failure or a dead letter


def test_reply_fixtures_classify_as_the_tests_assume() -> None:
    """The replies go through the real classifier: if it changes, these tests must say which premise broke."""
    def verdict(reply: Reply, body: dict[str, Any] = BODY) -> tuple[str, str]:
        outcome = reply(body).outcome
        if isinstance(outcome, Failure):
            return outcome.layer.value, outcome.code
        return type(outcome).__name__, getattr(outcome, "code", "")

    assert verdict(READ_TIMEOUT) == ("transport", "read_timeout")
    assert verdict(UNAVAILABLE) == ("service", "server_error")
    assert verdict(rate_limited(1_500)) == ("service", "rate_limit_exceeded")
    assert verdict(CONTEXT_TOO_LONG) == ("business", "context_length_exceeded")
    assert verdict(BAD_KEY) == ("ConfigurationProblem", "invalid_api_key")
    assert verdict(answer("not json"), JSON_BODY) == ("semantic", "invalid_json")
    assert verdict(answer("spam")) == ("Success", "")


async def test_a_repair_hop_that_cannot_be_built_still_ends_the_request_as_failed() -> None:
    """A body without ``messages`` cannot take repair turns: its repair hop is malformed, and the request ends."""
    body = {"model": "gpt-test", "prompt": "Label: Buy now!!!", "response_format": {"type": "json_object"}}
    rig = Rig([answer("not json")])
    await rig.handle(submission(make_request(body=body)))
    [retry] = rig.sink.retries
    assert retry.request.repair is not None

    assert await rig.handle(next_hop(retry, offset=7)) is Disposition.ACK

    event, _ = rig.sink.failures[-1]
    assert (event.error_code, event.terminal, event.attempt) == ("malformed_body", True, 2)
    assert len(rig.caller.calls) == 1
    state = rig.state()
    assert (state.status, state.last_error_code) == (RequestStatus.FAILED, "malformed_body")

    # ended as failed, so the backfill of a fixed body goes through
    fixed = make_request(body={**BODY, "response_format": {"type": "json_object"}})
    rig.caller.replies.append(answer('{"label": "spam"}'))
    assert await rig.handle(submission(fixed, offset=900, hdrs={headers.REPLAY: b"1"})) is Disposition.ACK
    assert len(rig.sink.results) == 1 and rig.state().status is RequestStatus.SUCCEEDED


async def test_a_late_failure_of_a_superseded_attempt_does_not_undo_a_newer_success() -> None:
    """After a crash, the redelivered submission reruns attempt 1 beside its own retry record's attempt 2. Here
    attempt 2 succeeds while attempt 1's call is still running; attempt 1 then fails: its retry record is
    harmless (the state says succeeded: it will be skipped), but it must not write 'retrying' over the success."""
    request = make_request()
    rig: Rig

    def newer_attempt_succeeds_meanwhile(body: dict[str, Any]) -> CallResult:
        admitted = rig.store.get(request.request_id)
        assert admitted is not None
        rig.store.states[request.request_id] = replace(admitted, status=RequestStatus.SUCCEEDED, attempts=2,
                                                       source_topic=None, source_offset=None)
        return http_error(500, {"error": {"message": "boom", "type": "server_error"}})(body)

    rig = Rig([newer_attempt_succeeds_meanwhile])
    assert await rig.handle(submission(request)) is Disposition.ACK
    assert len(rig.sink.retries) == 1  # its outcome is still written: an outcome is never lost
    assert (rig.state().status, rig.state().attempts) == (RequestStatus.SUCCEEDED, 2)


async def test_a_request_of_a_cancelled_batch_ends_batch_cancelled_without_a_call() -> None:
    rig = Rig([])
    rig.handler = Handler(rig.caller, rig.sink, rig.store, Retries(rig.policy, random.Random(SEED)),
                          rig.problems.append, HandlerOptions(
                              clock_ms=rig.clock,
                              closed=lambda batch_id: "batch_cancelled" if batch_id == "batch-1" else None))
    request = replace(make_request(), batch_id="batch-1")
    assert await rig.handle(submission(request)) is Disposition.ACK
    event, _ = only_failure(rig)
    assert (event.layer, event.error_code, event.terminal) == (FailureLayer.BUSINESS, "batch_cancelled", True)
    assert rig.caller.calls == [] and rig.state().status is RequestStatus.FAILED


async def test_a_replay_of_a_cancelled_batch_is_called() -> None:
    rig = Rig([answer("ok")])
    rig.handler = Handler(rig.caller, rig.sink, rig.store, Retries(rig.policy, random.Random(SEED)),
                          rig.problems.append,
                          HandlerOptions(clock_ms=rig.clock, closed=lambda batch_id: "batch_expired"))
    replayed = submission(make_request(), hdrs={headers.REPLAY: b"1"})
    assert await rig.handle(replayed) is Disposition.ACK
    assert len(rig.sink.results) == 1  # backfill is a new decision of the user's


async def test_a_request_of_a_forgotten_batch_is_refused_and_leaves_no_state_even_as_a_replay() -> None:
    rig = Rig([answer("ok")])
    rig.handler = Handler(rig.caller, rig.sink, rig.store, Retries(rig.policy, random.Random(SEED)),
                          rig.problems.append, HandlerOptions(clock_ms=rig.clock, closed=lambda batch_id: (
                              "batch_forgotten" if batch_id == "gone" else None)))
    request = replace(make_request(), batch_id="gone")
    for record in (submission(request), submission(request, hdrs={headers.REPLAY: b"1"})):
        assert await rig.handle(record) is Disposition.ACK
    assert [(event.error_code, event.terminal) for event, _ in rig.sink.failures] == [("batch_forgotten", True)] * 2
    assert rig.caller.calls == [] and rig.store.get(request.request_id) is None


async def test_a_success_keeps_the_answers_model_and_usage_in_the_state() -> None:
    rig = Rig([answer("ok")])
    await rig.handle(submission(make_request()))
    state = rig.state()
    assert state.status is RequestStatus.SUCCEEDED
    assert state.model is not None and state.prompt_tokens > 0 and state.completion_tokens > 0, state


async def test_a_request_too_large_for_a_retry_record_fails_terminally_and_its_event_omits_the_body() -> None:
    """The chaos run's 1 MB body: its failure event and retry record were over the producer's limit, so the
    worker stopped on it after every restart."""
    huge = replace(make_request(), body_json=json.dumps({"model": "mock-small", "messages": [
        {"role": "user", "content": "x" * 900_000}]}))
    rig = Rig([http_error(500, {"error": {"message": "boom", "type": "server_error"}})])
    assert await rig.handle(submission(huge)) is Disposition.ACK
    assert rig.sink.retries == []
    event, _ = only_failure(rig)
    assert (event.error_code, event.terminal) == ("request_too_large", True)
    assert event.request.body_json == "" and "too large to carry" in event.request.metadata["body_omitted"]
    assert rig.state().status is RequestStatus.FAILED


async def test_an_unreadable_record_too_large_to_copy_is_dead_lettered_without_its_bytes() -> None:
    rig = Rig([])
    record = Record(REQUESTS, PARTITION, OFFSET, None, b"\x00" * 1_000_000, {})
    assert await rig.handle(record) is Disposition.ACK
    [(dead, hdrs)] = rig.sink.dead_letters
    assert dead.value is None and b"not copied (too large)" in hdrs[headers.ERROR_MESSAGE]


async def test_a_redelivered_record_of_an_ended_request_writes_its_state_again_for_the_changelog() -> None:
    """A crash between the local table write and its changelog send left the changelog 'in_flight' for a request
    whose result existed (chaos run): the redelivery, skipped, now sends the ended state once more."""
    rig = Rig([answer("ok")])
    record = submission(make_request())
    await rig.handle(record)
    rig.log.clear()
    assert await rig.handle(record) is Disposition.ACK  # the redelivery after the crash
    assert rig.log == ["state succeeded"] and len(rig.sink.results) == 1 and len(rig.caller.calls) == 1


class IndexedAnswers:
    """A fake of the result index behind ``--reuse-results``: answers by input hash, for opted-in records."""

    def __init__(self, answers: dict[str, InferenceResult]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def answer(self, request: InferenceRequest, record_headers: Mapping[str, bytes], digest: str,
                     now_ms: int) -> InferenceResult | None:
        self.asked.append(digest)
        if not reuse_wanted(record_headers, batch_reuses=False) or digest not in self.answers:
            return None
        return reused_result(self.answers[digest], request, digest, now_ms)


def reusing_rig(replies: list[Reply], answers: dict[str, InferenceResult]) -> tuple[Rig, IndexedAnswers]:
    rig = Rig(replies)
    index = IndexedAnswers(answers)
    rig.handler = Handler(rig.caller, rig.sink, rig.store, Retries(rig.policy, random.Random(SEED)),
                          rig.problems.append, HandlerOptions(clock_ms=rig.clock, reuse=index))
    return rig, index


async def test_an_input_answered_before_is_answered_again_without_a_call_result_first_then_state() -> None:
    request = make_request("batch-1/c-1")
    earlier = InferenceResult("batch-0/c-1", "batch-0", "gpt-test-0613", '{"id": "x"}', "spam", 1, 40, 1,
                              input_hash(request))
    rig, _ = reusing_rig([], {input_hash(request): earlier})

    assert await rig.handle(submission(request, hdrs={REUSE_RESULTS: b"1"})) is Disposition.ACK

    assert rig.caller.calls == []
    [result] = rig.sink.results
    assert (result.request_id, result.reused_from, result.content) == ("batch-1/c-1", "batch-0/c-1", "spam")
    assert rig.log == ["state in_flight", "result batch-1/c-1", "state succeeded"]
    state = rig.state("batch-1/c-1")
    assert state.reused and state.model == "gpt-test-0613" and state.prompt_tokens == 0


async def test_without_the_opt_in_or_without_an_earlier_answer_the_request_is_called() -> None:
    request = make_request("batch-1/c-1")
    earlier = InferenceResult("batch-0/c-1", "batch-0", "gpt-test-0613", "{}", "spam", 1, 40, 1, input_hash(request))
    rig, index = reusing_rig([answer("fresh"), answer("new")], {input_hash(request): earlier})
    await rig.handle(submission(request))  # no opt-in
    other = make_request("batch-1/c-2", {**BODY, "temperature": 0.5})  # another input: nothing to reuse
    await rig.handle(submission(other, offset=OFFSET + 1, hdrs={REUSE_RESULTS: b"1"}))
    assert len(rig.caller.calls) == 2 and len(index.asked) == 2
    assert [result.reused_from for result in rig.sink.results] == [None, None]
    assert not rig.state("batch-1/c-1").reused


async def test_a_redelivered_reused_request_already_succeeded_is_skipped() -> None:
    request = make_request("batch-1/c-1")
    earlier = InferenceResult("batch-0/c-1", "batch-0", "gpt-test-0613", "{}", "spam", 1, 40, 1, input_hash(request))
    rig, index = reusing_rig([], {input_hash(request): earlier})
    record = submission(request, hdrs={REUSE_RESULTS: b"1"})
    await rig.handle(record)
    await rig.handle(record)  # redelivered after the state was written: already_succeeded
    assert len(rig.sink.results) == 1 and len(index.asked) == 1


async def test_a_state_write_that_cannot_reach_the_changelog_holds_the_record_instead_of_failing_it() -> None:
    """The result is on Kafka; a terminal failure event beside it would end the request twice."""
    rig = Rig([answer("fine")])
    rig.store.unsent = {RequestStatus.SUCCEEDED}
    assert await rig.handle(submission(make_request())) is Disposition.HOLD
    assert len(rig.sink.results) == 1 and rig.sink.failures == []


async def test_an_internal_error_whose_failed_state_cannot_be_sent_holds_the_record() -> None:
    rig = Rig([READ_TIMEOUT])
    rig.sink.fail_sends = 1  # the retry record's send fails: an internal error
    rig.store.unsent = {RequestStatus.FAILED}
    assert await rig.handle(submission(make_request())) is Disposition.HOLD
    assert [event.error_code for event, _ in rig.sink.failures][-1] == "internal_error"
