"""Failure classification: each LLM call outcome becomes a result, a layered failure or a setup problem.

The layer decides the retry policy, the failure topic and what backfill does (design §2), so classification
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
other 400 / 422, or a 5xx whose text is a
validation error of the request body (FastAPI)     business       invalid_request_error
other 4xx                                          business       http_<status>
=================================================  =============  ============================

Not a layer (:class:`ConfigurationProblem`: stop consuming and alert, never a failure record):
401 / ``invalid_api_key`` / ``authentication_error`` → ``invalid_api_key``; 403 / ``permission_error`` →
``permission_denied``; 404 → ``model_not_found`` (``not_found`` when the text does not name a model or
deployment: a wrong base URL fails every request alike); 429 or 402 about quota, billing or credit
(``insufficient_quota``, ``credit_balance_exhausted``, ``*_spend_limit_exceeded``, Anthropic
``billing_error`` / ``enforced_spend_limit_reached``) → ``insufficient_quota``; 3xx → ``unexpected_redirect``.

Where each row is decided: error responses here (:func:`classify_http_error`, pure); exceptions in
:mod:`streamproc.llm.transport_errors` (they are httpx's); 200 bodies in :mod:`streamproc.llm.completion`
(JSON Schema checks need jsonschema). Codes emitted outside these: ``conflicting_duplicate``
(:mod:`streamproc.core.request_state`), ``request_too_large`` and ``response_too_large`` for what no Kafka
record carries (:mod:`streamproc.core.record_size`) and for an answer past the client's read cap
(:mod:`streamproc.llm.client`), and the worker's own business codes for records rejected before any call
(undecodable records, malformed bodies, ``invalid_model_name`` (:mod:`streamproc.core.model_names`),
inputs over the model's window, ``unsupported_url`` for a url outside
the endpoint table, :mod:`streamproc.core.endpoints`).

A 200 whose body is an error envelope (``{"error": {...}}`` without ``choices``, as some gateways send) is
classified like an error response with the status found in the body (502 when there is none).

Retry hints (:func:`streamproc.core.retry_hints.retry_after_ms`): the first one present wins, most explicit
first: ``retry-after-ms``,
``retry-after`` (seconds, or an HTTP date relative to the response's ``Date`` header; without ``Date`` a
date is ignored, to stay clock-free), "try again in 1.5s" / "retry after 20 seconds" in the message, and
last ``x-ratelimit-reset-requests`` / ``-tokens`` (Go durations like ``6m0s``), counted only when the
matching ``x-ratelimit-remaining-*`` is ``0``: OpenAI sends reset headers on every response, and on a 500
the time until the token bucket is full again is no reason to wait. Hints are rounded up to whole ms.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from streamproc.core.outcome import ConfigurationProblem, Failure, truncate
from streamproc.core.retry_hints import retry_after_ms
from streamproc.core.vocabulary import FailureLayer

# (layer, code); layer None means a ConfigurationProblem.
_Verdict = tuple[FailureLayer | None, str]

RATE_LIMITED: Final = "rate_limit_exceeded"  # the code of every 429 not about quota; the limiter paces for it

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
# A FastAPI/pydantic validation error pointing into the request body ("'loc': ('body', ...)"): some servers
# (llama-cpp-python) answer it with a 500, but the same body fails the same way every time.
_BODY_VALIDATION_TEXT: Final = re.compile(r"""['"]loc['"]:\s*[\[(]\s*['"]body['"]""")
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
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser follows
        doc = None
    info = _error_info(doc) if isinstance(doc, dict) else _ErrorInfo((), excerpt(body), None)
    return _build(status, info, headers, status)

def classify_embedded_error(doc: dict[str, Any]) -> Failure | ConfigurationProblem:
    """A 200 whose body is an error envelope (some gateways): classified with the status found in the body."""
    info = _error_info(doc)
    embedded = info.status if info.status is not None and 400 <= info.status < 600 else 502
    return _build(embedded, info, {}, 200, prefix="200 body carries an error, taken as ")


def _build(
    status: int, info: _ErrorInfo, headers: Mapping[str, str], reported_status: int, prefix: str = ""
) -> Failure | ConfigurationProblem:
    layer, code = _verdict(status, info)
    detail = " ".join(part for part in (f"HTTP {status}", info.ids[0] if info.ids else "") if part)
    message = truncate(f"{prefix}{detail}: {info.text}" if info.text else f"{prefix}{detail}")
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
    if _BODY_VALIDATION_TEXT.search(text):
        return _B, "invalid_request_error"
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
        text = detail if isinstance(detail, str) else truncate(json.dumps(doc), 300)
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
        try:
            return int(code)
        except ValueError:  # a digit int() does not read ("\u00b2"), or more digits than it converts
            return None
    return None

def excerpt(body: bytes) -> str:
    """A short one-line excerpt of a body, for messages."""
    return truncate(" ".join(body.decode("utf-8", "replace").split()), 300)
