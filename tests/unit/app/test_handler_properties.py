"""Properties of the handler over generated records and answers (hypothesis), issue 13 item 3.

Arbitrary record bytes (random, JSON text, mutated frames, other event types, requests with any body),
arbitrary keys, arbitrary headers (``x-attempt``, ``x-due-ts``, ``x-first-failure-ts``, ``x-orig-*``,
``x-replay``, ``x-deferred``, ``x-max-tokens`` with any value), any prior state of the id, and any answer
of the LLM (any outcome the classifiers give, including for random HTTP answers and exceptions, or a
deferral by the guards) never make ``Handler.handle`` raise, and each record ends in exactly one
documented outcome (design §5.2):

* a result (and the state ``succeeded``);
* a retry record and one non-terminal failure event (state ``retrying``);
* one terminal failure event (state ``failed``, or left as it is for a conflict or a record rejected before
  admission);
* a dead letter (no request id can be known);
* a record whose key names no id, written again under the id it holds, nothing else (state untouched);
* a deferral: the record parked with ``x-deferred``, no failure event (state ``retrying``, a deferral code);
* a skip: nothing sent, the state untouched;
* or ``HOLD`` with nothing sent, only for a configuration problem of the account.

The fakes are test_handler's (recording sink, dict store), wrapped to encode every event and state with
the codec as the worker's sink and table do, so an outcome that could not be written is caught too.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamproc import codec
from streamproc.app.handler import Disposition, Handler, HandlerOptions, Record
from streamproc.core import headers
from streamproc.core.decision import Retries
from streamproc.core.events import FailureEvent, InferenceRequest, InferenceResult, RepairContext, RequestState
from streamproc.core.guards.budget import RetryBudget
from streamproc.core.guards.pauses import MODEL_SCOPED_PROBLEMS
from streamproc.core.outcome import ConfigurationProblem, Failure, Outcome, Success
from streamproc.core.request_state import CIRCUIT_OPEN, DEFERRAL_CODES, MODEL_PAUSED, RecordRef, input_hash
from streamproc.core.retry_policy import RetryPolicy, Tier
from streamproc.core.verdict import classify_http_error
from streamproc.core.vocabulary import FailureLayer, RequestStatus
from streamproc.llm.client import CallResult
from streamproc.llm.completion import check_completion
from streamproc.llm.guarded import Guards
from streamproc.llm.routed import Deferred
from streamproc.llm.transport_errors import classify_exception
from tests.unit.app.test_handler import Clock, DictStore, RecordingSink

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REQUEST_ID = "batch-1/req-1"
TOPICS = ["llm.requests", "llm.retry.5s", "llm.retry.10m"]

# -- the fakes: test_handler's, writing through the codec as the worker does ---------------------------------


class EncodingSink(RecordingSink):
    """Every event is encoded as FaustSink encodes it (a CodecError is a send that fails); retry records are
    written at a growing offset, which the state remembers for the reconciler."""

    async def result(self, result: InferenceResult) -> None:
        codec.encode(result)
        await super().result(result)

    async def failure(self, event: FailureEvent, hdrs: headers.Headers) -> None:
        codec.encode(event)
        _check_headers(hdrs)
        await super().failure(event, hdrs)

    async def retry(self, tier: Tier, request: InferenceRequest, hdrs: headers.Headers) -> RecordRef:
        codec.encode(request)
        _check_headers(hdrs)
        await super().retry(tier, request, hdrs)
        return RecordRef(f"llm.retry.{tier.name}", len(self.retries) - 1)

    async def dead_letter(self, record: Record, hdrs: headers.Headers) -> None:
        _check_headers(hdrs)
        await super().dead_letter(record, hdrs)

    async def rekey(self, record: Record, request_id: str, hdrs: headers.Headers) -> None:
        _check_headers(hdrs)
        await super().rekey(record, request_id, hdrs)


class EncodingStore(DictStore):
    """The state table as TableStore keeps it: Avro-encoded."""

    async def put(self, state: RequestState) -> None:
        codec.decode(codec.encode(state), RequestState)
        await super().put(state)


def _names_no_id(key: bytes | None) -> bool:
    """No key, an empty one, or one that is no text."""
    try:
        return not key or not key.decode("utf-8")
    except UnicodeDecodeError:
        return True


def _check_headers(hdrs: headers.Headers) -> None:
    """Kafka headers: text names, bytes values, readable by the next hop."""
    assert all(isinstance(name, str) and isinstance(value, bytes) for name, value in hdrs.items()), hdrs
    headers.read_hop(hdrs)


class ScriptedGuards(Guards):
    """The real guards' pre-check and retry budget, with the call's answer (or a deferral) scripted."""

    def __init__(self, answer: CallResult | Deferred, budget: RetryBudget | None) -> None:
        super().__init__(_NoCaller(), budget=budget)
        self.answer = answer
        self.calls = 0

    async def call(self, request: InferenceRequest, body: dict[str, Any], attempt: int) -> CallResult | Deferred:
        json.dumps(body, allow_nan=False)  # what the client sends: it must be JSON (httpx refuses NaN, Infinity)
        self.calls += 1
        return self.answer


class _NoCaller:
    async def call(self, request: InferenceRequest, body: dict[str, Any]) -> CallResult:
        raise AssertionError("the scripted guards answer every call")


@dataclass
class Case:
    record: Record
    answer: CallResult | Deferred
    prior: RequestState | None
    budget: RetryBudget | None = None
    problems: list[ConfigurationProblem] = field(default_factory=list)


# -- generated records --------------------------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=20)
_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), _text),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": _text}),
                     min_size=1, max_size=2)
_good_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "gpt-4o-mini"]), "messages": _messages},
    optional={"max_tokens": st.integers(-3, 2**40) | _json, "max_completion_tokens": st.integers(1, 64),
              "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}, {"type": "json_schema",
                                                  "json_schema": {"schema": {"type": "object"}}}]) | _json,
              "stream": st.booleans()},
).map(lambda body: json.dumps(body))
_bad_bodies = st.one_of(
    _json.map(json.dumps), _text,
    st.sampled_from(['{"model": "m", "messages": [], "temperature": NaN}',
                     '{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 1e400}',
                     '{"messages": "not a list"}', "", "null"]),  # nested too deeply: see the xfail below
)
_body_texts = st.integers(0, 9).flatmap(lambda n: _good_bodies if n < 8 else _bad_bodies)
_requests = st.builds(
    InferenceRequest,
    request_id=st.one_of(st.just(REQUEST_ID), _text),
    body_json=_body_texts,
    url=st.sampled_from(["/v1/chat/completions", "/v1/completions"]) | _text,
    batch_id=st.none() | st.sampled_from(["batch-1", "b"]),
    submitted_ms=st.integers(0, 2**40),
    repair=st.none() | st.builds(RepairContext, _text, _text),
    metadata=st.dictionaries(_text, _text, max_size=2),
)


@st.composite
def _values(draw: st.DrawFn, request: InferenceRequest) -> bytes | None:
    kind = draw(st.sampled_from(["request"] * 8 + ["random", "json", "mutated", "other", "none"]))
    match kind:
        case "request":
            return codec.encode(request)
        case "random":
            return draw(st.binary(max_size=80))
        case "json":
            return json.dumps(draw(st.one_of(_json, st.fixed_dictionaries(
                {}, optional={"request_id": _text, "custom_id": _text, "request": _json})))).encode()
        case "mutated":
            framed = bytearray(codec.encode(request))
            index = draw(st.integers(0, len(framed) - 1))
            framed[index] = draw(st.integers(0, 255))
            return bytes(framed[: draw(st.integers(0, len(framed)))])
        case "other":  # another event type on the requests topic
            others: list[InferenceResult | RequestState] = [
                InferenceResult(request.request_id, None, "m", "{}", "ok", 1, 1, 1, "h"),
                RequestState(request.request_id, RequestStatus.SUCCEEDED, "h"),
            ]
            return codec.encode(draw(st.sampled_from(others)))
        case _:
            return draw(st.sampled_from([None, b""]))


_numbers = st.one_of(
    st.integers(-3, 12).map(str), st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["9223372036854775807", "9223372036854775808", "2147483648", "1e3", " 7 ", "0x1f", "1_000",
                     "\u0663", "NaN", ""]),
).map(str.encode)
_header_values = st.one_of(_numbers, st.binary(max_size=12), st.sampled_from([b"1", b"0", b"true", b"llm.requests"]))
_header_names = st.sampled_from([
    headers.ATTEMPT, headers.DUE_TS, headers.FIRST_FAILURE_TS, headers.ORIG_TOPIC, headers.ORIG_PARTITION,
    headers.ORIG_OFFSET, headers.REPLAY, headers.DEFERRED, headers.MAX_TOKENS, headers.RETRY_AFTER_MS,
    headers.REQUEST_ID, headers.ERROR_CODE, "x-unknown",
])
_headers = st.dictionaries(_header_names, _header_values, max_size=8)

_prior_states = st.none() | st.builds(
    RequestState,
    request_id=st.just(REQUEST_ID),
    status=st.sampled_from(list(RequestStatus)),
    input_hash=st.sampled_from(["0" * 32, "other"]),
    attempts=st.integers(1, 8),
    batch_id=st.none() | st.just("batch-1"),
    last_error_code=st.sampled_from([None, CIRCUIT_OPEN, MODEL_PAUSED, "server_error"]),
    source_topic=st.none() | st.sampled_from(TOPICS),
    source_offset=st.none() | st.integers(0, 3),
)

# -- generated answers --------------------------------------------------------------------------------------

_codes = st.one_of(
    st.sampled_from(["rate_limit_exceeded", "server_error", "read_timeout", "invalid_json", "truncated",
                     "schema_mismatch", "empty_content", "context_length_exceeded", "invalid_request_error",
                     "http_502", "retry_budget_exhausted"]),
    _text.filter(bool),
)
_outcomes: st.SearchStrategy[Outcome] = st.one_of(
    st.builds(Success, content=_text, model=_text, prompt_tokens=st.integers(0, 10**6),
              completion_tokens=st.integers(0, 10**6)),
    st.builds(Failure, layer=st.sampled_from(list(FailureLayer)), code=_codes, message=_text,
              http_status=st.none() | st.integers(100, 599), retry_after_ms=st.none() | st.integers(0, 10**15)),
    st.builds(ConfigurationProblem,
              code=st.sampled_from(["invalid_api_key", "insufficient_quota", "not_found", "unexpected_redirect",
                                    *sorted(MODEL_SCOPED_PROBLEMS)]),
              message=_text, http_status=st.none() | st.integers(100, 599)),
)
_completion_bodies = st.one_of(
    st.builds(lambda content, finish: json.dumps({"model": "m", "choices": [{"message": {"content": content},
                                                                             "finish_reason": finish}]}).encode(),
              st.one_of(st.none(), _text, st.just('{"a": 1}'), st.just('{"a": ')),
              st.sampled_from(["stop", "length", "content_filter"])),
    st.binary(max_size=60),
    _json.map(lambda doc: json.dumps(doc).encode()),
)


@st.composite
def _answers(draw: st.DrawFn) -> CallResult | Deferred:
    """What the guarded call comes back with: any outcome, or one the real classifiers gave for a random
    answer, or a deferral."""
    body = draw(_completion_bodies)
    match draw(st.sampled_from(["outcome", "outcome", "http", "completion", "exception", "deferred"])):
        case "outcome":
            outcome = draw(_outcomes)
        case "http":
            outcome = classify_http_error(draw(st.integers(100, 599)), draw(st.dictionaries(
                st.sampled_from(["retry-after", "retry-after-ms"]), st.text(max_size=8), max_size=2)), body)
        case "completion":
            outcome = check_completion(body, {"model": "m", "response_format": {"type": "json_object"}})
        case "exception":
            outcome = classify_exception(draw(st.sampled_from([
                httpx.ReadTimeout("timed out"), httpx.ConnectError("refused"), ValueError("bug"), OSError(5, "io")])))
        case _:
            return Deferred(draw(st.floats(0, 600)), "m", draw(st.sampled_from(sorted(DEFERRAL_CODES))),
                            draw(_text))
    return CallResult(outcome, body, draw(st.integers(0, 60_000)))


@st.composite
def _cases(draw: st.DrawFn) -> Case:
    request = draw(_requests)
    value = draw(_values(request))
    key = draw(st.one_of(st.just(request.request_id.encode()), st.just(request.request_id.encode()),
                         st.none(), st.just(b""), st.binary(max_size=8), st.sampled_from([b"\xff", b"other-id"])))
    record = Record(draw(st.sampled_from(TOPICS)), draw(st.integers(0, 7)), draw(st.integers(0, 5)), key, value,
                    draw(_headers))
    prior = draw(_prior_states)
    if prior is not None and draw(st.booleans()):  # the prior state of this very request, mostly its body's
        same_body = draw(st.integers(0, 3)) > 0
        prior = replace(prior, request_id=request.request_id,
                        input_hash=input_hash(request) if same_body else prior.input_hash)
    budget = draw(st.none() | st.integers(0, 2).map(lambda minimum: RetryBudget(ratio=0, minimum=minimum)))
    return Case(record, draw(_answers()), prior, budget)


# -- the property -------------------------------------------------------------------------------------------


@dataclass
class Handled:
    disposition: Disposition
    sink: EncodingSink
    store: EncodingStore
    guards: ScriptedGuards
    problems: list[ConfigurationProblem]


def _handle(case: Case) -> Handled:
    log: list[str] = []
    sink, store = EncodingSink(log), EncodingStore(log)
    if case.prior is not None:
        store.states[case.prior.request_id] = case.prior
    guards = ScriptedGuards(case.answer, case.budget)
    problems: list[ConfigurationProblem] = []
    handler = Handler(guards, sink, store, Retries(RetryPolicy(), random.Random(7)), problems.append,
                      HandlerOptions(clock_ms=Clock()))
    disposition = asyncio.run(handler.handle(case.record))
    return Handled(disposition, sink, store, guards, problems)


def _outcome_of(handled: Handled) -> str:
    """The one documented outcome the sends add up to, or what they were."""
    sink = handled.sink
    sent = (len(sink.results), len(sink.retries), len(sink.failures), len(sink.dead_letters), len(sink.rekeyed))
    deferred = [retry for retry in sink.retries if retry.headers.get(headers.DEFERRED) == b"1"]
    terminal = [event for event, _ in sink.failures if event.terminal]
    match sent:
        case (1, 0, 0, 0, 0):
            return "result"
        case (0, 1, 1, 0, 0) if not deferred and not terminal:
            return "retry"
        case (0, 1, 0, 0, 0) if deferred:
            return "deferral"
        case (0, 0, 1, 0, 0) if terminal:
            return "terminal failure"
        case (0, 0, 0, 1, 0):
            return "dead letter"
        case (0, 0, 0, 0, 1):
            return "rekeyed"
        case (0, 0, 0, 0, 0):
            return "nothing"
    return f"several: {sink.log}"


@PROPERTY
@given(_cases())
@example(Case(Record("llm.requests", 0, 0, REQUEST_ID.encode(), codec.encode(InferenceRequest(
    REQUEST_ID, json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}))),
    {headers.ATTEMPT: b"9223372036854775808"}), CallResult(Success("ok", "m", 1, 1), b"{}", 1), None))
@example(Case(Record("llm.retry.5s", 0, 0, REQUEST_ID.encode(), codec.encode(InferenceRequest(
    REQUEST_ID, json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}))),
    {headers.ATTEMPT: b"2", headers.FIRST_FAILURE_TS: b"99999999999999999999"}),
    CallResult(Failure(FailureLayer.SERVICE, "server_error", "503"), b"{}", 1), None))
def test_any_record_and_answer_end_in_exactly_one_documented_outcome(case: Case) -> None:
    handled = _handle(case)  # never raises
    outcome = _outcome_of(handled)
    sink, store = handled.sink, handled.store
    if handled.disposition is Disposition.HOLD:
        assert outcome == "nothing", f"held after sending: {sink.log}"
        assert handled.problems and handled.problems[0].code not in MODEL_SCOPED_PROBLEMS, handled.problems
        return
    assert handled.disposition is Disposition.ACK
    assert not handled.problems
    assert outcome in ("result", "retry", "deferral", "terminal failure", "dead letter", "rekeyed", "nothing"), outcome
    codes = [event.error_code for event, _ in sink.failures]
    assert "internal_error" not in codes, [event.message for event, _ in sink.failures]
    hop = headers.read_hop(case.record.headers)
    match outcome:
        case "result":
            state = store.states[sink.results[0].request_id]
            assert state.status is RequestStatus.SUCCEEDED and sink.results[0].attempts == hop.attempt
        case "retry":
            [(event, _)] = sink.failures
            state = store.states[event.request.request_id]
            assert state.status is RequestStatus.RETRYING and state.attempts == hop.attempt == event.attempt
            assert headers.read_hop(sink.retries[0].headers).attempt == hop.attempt + 1
        case "deferral":
            state = store.states[sink.retries[0].request.request_id]
            assert state.status is RequestStatus.RETRYING and state.last_error_code in DEFERRAL_CODES
            assert headers.read_hop(sink.retries[0].headers).attempt == hop.attempt
        case "terminal failure":
            [(event, _)] = sink.failures
            ended = store.states.get(event.request.request_id)
            if event.error_code not in ("conflicting_duplicate", "undecodable_record", "invalid_json_request",
                                        "key_mismatch"):
                assert ended is not None and ended.status is RequestStatus.FAILED, (event, ended)
        case "rekeyed":  # a key that names no id: the record again under its id, nothing else yet
            [copy] = sink.rekeyed
            assert _names_no_id(case.record.key), case.record.key
            assert copy.key and copy.value == case.record.value and handled.guards.calls == 0
            assert headers.read_hop(copy.headers).origin is not None
            assert store.states == ({case.prior.request_id: case.prior} if case.prior else {}), sink.log
        case "dead letter":
            assert sink.dead_letters[0][0] is case.record and not store.states.keys() - (
                {case.prior.request_id} if case.prior else set())
        case "nothing":  # a skip: the state of the id is the one it had
            assert handled.guards.calls == 0
            assert case.prior is not None and list(store.states.values()) == [case.prior], sink.log


def test_a_body_nested_deeper_than_json_follows_is_a_malformed_body() -> None:
    request = InferenceRequest(REQUEST_ID, "[" * 100_000 + "]" * 100_000)
    handled = _handle(Case(Record("llm.requests", 0, 0, REQUEST_ID.encode(), codec.encode(request), {}),
                           CallResult(Success("ok", "m", 1, 1), b"{}", 1), None))
    assert [event.error_code for event, _ in handled.sink.failures] == ["malformed_body"]
