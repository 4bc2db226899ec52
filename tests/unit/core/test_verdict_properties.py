"""Properties of the error-response verdict over generated responses (hypothesis), issue 13 item 3.

Any status code, any headers and any body (random bytes, random JSON, JSON nested deeper than a parser
follows, OpenAI / Anthropic / Azure / vLLM / FastAPI / Ollama shaped error bodies with random field values)
gets exactly one verdict, never an exception: a :class:`Failure` in a known layer, or a
:class:`ConfigurationProblem`, with a code of the closed vocabulary (design §2), a bounded message, the
status it was given, and a retry hint that a ``FailureEvent`` can carry (an Avro long, not negative).

Standard library and hypothesis only: this runs in the bare core virtualenv (scripts/check-core).
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamproc.core.outcome import MAX_MESSAGE_CHARS, ConfigurationProblem, Failure
from streamproc.core.retry_hints import retry_after_ms
from streamproc.core.verdict import classify_embedded_error, classify_http_error
from streamproc.core.vocabulary import FailureLayer

LONG_MAX = 2**63 - 1  # FailureEvent.retry_after_ms is an Avro long

# The closed vocabulary of design §2 (and the verdict's docstring table) for error responses.
FAILURE_CODES = frozenset({
    "request_timeout", "unexpected_status",  # transport
    "rate_limit_exceeded", "overloaded", "server_error", "conflict",  # service
    "context_length_exceeded", "request_too_large", "content_policy_violation", "invalid_request_error",  # business
})
HTTP_CODE = re.compile(r"http_[45]\d\d")  # other 4xx (business) / 5xx (service)
CONFIGURATION_CODES = frozenset({
    "invalid_api_key", "permission_denied", "model_not_found", "not_found", "insufficient_quota",
    "unexpected_redirect",
})

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- generated responses ---------------------------------------------------------------------------------------

_statuses = st.one_of(
    st.sampled_from([200, 301, 302, 400, 401, 402, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504, 529]),
    st.integers(100, 599),
    st.integers(-(2**40), 2**40),
)
_numbers_as_text = st.one_of(
    st.integers(-5, 10**7).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.integers(1, 400).map(lambda n: "9" * n),  # beyond a float: inf
    st.sampled_from(["1e308", "1.7976931348623157e308", "1e400", "-0", "0x10", "1_000", "\u0662", "\u00b2"]),
)
_durations = st.one_of(
    st.tuples(st.integers(0, 10**6), st.sampled_from(["h", "m", "s", "ms", "us", "ns"])).map(lambda p: f"{p[0]}{p[1]}"),
    st.integers(300, 400).map(lambda n: "9" * n + "s"),  # a Go duration overflowing a float
    st.sampled_from(["6m0s", "1h2m3.5s", "0s", "20ms", "1.5s", "ms", "s1", "1x"]),
)
_header_values = st.one_of(
    st.text(max_size=30), _numbers_as_text, _durations,
    st.sampled_from(["Wed, 21 Oct 2026 07:28:00 GMT", "Thu, 01 Jan 1970 00:00:00 GMT", "Fri, 31 Dec 9999 23:59:59 GMT",
                     "not a date", ""]),
)
_header_names = st.one_of(
    st.sampled_from([
        "retry-after", "Retry-After", "retry-after-ms", "date", "Date", "x-ratelimit-reset-requests",
        "x-ratelimit-remaining-requests", "x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens",
        "x-ratelimit-limit-requests", "content-type",
    ]),
    st.text(max_size=12),
)
_headers = st.one_of(
    st.dictionaries(_header_names, _header_values, max_size=6),
    # the reset headers only count when the matching remaining header is 0
    st.tuples(_durations, _durations).map(lambda p: {
        "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": p[0],
        "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": p[1]}),
)

_provider_ids = st.one_of(
    st.sampled_from([
        "rate_limit_exceeded", "rate_limit_error", "slow_down", "overloaded_error", "context_length_exceeded",
        "exceed_context_size_error", "request_too_large", "content_filter", "ResponsibleAIPolicyViolation",
        "insufficient_quota", "billing_error", "invalid_api_key", "authentication_error", "permission_error",
        "model_not_found", "DeploymentNotFound", "not_found_error", "invalid_request_error", "server_error",
        "api_error", "BadRequestError", " 429 ", "", " ",
    ]),
    st.text(max_size=20),
    # digits, some of which int() does not read
    st.text("0123456789\u00b2\u00b3\u00b9\u0662\u0663\u06f5\u2460\uff11 ", min_size=1, max_size=6),
    st.integers(-(2**70), 2**70).map(str),
    st.integers(1, 5000).map(lambda n: "4" * n),  # beyond int()'s digit limit
)
_messages = st.one_of(
    st.text(max_size=80),
    st.sampled_from([
        "This model's maximum context length is 8192 tokens", "prompt is too long", "The model `x` does not exist",
        "You exceeded your current quota", "Rate limit reached. Please try again in 1.5s.", "The server is overloaded",
        "[{'loc': ('body', 'response_format'), 'msg': 'bad'}]", "content management policy", "retry after 20 seconds",
    ]),
    # hints a float cannot hold
    st.integers(300, 400).map(lambda n: f"Please try again in {'9' * n}s."),
    st.integers(300, 308).map(lambda n: f"retry after 1{'0' * n} minutes"),
    st.integers(300, 308).map(lambda n: f"try again in 1{'0' * n}ms"),
)
_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
_field_values = st.one_of(_provider_ids, _messages, _json_values)


@st.composite
def _error_docs(draw: st.DrawFn) -> dict[str, Any]:
    """Error bodies in the shapes providers send, with random values in their fields."""
    fields = {name: draw(_field_values) for name in draw(st.sets(st.sampled_from(
        ["message", "type", "code", "param", "details", "innererror"]), max_size=6))}
    if "details" in fields and draw(st.booleans()):
        fields["details"] = {"error_code": draw(_field_values)}
    if "innererror" in fields and draw(st.booleans()):
        fields["innererror"] = {"code": draw(_field_values)}
    shape = draw(st.sampled_from(["openai", "anthropic", "flat", "fastapi", "ollama", "mixed"]))
    match shape:
        case "openai":
            return {"error": fields}
        case "anthropic":
            return {"type": "error", "error": fields}
        case "flat":  # vLLM
            return {"object": "error", **fields}
        case "fastapi":
            return {"detail": draw(_field_values)}
        case "ollama":
            return {"error": draw(_field_values)}
        case _:
            return {"error": fields, "detail": draw(_field_values), **draw(st.dictionaries(
                st.text(max_size=6), _json_values, max_size=2))}


def _deep(depth: int, kind: str) -> bytes:
    match kind:
        case "list":
            return b"[" * depth + b"]" * depth
        case "error":
            return b'{"error": ' * depth + b'"x"' + b"}" * depth
        case _:
            return b'{"error": {"message": ' * depth + b"1" + b"}}" * depth


_bodies = st.one_of(
    st.binary(max_size=300),
    _error_docs().map(lambda doc: json.dumps(doc).encode()),
    _json_values.map(lambda doc: json.dumps(doc).encode()),
    st.tuples(st.integers(1, 5000), st.sampled_from(["list", "error", "message"])).map(lambda p: _deep(*p)),
    st.sampled_from([b"", b"<html><body>502 Bad Gateway</body></html>", b"null", b"NaN", b"1" * 5000, b"\xff\xfe{"]),
)


def _check(verdict: object, status: int) -> None:
    """Exactly one documented verdict, with a known layer, a vocabulary code and a bounded message."""
    assert isinstance(verdict, Failure) != isinstance(verdict, ConfigurationProblem), verdict
    assert isinstance(verdict, Failure | ConfigurationProblem)
    assert isinstance(verdict.code, str) and verdict.code
    assert isinstance(verdict.message, str) and verdict.message and len(verdict.message) <= MAX_MESSAGE_CHARS
    assert verdict.http_status == status
    if isinstance(verdict, ConfigurationProblem):
        assert verdict.code in CONFIGURATION_CODES, verdict
        return
    assert isinstance(verdict.layer, FailureLayer)
    assert verdict.code in FAILURE_CODES or HTTP_CODE.fullmatch(verdict.code), verdict
    assert verdict.retry_after_ms is None or 0 <= verdict.retry_after_ms <= LONG_MAX, verdict.retry_after_ms


@PROPERTY
@given(_statuses, _headers, _bodies)
@example(500, {}, b'{"error": {"code": "\xc2\xb2", "message": "x"}}')  # a digit int() does not read
@example(500, {}, b"[" * 100_000)  # nested deeper than json follows
@example(503, {"retry-after": "1e308"}, b"")  # seconds a float holds, milliseconds it does not
@example(429, {}, b'{"error": {"message": "Please try again in ' + b"9" * 400 + b's."}}')
def test_every_error_response_gets_exactly_one_bounded_verdict(
        status: int, headers: dict[str, str], body: bytes) -> None:
    verdict = classify_http_error(status, headers, body)
    _check(verdict, status)
    if isinstance(verdict, Failure) and verdict.layer is FailureLayer.BUSINESS:
        assert verdict.code not in ("rate_limit_exceeded", "overloaded", "server_error", "conflict")


@PROPERTY
@given(_error_docs() | st.dictionaries(st.text(max_size=8), _json_values, max_size=4))
@example({"error": {"code": "\u00b2"}})
@example({"error": {"code": "4" * 5000}})
def test_an_error_envelope_in_a_200_gets_exactly_one_verdict(doc: dict[str, Any]) -> None:
    _check(classify_embedded_error(doc), 200)


@PROPERTY
@given(_headers, _messages)
@example({"retry-after": "1e308"}, "")
@example({"retry-after-ms": "1e308"}, "")
@example({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "9" * 400 + "s"}, "")
def test_retry_hints_are_never_negative_fit_a_long_and_never_raise(headers: dict[str, str], message: str) -> None:
    hint = retry_after_ms(headers, message)
    assert hint is None or 0 <= hint <= LONG_MAX
