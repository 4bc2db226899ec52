"""Properties of how an LLM answer is judged, over generated answers (hypothesis), issue 13 item 3.

* ``LLMClient.call``, the function that turns what came back (status, headers, body bytes) into an outcome,
  never raises and gives exactly one of Success / Failure (known layer, non-empty code) / ConfigurationProblem,
  whatever the status, the headers (any bytes, a lying content-encoding) and the body (random bytes, random
  JSON, JSON nested deeper than a parser follows, OpenAI-shaped completions and error bodies).
* ``check_completion`` never raises for any JSON answer and any request body, including arbitrary and
  unresolvable JSON Schemas, and never reaches for the network to resolve one (a ``$ref`` to a URL).
* ``classify_exception`` is total: any exception, any cause chain (cycles included) is a transport failure.
* ``request_body`` gives a JSON object httpx can write, or a ValueError (the handler's ``malformed_body``):
  never NaN, Infinity or a number that overflows a float, which httpx refuses (a transport error, retried).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import ssl
from typing import Any, NoReturn, Self
from unittest import mock

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamproc.core.events import InferenceRequest, RepairContext
from streamproc.core.outcome import MAX_MESSAGE_CHARS, ConfigurationProblem, Failure, Outcome, Success
from streamproc.core.vocabulary import FailureLayer
from streamproc.llm.client import LLMClient, request_body
from streamproc.llm.completion import check_completion
from streamproc.llm.transport_errors import classify_exception
from streamproc.settings import Settings

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(outcome: Outcome) -> None:
    """Exactly one of the three outcomes, each well-formed."""
    assert sum(isinstance(outcome, kind) for kind in (Success, Failure, ConfigurationProblem)) == 1, outcome
    if isinstance(outcome, Success):
        assert isinstance(outcome.content, str) and outcome.content.strip()
        assert isinstance(outcome.model, str)
        assert isinstance(outcome.prompt_tokens, int) and isinstance(outcome.completion_tokens, int)
        return
    assert isinstance(outcome.code, str) and outcome.code
    assert isinstance(outcome.message, str) and len(outcome.message) <= MAX_MESSAGE_CHARS
    if isinstance(outcome, Failure):
        assert isinstance(outcome.layer, FailureLayer)
        assert outcome.retry_after_ms is None or outcome.retry_after_ms >= 0


# -- generated JSON, schemas and answers ----------------------------------------------------------------------

_text = st.text(max_size=30)
_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), _text)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=10,
)

_SCHEMA_KEYWORDS = [
    "type", "properties", "required", "items", "prefixItems", "additionalProperties", "enum", "const", "minimum",
    "maximum", "multipleOf", "minLength", "maxLength", "pattern", "format", "anyOf", "oneOf", "allOf", "not",
    "if", "then", "else", "$defs", "definitions", "$ref", "$schema", "$id", "$anchor", "$dynamicRef",
    "$recursiveRef", "dependentSchemas", "uniqueItems", "minItems", "contains", "propertyNames",
]
_refs = st.sampled_from([
    "#", "#/$defs/a", "#/definitions/missing", "#/properties/a", "#/items/0", "urn:nowhere", "other.json",
    "http://schemas.example.invalid/s.json", "https://json-schema.org/draft/2020-12/schema", "#a", "#/%ZZ",
])
_schema_values = st.one_of(
    _json,
    _refs,
    st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null", "banana",
                     ["string", "null"], "(", "^[a-z]+$", "email", "date-time", 1e-320, 0, -1,
                     "http://json-schema.org/draft-04/schema#", "https://json-schema.org/draft/2020-12/schema"]),
)
_schemas = st.recursive(
    st.dictionaries(st.sampled_from(_SCHEMA_KEYWORDS), _schema_values, max_size=4) | st.booleans(),
    lambda inner: st.dictionaries(
        st.sampled_from(_SCHEMA_KEYWORDS),
        st.one_of(inner, _schema_values, st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
        max_size=5),
    max_leaves=12,
)
_response_formats = st.one_of(
    st.none(),
    _json,
    st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "json_schema"}]),
    st.builds(lambda schema: {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": schema}},
              _schemas),
    st.builds(lambda spec: {"type": "json_schema", "json_schema": spec}, _json),
)


@st.composite
def _request_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": draw(st.one_of(_text, _json)),
                            "messages": [{"role": "user", "content": "hi"}]}
    response_format = draw(_response_formats)
    if response_format is not None:
        body["response_format"] = response_format
    return body


_contents = st.one_of(
    st.none(), _text, _json, _json.map(json.dumps),
    st.sampled_from(['{"a": 1}', '{"a": ', '{"a": "x', "[1, 2]", "{}", "  ", '"(("', "1e400", "1" * 5000]),
    st.integers(1, 3000).map(lambda depth: "[" * depth + "]" * depth),
)


@st.composite
def _completions(draw: st.DrawFn) -> Any:
    """OpenAI-shaped chat completions, any field of which may be missing or of another type."""
    message: dict[str, Any] = {"role": "assistant", "content": draw(_contents)}
    if draw(st.booleans()):
        message["refusal"] = draw(st.one_of(st.none(), _text, _json))
    choice: dict[str, Any] = {"index": 0, "message": draw(st.one_of(st.just(message), _json)),
                              "finish_reason": draw(st.one_of(st.sampled_from(
                                  ["stop", "length", "content_filter", "tool_calls", None]), _json))}
    doc: dict[str, Any] = {
        "id": "chatcmpl-1", "object": "chat.completion",
        "choices": draw(st.one_of(st.just([choice]), st.lists(_json, max_size=2), _json)),
    }
    if draw(st.booleans()):
        doc["model"] = draw(st.one_of(_text, _json))
    if draw(st.booleans()):
        doc["usage"] = draw(st.one_of(
            st.fixed_dictionaries({"prompt_tokens": st.integers(), "completion_tokens": st.integers()}), _json))
    if draw(st.booleans()):
        doc["error"] = draw(st.one_of(_json, st.fixed_dictionaries(
            {"code": st.one_of(_text, _json), "message": st.one_of(_text, _json)})))
    return draw(st.one_of(st.just(doc), _json))


def _deep(depth: int) -> bytes:
    return b'{"choices": [' * depth + b"]}" * depth


_answers = st.one_of(
    _completions().map(lambda doc: json.dumps(doc).encode()),
    st.binary(max_size=200),
    st.integers(1, 5000).map(_deep),
    st.sampled_from([b"", b"null", b"[]", b"data: {\"choices\": []}\n\n", b"\xef\xbb\xbf{}", b"NaN"]),
)


class _NoNetwork:
    """Records any name lookup or connection attempt (refusing it), so a test can assert none was made."""

    def __init__(self) -> None:
        self.attempts: list[object] = []
        self._patches = [mock.patch.object(socket, "getaddrinfo", self._refuse),
                         mock.patch.object(socket.socket, "connect", self._refuse)]

    def _refuse(self, *args: object) -> NoReturn:
        self.attempts.append(args[0])
        raise ConnectionRefusedError("no network here")

    def __enter__(self) -> Self:
        for patch in self._patches:
            patch.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for patch in reversed(self._patches):
            patch.stop()


@PROPERTY
@given(_answers, _request_bodies())
@example(b'{"choices": [{"message": {"content": "{\\"a\\": 1}"}}]}',
         {"model": "m", "response_format": {"type": "json_schema", "json_schema": {"schema": {"$schema": ["x"]}}}})
@example(b'{"choices": [{"message": {"content": "{\\"a\\": 1}"}}]}',
         {"model": "m", "response_format": {"type": "json_schema", "json_schema": {"schema": {"$schema": 5}}}})
@example(b'{"choices": [{"message": {"content": "{\\"a\\": 1}"}}]}',
         {"model": "m", "response_format": {"type": "json_schema", "json_schema": {"schema": {
             "properties": {"a": {"$ref": "http://schemas.example.invalid/s.json"}}}}}})
def test_any_answer_checked_against_any_request_gives_one_outcome_without_the_network(
        answer: bytes, body: dict[str, Any]) -> None:
    with _NoNetwork() as network:
        outcome = check_completion(answer, body)
    _check(outcome)
    assert not isinstance(outcome, ConfigurationProblem) or b'"error"' in answer  # only an error envelope stops
    assert network.attempts == [], f"checking a completion opened connections to {network.attempts}"
    if isinstance(outcome, Success):
        fmt = body.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
            json.loads(outcome.content)  # asked for JSON, answered JSON


# -- the whole answer: status, headers and body, through the client -------------------------------------------

_header_names = st.one_of(
    st.sampled_from(["retry-after", "retry-after-ms", "date", "x-ratelimit-reset-requests", "content-type",
                     "x-ratelimit-remaining-requests", "x-ratelimit-limit-requests", "content-encoding",
                     "content-length", "transfer-encoding"]),
    st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12),
)
_header_values = st.one_of(
    st.binary(max_size=30).map(lambda raw: raw.replace(b"\r", b"").replace(b"\n", b"")),
    st.sampled_from([b"gzip", b"br", b"deflate", b"identity", b"chunked", b"1e308", b"0", b"-1", b"6m0s",
                     b"Wed, 21 Oct 2026 07:28:00 GMT"]),
)
_error_bodies = st.fixed_dictionaries(
    {"error": st.fixed_dictionaries({}, optional={
        "message": st.one_of(_text, _json), "type": st.one_of(_text, _json), "code": st.one_of(_text, _json),
        "param": _json})}).map(lambda doc: json.dumps(doc).encode())


class _Scripted:
    """The one answer the mock transport gives next."""

    status = 200
    headers: list[tuple[bytes, bytes]] = []  # noqa: RUF012 - replaced, never mutated
    body = b""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(self.status, headers=self.headers, content=self.body)


_SCRIPTED = _Scripted()
_CLIENT: LLMClient | None = None


def _client() -> LLMClient:
    global _CLIENT
    if _CLIENT is None:  # one client for every example: building one loads a TLS context
        _CLIENT = LLMClient(Settings(llm_base_url="http://llm.test/v1", llm_timeout_s=30).llm_endpoint,
                            connections=256, hedge_ratio=0.03, transport=httpx.MockTransport(_SCRIPTED))
    return _CLIENT


@PROPERTY
@given(st.one_of(st.sampled_from([200, 200, 301, 400, 401, 403, 404, 408, 429, 500, 503, 529]), st.integers(100, 999)),
       st.lists(st.tuples(_header_names.map(str.encode), _header_values), max_size=5),
       st.one_of(_answers, _error_bodies), _request_bodies())
@example(500, [], b"[" * 100_000, {"model": "m"})
@example(200, [(b"content-encoding", b"gzip")], b"not gzip", {"model": "m"})
def test_any_status_headers_and_body_give_one_outcome_through_the_client(
        status: int, headers: list[tuple[bytes, bytes]], body: bytes, request_body: dict[str, Any]) -> None:
    _SCRIPTED.status, _SCRIPTED.headers, _SCRIPTED.body = status, headers, body
    with _NoNetwork() as network:
        called = asyncio.run(_client().call(InferenceRequest("r-1", "{}"), request_body))
    assert network.attempts == [], f"judging an answer opened connections to {network.attempts}"
    _check(called.outcome)
    if status != 200:
        assert not isinstance(called.outcome, Success)


# -- exceptions --------------------------------------------------------------------------------------------------

_EXCEPTION_TYPES: list[type[BaseException]] = [
    httpx.ConnectTimeout, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout, httpx.ConnectError,
    httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.LocalProtocolError, httpx.ProxyError,
    httpx.UnsupportedProtocol, httpx.DecodingError, httpx.TooManyRedirects, httpx.CloseError,
    TimeoutError, ConnectionRefusedError, ConnectionResetError, BrokenPipeError, OSError, ssl.SSLError,
    socket.gaierror, ValueError, KeyError, RuntimeError, asyncio.CancelledError, MemoryError, RecursionError,
]


@st.composite
def _exceptions(draw: st.DrawFn) -> BaseException:
    """An exception of any kind with any message, wrapping a chain of others (which may loop back)."""
    chain = [draw(st.sampled_from(_EXCEPTION_TYPES))(draw(st.text(max_size=2000)))
             for _ in range(draw(st.integers(1, 4)))]
    for outer, inner in itertools.pairwise(chain):
        if draw(st.booleans()):
            outer.__cause__ = inner
        else:
            outer.__context__ = inner
    if len(chain) > 1 and draw(st.booleans()):
        chain[-1].__context__ = chain[0]  # a cycle
    return chain[0]


@PROPERTY
@given(_exceptions())
def test_any_exception_is_a_transport_failure(exc: BaseException) -> None:
    failure = classify_exception(exc)
    _check(failure)
    assert failure.layer is FailureLayer.TRANSPORT and failure.http_status is None


# -- the body sent: what the handler asks for is what httpx can write ---------------------------------------------

_body_texts = st.one_of(
    _json.map(json.dumps),
    st.builds(lambda body: json.dumps(body), st.fixed_dictionaries({"model": _text, "messages": _json})),
    st.sampled_from(['{"model": "m", "temperature": NaN}', '{"model": "m", "temperature": Infinity}',
                     '{"model": "m", "temperature": -1e400}', '{"model": "m", "n": 1e308}', "[]", "", "{",
                     "[" * 5000 + "]" * 5000]),
    st.text(max_size=30),
)


@PROPERTY
@given(_body_texts, st.none() | st.builds(RepairContext, _text, _text))
@example('{"model": "m", "messages": [], "temperature": 1e400}', None)
def test_a_request_body_is_a_json_object_httpx_can_send_or_a_value_error(
        body_json: str, repair: RepairContext | None) -> None:
    request = InferenceRequest("r-1", body_json, repair=repair)
    try:
        body = request_body(request)
    except ValueError:  # the handler's malformed_body: a business failure, no call
        return
    assert isinstance(body, dict)
    json.dumps(body, allow_nan=False)  # as httpx writes a json= body: an error here would be a transport retry
