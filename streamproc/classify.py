"""Failure classification: each LLM call outcome becomes a result, a layered failure or a setup problem.

The layer decides the retry policy, the failure topic and what backfill does (DESIGN §2), so classification
must be total and predictable. Codes are a closed vocabulary (OpenAI's names where they exist, ours
otherwise) so that backfill filters like ``--error-code rate_limit_exceeded`` work across providers; the
provider's own identifier is kept in ``message`` (``"HTTP 429 slow_down: ..."``).

Precedence for error responses: a *specific* structured identifier decides first (``error.code``, then
Anthropic's ``error.details.error_code``, Azure's ``error.innererror.code``, then ``error.type``);
otherwise the HTTP status decides, and the message text refines it where providers disagree on codes (an
Anthropic 400 ``invalid_request_error`` saying "prompt is too long" is ``context_length_exceeded``).
Generic identifiers (``invalid_request_error``, ``server_error``, vLLM's ``BadRequestError``, numeric codes)
say no more than the status and never decide.

=================================================  =============  ============================
outcome                                            layer          code
=================================================  =============  ============================
httpx ConnectTimeout / ReadTimeout                 transport      connect_timeout / read_timeout
httpx WriteTimeout / PoolTimeout                   transport      write_timeout / pool_timeout
other timeout (httpx, ``TimeoutError``)            transport      timeout
TLS / certificate error (``ssl.SSLError``)         transport      tls_error
DNS failure (``socket.gaierror``)                  transport      dns_error
connection refused                                 transport      connection_refused
other connect error                                transport      connect_error
read/write error, connection reset, broken pipe    transport      connection_reset
server closed mid-response (RemoteProtocolError)   transport      server_disconnected
other protocol error                               transport      protocol_error
proxy / unsupported scheme / redirect loop         transport      proxy_error / unsupported_protocol /
                                                                  too_many_redirects
any other transport error                          transport      transport_error
any other exception (a bug: retried, explained)    transport      unexpected_error
200 body cut off / not JSON / undecodable          transport      invalid_response_body
200 JSON without ``choices[0].message``            transport      missing_choices
408                                                transport      request_timeout
1xx / 2xx reaching the error path                  transport      unexpected_status
429 ``rate_limit_exceeded`` / ``rate_limit_error``
/ ``slow_down`` (or any 429 not about quota)       service        rate_limit_exceeded
529, ``overloaded_error``, ``server_is_overloaded``,
5xx saying "overloaded" / "over capacity"          service        overloaded
5xx with type ``server_error`` / ``api_error``     service        server_error
other 5xx                                          service        http_<status> (http_500, http_502, ...)
409                                                service        conflict
200 with empty / whitespace content                semantic       empty_content
``finish_reason == "length"``                      semantic       truncated
not JSON (or not an object for ``json_object``)
when ``response_format`` asks for JSON             semantic       invalid_json
JSON Schema not satisfied                          semantic       schema_mismatch
``context_length_exceeded``,
``exceed_context_size_error`` (llama.cpp), or
4xx/5xx text "maximum context length", "prompt is
too long", ...                                     business       context_length_exceeded
413, ``request_too_large``                         business       request_too_large
``content_policy_violation``, ``content_filter``,
``ResponsibleAIPolicyViolation``, policy text,
``finish_reason == "content_filter"``              business       content_policy_violation
``message.refusal`` set (structured outputs)       business       refusal
the response's own JSON Schema is invalid          business       invalid_json_schema
other 400 / 422                                    business       invalid_request_error
other 4xx                                          business       http_<status>
=================================================  =============  ============================

Not a layer (:class:`ConfigurationProblem`: stop consuming and alert, never a failure record):
401 / ``invalid_api_key`` / ``authentication_error`` → ``invalid_api_key``; 403 / ``permission_error`` →
``permission_denied``; 404 → ``model_not_found`` (``not_found`` when the text does not name a model or
deployment: a wrong base URL fails every request alike); 429 or 402 about quota, billing or credit
(``insufficient_quota``, ``credit_balance_exhausted``, ``*_spend_limit_exceeded``, Anthropic
``billing_error`` / ``enforced_spend_limit_reached``) → ``insufficient_quota``; 3xx → ``unexpected_redirect``.

Codes emitted outside this module: ``conflicting_duplicate`` (:mod:`streamproc.state`) and the worker's own
business codes for records rejected before any call (undecodable records, malformed bodies, inputs over the
model's window).

A 200 whose body is an error envelope (``{"error": {...}}`` without ``choices``, as some gateways send) is
classified like an error response with the status found in the body (502 when there is none).

Retry hints (:func:`retry_after_ms`): the first one present wins, most explicit first: ``retry-after-ms``,
``retry-after`` (seconds, or an HTTP date relative to the response's ``Date`` header; without ``Date`` a
date is ignored, to stay clock-free), "try again in 1.5s" / "retry after 20 seconds" in the message, and
last ``x-ratelimit-reset-requests`` / ``-tokens`` (Go durations like ``6m0s``), counted only when the
matching ``x-ratelimit-remaining-*`` is ``0``: OpenAI sends reset headers on every response, and on a 500
the time until the token bucket is full again is no reason to wait. Hints are rounded up to whole ms.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import socket
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

import httpx
from jsonschema import exceptions as jsonschema_exceptions
from jsonschema import validators as jsonschema_validators

from streamproc.layers import FailureLayer

_MAX_MESSAGE_CHARS: Final = 1000


@dataclass(frozen=True)
class Failure:
    """A failed attempt, in a layer: what the retry policy and the failure topics work with."""

    layer: FailureLayer
    code: str
    message: str
    http_status: int | None = None
    retry_after_ms: int | None = None


@dataclass(frozen=True)
class ConfigurationProblem:
    """An account or setup error that fails every request alike: stop consuming, never burn the batch."""

    code: str
    message: str
    http_status: int | None


@dataclass(frozen=True)
class Success:
    """A completion that passed every semantic check."""

    content: str
    model: str
    prompt_tokens: int
    completion_tokens: int


Outcome = Success | Failure | ConfigurationProblem

# (layer, code); layer None means a ConfigurationProblem.
_Verdict = tuple[FailureLayer | None, str]

_T, _S, _B = FailureLayer.TRANSPORT, FailureLayer.SERVICE, FailureLayer.BUSINESS
_QUOTA: Final[_Verdict] = (None, "insufficient_quota")

# Provider identifiers specific enough to decide on their own, lower-cased.
_BY_PROVIDER_CODE: Final[Mapping[str, _Verdict]] = {
    "rate_limit_exceeded": (_S, "rate_limit_exceeded"),
    "rate_limit_error": (_S, "rate_limit_exceeded"),
    "slow_down": (_S, "rate_limit_exceeded"),
    "overloaded_error": (_S, "overloaded"),
    "server_is_overloaded": (_S, "overloaded"),
    "context_length_exceeded": (_B, "context_length_exceeded"),
    "exceed_context_size_error": (_B, "context_length_exceeded"),
    "request_too_large": (_B, "request_too_large"),
    "content_policy_violation": (_B, "content_policy_violation"),
    "content_filter": (_B, "content_policy_violation"),
    "responsibleaipolicyviolation": (_B, "content_policy_violation"),
    "insufficient_quota": _QUOTA,
    "credit_balance_exhausted": _QUOTA,
    "organization_spend_limit_exceeded": _QUOTA,
    "project_spend_limit_exceeded": _QUOTA,
    "organization_usage_limit_exceeded": _QUOTA,
    "billing_hard_limit_reached": _QUOTA,
    "billing_not_active": _QUOTA,
    "billing_error": _QUOTA,
    "enforced_spend_limit_reached": _QUOTA,
    "invalid_api_key": (None, "invalid_api_key"),
    "authentication_error": (None, "invalid_api_key"),
    "permission_error": (None, "permission_denied"),
    "permission_denied": (None, "permission_denied"),
    "unsupported_country_region_territory": (None, "permission_denied"),
    "model_not_found": (None, "model_not_found"),
    "deploymentnotfound": (None, "model_not_found"),
    "not_found_error": (None, "model_not_found"),
}
_SERVER_ERROR_TYPES: Final = frozenset({"server_error", "api_error", "internal_server_error", "internalservererror"})

_CONTEXT_TEXT: Final = re.compile(
    r"context[ _]length|context window|maximum context|context size|prompt is too long|input is too long"
    r"|too many tokens|reduce the length of the (?:messages|prompt)",
    re.IGNORECASE,
)
_POLICY_TEXT: Final = re.compile(r"content[ _](?:management[ _])?polic|content[ _]filter|safety system", re.I)
_QUOTA_TEXT: Final = re.compile(r"quota|billing|credit balance|spend(?:ing)? limit", re.IGNORECASE)
_OVERLOADED_TEXT: Final = re.compile(r"overloaded|over capacity", re.IGNORECASE)
_MODEL_MISSING_TEXT: Final = re.compile(
    r"\b(?:model|deployment)\b.{0,120}?(?:not found|does not exist|doesn't exist|not exist)"
    r"|unknown model|no such model",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class _ErrorInfo:
    """What an error body says, whatever the provider's shape."""

    ids: tuple[str, ...]  # provider identifiers, most specific first, lower-cased, never numeric
    text: str  # the provider's message, or an excerpt of a body that is not JSON
    status: int | None  # an HTTP status written in the body (vLLM ``"code": 400``, gateways)


def classify_http_error(status: int, headers: Mapping[str, str], body: bytes) -> Failure | ConfigurationProblem:
    """Classify a non-2xx response: OpenAI, Anthropic, Azure, vLLM, Ollama, llama.cpp or HTML gateway body."""
    try:
        doc: Any = json.loads(body)
    except ValueError:
        doc = None
    info = _error_info(doc) if isinstance(doc, dict) else _ErrorInfo((), _excerpt(body), None)
    return _build(status, info, headers, status)


def _build(
    status: int, info: _ErrorInfo, headers: Mapping[str, str], reported_status: int, prefix: str = ""
) -> Failure | ConfigurationProblem:
    layer, code = _verdict(status, info)
    detail = " ".join(part for part in (f"HTTP {status}", info.ids[0] if info.ids else "") if part)
    message = _truncate(f"{prefix}{detail}: {info.text}" if info.text else f"{prefix}{detail}")
    if layer is None:
        return ConfigurationProblem(code, message, reported_status)
    return Failure(layer, code, message, reported_status, retry_after_ms(headers, info.text))


def _verdict(status: int, info: _ErrorInfo) -> _Verdict:
    for provider_id in info.ids:
        if provider_id in _BY_PROVIDER_CODE:
            return _BY_PROVIDER_CODE[provider_id]
    text = info.text
    match status:
        case 401:
            return None, "invalid_api_key"
        case 402:
            return _QUOTA
        case 403:
            return None, "permission_denied"
        case 404:
            return None, "model_not_found" if _MODEL_MISSING_TEXT.search(text) else "not_found"
        case 408:
            return _T, "request_timeout"
        case 409:
            return _S, "conflict"
        case 413:
            return _B, "request_too_large"
        case 429:
            return _QUOTA if _QUOTA_TEXT.search(text) else (_S, "rate_limit_exceeded")
        case 529:
            return _S, "overloaded"
    if 300 <= status < 400:
        return None, "unexpected_redirect"
    if not 400 <= status < 600:
        return _T, "unexpected_status"
    if _CONTEXT_TEXT.search(text):
        return _B, "context_length_exceeded"
    if _POLICY_TEXT.search(text):
        return _B, "content_policy_violation"
    if status >= 500:
        if _OVERLOADED_TEXT.search(text):
            return _S, "overloaded"
        return _S, "server_error" if _SERVER_ERROR_TYPES.intersection(info.ids) else f"http_{status}"
    if _MODEL_MISSING_TEXT.search(text):
        return None, "model_not_found"
    return _B, "invalid_request_error" if status in (400, 422) else f"http_{status}"


def _error_info(doc: dict[str, Any]) -> _ErrorInfo:
    error = doc.get("error")
    if isinstance(error, str):  # Ollama: {"error": "model 'x' not found"}
        return _ErrorInfo((), error, None)
    fields: dict[str, Any] = error if isinstance(error, dict) else doc  # else vLLM's flat shape
    candidates = (
        fields.get("code"),
        _nested(fields, "details", "error_code"),
        _nested(fields, "innererror", "code"),
        fields.get("type"),
    )
    ids = tuple(c.strip().lower() for c in candidates if isinstance(c, str) and c.strip() and not c.strip().isdigit())
    text = fields.get("message")
    if not isinstance(text, str):
        detail = doc.get("detail")  # FastAPI / pydantic validation errors
        text = detail if isinstance(detail, str) else _truncate(json.dumps(doc), 300)
    return _ErrorInfo(tuple(dict.fromkeys(ids)), text, _int_status(fields.get("code")))


def _nested(fields: dict[str, Any], outer: str, inner: str) -> Any:
    value = fields.get(outer)
    return value.get(inner) if isinstance(value, dict) else None


def _int_status(code: Any) -> int | None:
    if isinstance(code, bool):
        return None
    if isinstance(code, int):
        return code
    if isinstance(code, str) and code.strip().isdigit():
        return int(code)
    return None


def check_completion(body: bytes, request_body: Mapping[str, Any]) -> Outcome:
    """Check a 200 chat-completion body against what the request asked for (DESIGN §2, L1 and L3 rows)."""
    try:
        doc: Any = json.loads(body)
    except ValueError as exc:
        return _transport("invalid_response_body", f"200 body is not JSON ({exc}): {_excerpt(body)}")
    if not isinstance(doc, dict):
        return _transport("invalid_response_body", f"200 body is not a JSON object: {_excerpt(body)}")
    if doc.get("error") is not None and not doc.get("choices"):
        info = _error_info(doc)
        embedded = info.status if info.status is not None and 400 <= info.status < 600 else 502
        return _build(embedded, info, {}, 200, prefix="200 body carries an error, taken as ")

    choices = doc.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or not isinstance(message, dict):
        return _transport("missing_choices", f"200 body has no choices[0].message: {_excerpt(body)}")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return _transport("invalid_response_body", f"message.content is {type(content).__name__}, not text")

    finish_reason = choice.get("finish_reason")
    refusal = message.get("refusal")
    if finish_reason == "content_filter":
        return _failure(_B, "content_policy_violation", "the provider's content filter stopped the answer")
    if isinstance(refusal, str) and refusal.strip():
        return _failure(_B, "refusal", f"the model refused: {refusal}")
    if finish_reason == "length":
        tokens = _usage(doc).get("completion_tokens")
        spent = f" after {tokens} completion tokens" if tokens is not None else ""
        return _failure(FailureLayer.SEMANTIC, "truncated", f"finish_reason=length: the answer was cut off{spent}")
    if content is None or not content.strip():
        return _failure(FailureLayer.SEMANTIC, "empty_content", "the answer has no content")

    problem = _check_format(content, request_body.get("response_format"))
    if problem is not None:
        return problem
    model = doc.get("model")
    if not isinstance(model, str):
        requested = request_body.get("model")
        model = requested if isinstance(requested, str) else ""
    usage = _usage(doc)
    return Success(content, model, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0))


def _check_format(content: str, response_format: Any) -> Failure | None:
    fmt = response_format if isinstance(response_format, dict) else {}
    kind = fmt.get("type")
    if kind not in ("json_object", "json_schema"):
        return None
    try:
        value: Any = json.loads(content)
    except ValueError as exc:
        return _failure(FailureLayer.SEMANTIC, "invalid_json", f"the answer is not JSON: {exc}")
    if kind == "json_object" and not isinstance(value, dict):
        return _failure(FailureLayer.SEMANTIC, "invalid_json", f"expected a JSON object, got {type(value).__name__}")
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if kind != "json_schema" or not isinstance(schema, dict):
        return None
    try:
        validator = _validator(json.dumps(schema, sort_keys=True, separators=(",", ":")))
    except jsonschema_exceptions.SchemaError as exc:
        return _failure(_B, "invalid_json_schema", f"response_format.json_schema.schema is invalid: {exc.message}")
    error = jsonschema_exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    return _failure(FailureLayer.SEMANTIC, "schema_mismatch", f"{error.message} (at {error.json_path})")


@lru_cache(maxsize=256)
def _validator(canonical_schema: str) -> Any:
    """Compile once per distinct schema: a batch usually shares one schema across all its requests."""
    schema = json.loads(canonical_schema)
    validator_class = jsonschema_validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def _usage(doc: dict[str, Any]) -> dict[str, int]:
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        return {}
    return {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}


def _transport(code: str, message: str) -> Failure:
    return Failure(_T, code, _truncate(message), 200)


def _failure(layer: FailureLayer, code: str, message: str) -> Failure:
    return Failure(layer, code, _truncate(message), 200)


def classify_exception(exc: BaseException) -> Failure:
    """Classify an exception raised while calling the LLM; always transport (nothing came back to judge)."""
    text = str(exc)
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return Failure(_T, _exception_code(exc), _truncate(message))


def _exception_code(exc: BaseException) -> str:
    timeouts: tuple[tuple[type[BaseException], str], ...] = (
        (httpx.ConnectTimeout, "connect_timeout"),
        (httpx.ReadTimeout, "read_timeout"),
        (httpx.WriteTimeout, "write_timeout"),
        (httpx.PoolTimeout, "pool_timeout"),
        (httpx.TimeoutException, "timeout"),
        (TimeoutError, "timeout"),
    )
    for exc_type, code in timeouts:
        if isinstance(exc, exc_type):
            return code
    chain = list(_causes(exc))
    if any(isinstance(e, ssl.SSLError) for e in chain):
        return "tls_error"
    if isinstance(exc, httpx.ConnectError):
        if any(isinstance(e, socket.gaierror) for e in chain):
            return "dns_error"
        if any(isinstance(e, ConnectionRefusedError) for e in chain):
            return "connection_refused"
        return "connect_error"
    if isinstance(exc, httpx.RemoteProtocolError):
        lowered = str(exc).lower()
        return "server_disconnected" if "disconnected" in lowered or "closed" in lowered else "protocol_error"
    by_type: tuple[tuple[type[BaseException], str], ...] = (
        (httpx.ProtocolError, "protocol_error"),
        (httpx.NetworkError, "connection_reset"),
        (ConnectionError, "connection_reset"),
        (httpx.ProxyError, "proxy_error"),
        (httpx.UnsupportedProtocol, "unsupported_protocol"),
        (httpx.DecodingError, "invalid_response_body"),
        (httpx.TooManyRedirects, "too_many_redirects"),
        (httpx.TransportError, "transport_error"),
        (OSError, "transport_error"),
    )
    for exc_type, code in by_type:
        if isinstance(exc, exc_type):
            return code
    return "unexpected_error"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it wraps: httpx → httpcore → the OS error that says DNS, refused or TLS."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


_GO_UNITS: Final = "ms|us|\u00b5s|ns|h|m|s"  # alternation order matters: "ms" before "m" and "s"
_GO_DURATION: Final = re.compile(rf"(\d+(?:\.\d+)?)({_GO_UNITS})")
_UNIT_MS: Final[Mapping[str, float]] = {
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
    "ms": 1,
    "us": 1e-3,
    "\u00b5s": 1e-3,
    "ns": 1e-6,
}
_WORD_UNIT_MS: Final[Mapping[str, float]] = {
    "millisecond": 1,
    "milliseconds": 1,
    "second": 1_000,
    "seconds": 1_000,
    "sec": 1_000,
    "secs": 1_000,
    "minute": 60_000,
    "minutes": 60_000,
    "min": 60_000,
    "mins": 60_000,
}
_HINT_TEXT: Final = re.compile(
    rf"(?:try again|retry)\s+(?:in|after)\s+"
    rf"(?P<duration>\d+(?:\.\d+)?(?:(?:{_GO_UNITS})(?:\d+(?:\.\d+)?(?:{_GO_UNITS}))*)?)"
    r"(?:\s*(?P<word>milliseconds?|seconds?|secs?|minutes?|mins?)\b)?",
    re.IGNORECASE,
)


def retry_after_ms(headers: Mapping[str, str], message: str = "") -> int | None:
    """The server's "not before" hint in ms, or None; the first present wins (see the module docstring)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    explicit = _float(lowered.get("retry-after-ms"))
    if explicit is not None:
        return _ceil_ms(explicit)
    retry_after = lowered.get("retry-after")
    if retry_after is not None:
        seconds = _float(retry_after)
        if seconds is not None:
            return _ceil_ms(seconds * 1000)
        dated = _http_date_delta_ms(retry_after, lowered.get("date"))
        if dated is not None:
            return dated
    from_text = _hint_from_text(message)
    if from_text is not None:
        return from_text
    resets = [
        parse_duration_ms(reset)
        for limit in ("requests", "tokens")
        if (reset := lowered.get(f"x-ratelimit-reset-{limit}")) is not None
        and lowered.get(f"x-ratelimit-remaining-{limit}", "").strip() == "0"
    ]
    known = [r for r in resets if r is not None]
    return max(known) if known else None


def parse_duration_ms(text: str) -> int | None:
    """Parse ``1s``, ``6m0s``, ``20ms``, ``1.5s``, ``1h2m3s`` (Go durations) or bare seconds; else None."""
    text = text.strip()
    seconds = _float(text)
    if seconds is not None:
        return _ceil_ms(seconds * 1000)
    total, end = 0.0, 0
    for match in _GO_DURATION.finditer(text):
        if match.start() != end:
            return None
        total += float(match.group(1)) * _UNIT_MS[match.group(2)]
        end = match.end()
    return _ceil_ms(total) if end and end == len(text) else None


def _hint_from_text(message: str) -> int | None:
    match = _HINT_TEXT.search(message)
    if match is None:
        return None
    word = match.group("word")
    duration = match.group("duration")
    if word is not None and _float(duration) is not None:
        return _ceil_ms(float(duration) * _WORD_UNIT_MS[word.lower()])
    return parse_duration_ms(duration)


def _http_date_delta_ms(value: str, date_header: str | None) -> int | None:
    if date_header is None:
        return None
    try:
        target = email.utils.parsedate_to_datetime(value)
        now = email.utils.parsedate_to_datetime(date_header)
    except (TypeError, ValueError):
        return None
    return max(0, _ceil_ms((target - now).total_seconds() * 1000))


def _float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _ceil_ms(ms: float) -> int:
    """Round up (a hint is a "not before"), but 1.1 s is 1100 ms, not 1101 ms through float noise."""
    return math.ceil(ms - 1e-6)


def _excerpt(body: bytes) -> str:
    return _truncate(" ".join(body.decode("utf-8", "replace").split()), 300)


def _truncate(text: str, limit: int = _MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
